"""ModelArtifact identities and the ModelCatalog."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jgpt.artifacts.artifact import checkpoint_sha256, load_artifact, save_artifact
from jgpt.artifacts.catalog import DEFAULT_CATALOG, load_model, read_catalog, resolve_model
from jgpt.cli.main import main as jgpt
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import sha256_json
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.weights import initialize, parameter_count
from jgpt.tokenizers.tokenizer import Tokenizer
from jgpt.tokenizers.tokenizer_file import load_tokenizer

GPT = ModelArchitecture(vocabulary=260, width=32, ffn=64, context=16, layers=2, heads=4)
LLAMA = LlamaArchitecture(vocabulary=260, width=32, ffn=48, context=16, layers=2, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    weights, provenance = initialize(GPT, seed=3)
    path = tmp_path_factory.mktemp("artifacts") / "tiny"
    save_artifact(path, GPT, weights, provenance, Tokenizer.bytes_only())
    return path


@pytest.fixture
def copy(saved, tmp_path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "copy"))


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def rewrite_manifest(path: Path, **changes) -> None:
    """Edit the manifest and re-seal it, as a careless tool would: only deeper identities can catch it."""
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.pop("manifest_sha256")
    manifest.update(changes)
    manifest["manifest_sha256"] = sha256_json(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("architecture", [GPT, LLAMA], ids=["gpt", "llama"])
def test_round_trip_keeps_every_identity_and_value(architecture, tmp_path):
    weights, provenance = initialize(architecture, seed=11)
    tokenizer = Tokenizer.bytes_only()
    saved = save_artifact(tmp_path / "a", architecture, weights, provenance, tokenizer)
    loaded = load_artifact(tmp_path / "a")
    assert loaded.architecture == architecture
    assert loaded.provenance == provenance.to_json()
    assert loaded.checkpoint_sha256 == saved.checkpoint_sha256 == checkpoint_sha256(weights)
    assert loaded.tokenizer_sha256 == tokenizer.tokenizer_sha256
    assert loaded.manifest_sha256 == saved.manifest_sha256
    assert load_tokenizer(loaded.tokenizer_path).tokenizer_sha256 == tokenizer.tokenizer_sha256
    for a, b in zip(jax.tree.leaves(weights), jax.tree.leaves(loaded.weights)):
        np.testing.assert_array_equal(a, b)
    # A second save of the same weights is a different container with the same canonical identity.
    again = save_artifact(tmp_path / "b", architecture, loaded.weights, loaded.provenance, loaded.tokenizer_path)
    assert (again.checkpoint_sha256, again.tokenizer_sha256) == (saved.checkpoint_sha256, saved.tokenizer_sha256)
    # Small enough to commit: the orbax container adds little to the raw float32 bytes.
    total = sum(f.stat().st_size for f in (tmp_path / "a").rglob("*") if f.is_file())
    assert total < 4 * parameter_count(architecture) + 64_000


def test_checkpoint_identity_is_canonical_over_names_dtypes_shapes_and_values():
    weights, _ = initialize(GPT, seed=3)
    identity = checkpoint_sha256(weights)
    as_numpy = weights.replace(**{name: np.asarray(t) for name, t in weights.as_dict().items()})
    assert checkpoint_sha256(as_numpy) == identity  # the container of the arrays does not matter
    nudged = weights.replace(lm_bias=weights.lm_bias.at[5].add(1e-7))
    swapped = weights.replace(query=weights.key, key=weights.query)  # same shapes, other names
    assert len({identity, checkpoint_sha256(nudged), checkpoint_sha256(swapped)}) == 3


def test_flipping_one_byte_of_a_weight_file_is_refused_naming_checkpoint_sha256(copy):
    weight_files = sorted((f for f in (copy / "weights").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    largest = weight_files[-1]
    flip_one_byte(largest)
    with pytest.raises(ApiError) as error:
        load_artifact(copy)
    assert error.value.field == "checkpoint_sha256"
    assert largest.relative_to(copy).as_posix() in error.value.reason


def test_a_resealed_manifest_with_a_wrong_checkpoint_identity_is_refused(copy):
    rewrite_manifest(copy, checkpoint_sha256="0" * 64)
    with pytest.raises(ApiError) as error:
        load_artifact(copy)
    assert error.value.field == "checkpoint_sha256"


def test_a_missing_weight_file_is_refused(copy):
    next(f for f in (copy / "weights").rglob("*") if f.is_file()).unlink()
    with pytest.raises(ApiError) as error:
        load_artifact(copy)
    assert error.value.field == "checkpoint_sha256"


def test_a_changed_tokenizer_is_refused_naming_tokenizer_sha256(copy):
    flip_one_byte(copy / "tokenizer.json")
    with pytest.raises(ApiError) as error:
        load_artifact(copy)
    assert error.value.field == "tokenizer_sha256"


def test_an_edited_manifest_is_refused_naming_manifest_sha256(copy):
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["architecture"]["epsilon"] = 1e-6
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ApiError) as error:
        load_artifact(copy)
    assert error.value.field == "manifest_sha256"


def test_save_refuses_an_existing_path_and_leaves_nothing_half_written(saved, tmp_path):
    weights, provenance = initialize(GPT, seed=3)
    with pytest.raises(ApiError) as error:
        save_artifact(saved, GPT, weights, provenance)
    assert error.value.field == "out"
    with pytest.raises(ApiError) as error:  # weights of another architecture
        save_artifact(tmp_path / "x", LLAMA, weights, provenance)
    with pytest.raises(FileNotFoundError):  # fails after staging began
        save_artifact(tmp_path / "y", GPT, weights, provenance, tmp_path / "no-tokenizer.json")
    assert list(tmp_path.iterdir()) == []


# --- catalog ------------------------------------------------------------------------------------------


def write_catalog_file(path: Path, base_url: str = ".", models=()) -> Path:
    path.write_text(json.dumps({"storage": {"base_url": base_url}, "models": list(models)}))
    return path


def test_catalog_add_lists_resolves_and_loads_by_id(saved, tmp_path, capsys):
    shutil.copytree(saved, tmp_path / "models" / "tiny")
    catalog = write_catalog_file(tmp_path / "catalog.json", base_url="models")
    args = [
        "catalog",
        "--catalog",
        str(catalog),
        "add",
        str(tmp_path / "models" / "tiny"),
        "--id",
        "tiny",
        "--label",
        "tiny GPT",
        "--role",
        "default",
        "--stop-ids",
        "259",
    ]
    assert jgpt(args) == 0
    assert jgpt(["catalog", "--catalog", str(catalog)]) == 0
    listing = capsys.readouterr().out
    assert "tiny GPT" in listing and "default" in listing
    model = read_catalog(catalog).default
    artifact = load_artifact(saved)
    assert model.id == "tiny" and model.stop_ids == (259,) and model.parameters == parameter_count(GPT)
    assert model.weights["sha256"] == artifact.checkpoint_sha256
    assert model.tokenizer["sha256"] == artifact.tokenizer_sha256
    assert resolve_model("tiny", catalog) == (tmp_path / "models" / "tiny").resolve()
    assert load_model("tiny", catalog).checkpoint_sha256 == artifact.checkpoint_sha256
    # A second default demotes the first.
    assert (
        jgpt(
            [
                "catalog",
                "--catalog",
                str(catalog),
                "add",
                str(tmp_path / "models" / "tiny"),
                "--id",
                "again",
                "--label",
                "same",
                "--role",
                "default",
            ]
        )
        == 0
    )
    assert [m.role for m in read_catalog(catalog).models] == [None, "default"]


def test_catalog_refuses_an_artifact_that_is_not_the_one_it_names(saved, tmp_path):
    shutil.copytree(saved, tmp_path / "tiny")
    catalog = write_catalog_file(tmp_path / "catalog.json")
    assert jgpt(["catalog", "--catalog", str(catalog), "add", str(tmp_path / "tiny"), "--id", "t", "--label", "t"]) == 0
    document = json.loads(catalog.read_text())
    document["models"][0]["weights"]["sha256"] = "f" * 64
    catalog.write_text(json.dumps(document))
    with pytest.raises(ApiError) as error:
        load_model("t", catalog)
    assert error.value.field == "checkpoint_sha256"
    with pytest.raises(ApiError) as error:
        resolve_model("unknown", catalog)
    assert error.value.field == "model_id"


def test_http_storage_downloads_nothing_and_uses_only_the_local_cache(saved, tmp_path, monkeypatch):
    artifact = load_artifact(saved)
    descriptor = {
        "id": "t",
        "label": "t",
        "role": None,
        "parameters": artifact.parameters,
        "architecture": GPT.to_json(),
        "tokenizer": None,
        "weights": {"path": "tiny", "sha256": artifact.checkpoint_sha256, "bytes": 1},
    }
    remote = write_catalog_file(tmp_path / "remote.json", "https://models.example/jgpt/", [descriptor])
    monkeypatch.setenv("JGPT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ApiError) as error:
        resolve_model("t", remote)
    assert error.value.field == "base_url" and "downloads nothing" in error.value.reason
    cached = tmp_path / "cache" / "models" / artifact.checkpoint_sha256
    shutil.copytree(saved, cached)
    assert resolve_model("t", remote) == cached


def test_catalog_rejects_duplicate_ids_two_defaults_and_malformed_entries(tmp_path):
    entry = {
        "id": "a",
        "label": "a",
        "role": "default",
        "parameters": 1,
        "architecture": {},
        "tokenizer": None,
        "weights": {"path": "a", "sha256": "0" * 64, "bytes": 1},
    }
    for models, field in [
        ([entry, entry], "models.id"),
        ([entry, {**entry, "id": "b"}], "models.role"),
        ([{**entry, "weights": "a"}], "models[0].weights"),
        ([{"id": "a"}], "models[0].label"),
    ]:
        with pytest.raises(ApiError) as error:
            read_catalog(write_catalog_file(tmp_path / "c.json", models=models))
        assert error.value.field == field


def test_the_repository_catalog_is_valid_and_every_model_loads_with_its_identities():
    catalog = read_catalog(DEFAULT_CATALOG)
    for model in catalog.models:
        artifact = load_model(model.id)
        assert artifact.parameters == model.parameters
    assert jgpt(["catalog"]) == 0


def test_catalog_and_architecture_import_without_jax():
    code = (
        "import sys, jgpt.artifacts.catalog, jgpt.model.architecture, jgpt.cli.catalog, jgpt.cli.import_hf; "
        "sys.exit('jax' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
