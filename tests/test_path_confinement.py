"""Every path read from a file stays inside its directory: manifests, safetensors indexes,
lab records and the catalog's cache path (issue 13, path confinement).

The refusal must name the field and read the same whether or not the target exists, so
a crafted file can neither read nor probe anything outside the directory it belongs to.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.artifacts.artifact import load_artifact, save_artifact
from jgpt.artifacts.catalog import read_catalog, resolve_model
from jgpt.artifacts.hf_import import convert
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import sha256_json
from jgpt.foundation.paths import confined
from jgpt.model.architecture import ModelArchitecture
from jgpt.model.weights import initialize
from jgpt.tokenizers.tokenizer import Tokenizer
from tests.hostile import FUZZ, assert_refused

ESCAPES = ["../outside.json", "/etc/passwd", "a/../../outside.json", "..", "a\\..\\b", "a\x00b", ""]


def test_path_confinement_refuses_absolute_and_climbing_paths_whether_or_not_the_target_exists(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (tmp_path / "outside.json").write_text("{}")
    for relative in ESCAPES:
        with pytest.raises(ApiError) as error:
            confined(base, relative, "assets[0].path")
        assert error.value.field == "assets[0].path"
    existing = pytest.raises(ApiError, confined, base, "../outside.json", "f").value.reason
    missing = pytest.raises(ApiError, confined, base, "../missing.json", "f").value.reason
    assert existing.replace("outside", "X") == missing.replace("missing", "X")  # nothing tells them apart
    assert confined(base, "weights/a.bin", "f") == (base / "weights" / "a.bin").resolve()


def test_path_confinement_follows_symlinks_and_refuses_those_leading_out(tmp_path):
    base = tmp_path / "base"
    (base / "inside").mkdir(parents=True)
    (base / "out-dir").symlink_to(tmp_path)
    (base / "dangling").symlink_to(tmp_path / "no-such-file")
    (base / "in-link").symlink_to(base / "inside")
    for relative in ("out-dir/secret", "dangling"):
        with pytest.raises(ApiError, match="symbolic link"):
            confined(base, relative, "f")
    assert confined(base, "in-link/x", "f") == (base / "inside" / "x").resolve()


def test_path_confinement_refuses_a_fifo_or_device_inside_the_directory(tmp_path):
    """A FIFO named as a tokenizer file would block its reader for ever; a link to /dev/zero never ends."""
    base = tmp_path / "base"
    base.mkdir()
    os.mkfifo(base / "tokenizer.json")
    (base / "zeros").symlink_to("/dev/zero")
    (base / "dev").symlink_to("/dev")
    with pytest.raises(ApiError, match=r"^assets\[0\].path: 'tokenizer.json' is neither a file nor a directory"):
        confined(base, "tokenizer.json", "assets[0].path")
    with pytest.raises(ApiError, match="symbolic link"):  # outside first: /dev/zero is not in base
        confined(base, "zeros", "f")
    (base / "weights").mkdir()
    assert confined(base, "weights", "f").is_dir()


@pytest.mark.parametrize("relative", ["a" * 300, "a/" * 2100 + "a"])
def test_path_confinement_refuses_a_name_the_file_system_cannot_look_up_naming_the_field(tmp_path, relative):
    """A crafted manifest's 300-character asset name raised OSError (ENAMETOOLONG) out of `load_artifact`."""
    with pytest.raises(ApiError, match=r"^assets\[0\].path: '.*' cannot be looked up: File name too long"):
        confined(tmp_path, relative, "assets[0].path")


@FUZZ
@given(
    relative=st.lists(st.sampled_from(["a", "/", ".", "..", "\\", "b/", "link/", "sub/", "\x00"]), max_size=8).map(
        "".join
    )
)
def test_path_confinement_any_accepted_path_resolves_inside(tmp_path_factory, relative):
    base = tmp_path_factory.getbasetemp() / "confinement-base"
    (base / "sub").mkdir(parents=True, exist_ok=True)
    if not (base / "link").is_symlink():
        (base / "link").symlink_to(base.parent)
    try:
        target = confined(base, relative, "f")
    except ApiError as error:
        assert error.field == "f"
    else:
        assert target.is_relative_to(base.resolve())


# --- manifests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    architecture = ModelArchitecture(vocabulary=260, width=16, ffn=32, context=8, layers=1, heads=2)
    weights, provenance = initialize(architecture, seed=0)
    return save_artifact(
        tmp_path_factory.mktemp("artifact") / "tiny", architecture, weights, provenance, Tokenizer.bytes_only()
    ).path


def reseal(directory: Path, change) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest.pop("manifest_sha256")
    change(manifest)
    manifest["manifest_sha256"] = sha256_json(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("escape", ["../outside.bin", "/etc/hostname", "weights/../../outside.bin"])
def test_path_confinement_manifest_assets(artifact, tmp_path, escape):
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    (tmp_path / "outside.bin").write_bytes(b"secret")
    reseal(copy, lambda m: m["assets"].append({"path": escape, "sha256": "0" * 64, "bytes": 6}))
    with pytest.raises(ApiError) as error:
        load_artifact(copy)
    n = len(json.loads((artifact / "manifest.json").read_text())["assets"])
    assert error.value.field == f"assets[{n}].path"
    assert "secret" not in str(error.value)


def test_path_confinement_manifest_symlinked_weights_and_tokenizer(artifact, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(artifact, elsewhere)
    for name, field in (("weights", "checkpoint_sha256"), ("tokenizer.json", "tokenizer_sha256")):
        copy = tmp_path / f"copy-{field}"
        shutil.copytree(artifact, copy)
        target = copy / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        target.symlink_to(elsewhere / name)  # the same bytes, but outside the artifact
        with pytest.raises(ApiError) as error:
            load_artifact(copy)
        assert error.value.field.startswith("assets[") or error.value.field == field
        assert "symbolic link" in error.value.reason


# --- Hugging Face shard index -------------------------------------------------------------------


def tiny_gpt2(directory: Path) -> Path:
    """A GPT-2 directory as save_pretrained writes it, made with numpy alone."""
    from safetensors.numpy import save_file

    V, C, T, F = 8, 4, 4, 16
    config = {"model_type": "gpt2", "vocab_size": V, "n_embd": C, "n_positions": T, "n_layer": 1, "n_head": 2}
    rng = np.random.default_rng(0)
    shapes = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    shapes |= {
        f"h.0.{name}": shape
        for name, shape in {
            "ln_1.weight": (C,),
            "ln_1.bias": (C,),
            "attn.c_attn.weight": (C, 3 * C),
            "attn.c_attn.bias": (3 * C,),
            "attn.c_proj.weight": (C, C),
            "attn.c_proj.bias": (C,),
            "ln_2.weight": (C,),
            "ln_2.bias": (C,),
            "mlp.c_fc.weight": (C, F),
            "mlp.c_fc.bias": (F,),
            "mlp.c_proj.weight": (F, C),
            "mlp.c_proj.bias": (C,),
        }.items()
    }
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {f"transformer.{k}": rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()},
        str(directory / "model.safetensors"),
    )
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def shard_index(directory: Path, shard: str) -> None:
    (directory / "model.safetensors").rename(directory / "model-00001.safetensors")
    names = ["transformer.wte.weight"]
    index = {"weight_map": {names[0]: "model-00001.safetensors", "transformer.wpe.weight": shard}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("shard", ["../elsewhere/model.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_path_confinement_safetensors_index_shards(tmp_path, shard):
    model = tiny_gpt2(tmp_path / "model")
    elsewhere = tiny_gpt2(tmp_path / "elsewhere")
    assert (elsewhere / "model.safetensors").is_file()
    shard_index(model, shard)
    with pytest.raises(ApiError) as error:
        convert(model)
    assert error.value.field == "model.safetensors.index.json" and "inside its directory" in error.value.reason
    assert_refused(
        ["import-hf", model, "--out", tmp_path / "out"],
        inputs=[model / "model.safetensors.index.json"],
        watch=[tmp_path],
        field="model.safetensors.index.json",
    )


# --- lab records ------------------------------------------------------------------------------------


def test_path_confinement_lab_record_file_entries(tmp_path):
    """A record naming ../ or an absolute path is refused before the file is read, naming the entry."""
    from experiments.experiment_replay import replay
    from experiments.record_files import dumps

    lab = json.loads(Path("experiments/labs/admission-slots-latency.json").read_text())
    (tmp_path / "outside.json").write_text("{}")
    for escape in ("../outside.json", str(tmp_path / "outside.json"), "a/../../outside.json"):
        entry = {"path": escape, "sha256": "0" * 64, "bytes": 2}
        record = {
            "format": "jgpt-experiment-execution",
            "version": 1,
            "lab": lab,
            "recordings": [{"computations": entry, "observations": entry}],
            "arms": [{}],
        }
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / "record.json").write_bytes(dumps(record))
        with pytest.raises(ApiError) as error:
            replay(tmp_path / "run" / "record.json")
        assert error.value.field == "record.recordings[0].computations.path"
        assert_refused(
            ["lab", "replay", tmp_path / "run" / "record.json"],
            inputs=[tmp_path / "run" / "record.json"],
            watch=[tmp_path],
            field="record.recordings[0].computations.path",
        )
        assert_refused(
            ["report", tmp_path / "run" / "record.json", "--out", tmp_path / "page.html"],
            watch=[tmp_path],
            field="record.recordings[0].computations.path",
        )


# --- kvsim input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("escape", ["../outside.json", "/etc/passwd", "a/../../outside.json"])
def test_path_confinement_kvsim_input_computations(tmp_path, escape):
    """`jgpt kvsim run` reads a computations path inside the input's directory only, naming the field."""
    (tmp_path / "outside.json").write_text("{}")
    (tmp_path / "run").mkdir()
    source = tmp_path / "run" / "input.json"
    source.write_text(json.dumps({"system": {}, "computations": escape}))
    assert_refused(
        ["kvsim", "run", source, "--out", tmp_path / "record.json"],
        inputs=[source],
        watch=[tmp_path],
        field="computations: ",
    )


# --- catalog -----------------------------------------------------------------------------------------


def catalog_file(path: Path, base_url: str, weights: dict) -> Path:
    entry = {
        "id": "m",
        "label": "m",
        "role": None,
        "parameters": 1,
        "architecture": {},
        "tokenizer": None,
        "weights": weights,
    }
    path.write_text(json.dumps({"storage": {"base_url": base_url}, "models": [entry]}))
    return path


@pytest.mark.parametrize("sha256", ["../" * 4 + "etc", "/etc", "A" * 64, "0" * 63, "../" + "0" * 61])
def test_path_confinement_catalog_cache_path(tmp_path, monkeypatch, sha256):
    monkeypatch.setenv("JGPT_CACHE", str(tmp_path / "cache"))
    catalog = catalog_file(
        tmp_path / "catalog.json", "https://models.example/", {"path": "m", "sha256": sha256, "bytes": 1}
    )
    with pytest.raises(ApiError) as error:
        read_catalog(catalog)
    assert error.value.field == "models[0].weights.sha256"
    assert_refused(
        ["catalog", "--catalog", catalog], inputs=[catalog], watch=[tmp_path], field="models[0].weights.sha256"
    )


def test_path_confinement_catalog_local_storage(tmp_path, artifact):
    shutil.copytree(artifact, tmp_path / "elsewhere")
    (tmp_path / "store").mkdir()
    for base_url, path, field in [
        (".", "../elsewhere", "m.weights.path"),
        ("store", "/tmp", "m.weights.path"),
        ("..", "elsewhere", "storage.base_url"),
    ]:
        catalog = catalog_file(
            tmp_path / "store" / "catalog.json", base_url, {"path": path, "sha256": "0" * 64, "bytes": 1}
        )
        with pytest.raises(ApiError) as error:
            resolve_model("m", catalog)
        assert error.value.field == field
    os.symlink(tmp_path / "elsewhere", tmp_path / "store" / "link")
    catalog = catalog_file(tmp_path / "store" / "catalog.json", ".", {"path": "link", "sha256": "0" * 64, "bytes": 1})
    with pytest.raises(ApiError, match="symbolic link"):
        resolve_model("m", catalog)


def test_path_confinement_manifest_unlisted_files_and_linked_directories_under_weights(artifact, tmp_path):
    (tmp_path / "outside").mkdir()
    for name, make in (
        ("extra", lambda p: p.write_bytes(b"x")),
        ("linked", lambda p: p.symlink_to(tmp_path / "outside")),
    ):
        copy = tmp_path / f"copy-{name}"
        shutil.copytree(artifact, copy)
        make(copy / "weights" / name)
        with pytest.raises(ApiError) as error:
            load_artifact(copy)
        assert error.value.field == "checkpoint_sha256" and f"weights/{name}" in error.value.reason
