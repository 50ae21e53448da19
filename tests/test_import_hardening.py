"""import-hf, manifests, catalogs and tokenizer files under hostile input (issue 13).

Each entry point gets FUZZ examples (200 in CI; JGPT_FUZZ_EXAMPLES for a nightly run) of
hostile JSON, and must refuse naming the exact field, leave its inputs untouched and
leave nothing behind; targeted cases pin the classes the review found.
"""

from __future__ import annotations

import json
import math
import shutil
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.artifacts.artifact import load_artifact
from jgpt.artifacts.catalog import read_catalog
from jgpt.artifacts.hf_import import DIMENSION_LIMIT, convert
from jgpt.foundation.errors import ApiError
from jgpt.tokenizers.tokenizer import Tokenizer
from jgpt.tokenizers.tokenizer_file import load_tokenizer
from tests.hostile import FUZZ, assert_refused, mutated_json, run_jgpt
from tests.test_path_confinement import artifact, tiny_gpt2  # noqa: F401  (artifact is a fixture)

SIZES = ("vocab_size", "n_embd", "n_positions", "n_layer", "n_head")
NOT_A_SIZE = st.one_of(
    st.text(max_size=5),
    st.booleans(),
    st.integers(max_value=0),
    st.integers(min_value=DIMENSION_LIMIT + 1),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not float(x).is_integer()),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"]).map(lambda lexeme: ("raw", lexeme)),
)


def _config_text(config: dict, key: str, value) -> str:
    if isinstance(value, tuple):  # a raw lexeme that json.dumps cannot write
        return json.dumps({**config, key: "\u0000"}).replace('"\\u0000"', value[1])
    return json.dumps({**config, key: value})


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return tiny_gpt2(tmp_path_factory.mktemp("hf") / "model")


@FUZZ
@given(key=st.sampled_from(SIZES + ("layer_norm_epsilon",)), value=NOT_A_SIZE)
def test_import_hf_refuses_a_config_size_that_is_not_a_size_naming_it(hf, tmp_path_factory, key, value):
    if key == "layer_norm_epsilon" and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        value = -1.0  # a positive number is a valid epsilon
    root = tmp_path_factory.mktemp("config")
    model = root / "model"
    shutil.copytree(hf, model)
    config = json.loads((hf / "config.json").read_text())
    (model / "config.json").write_text(_config_text(config, key, value))
    assert_refused(
        ["import-hf", model, "--out", root / "out"],
        inputs=[model / "config.json"],
        watch=[root],
        field=f"config.json:{key}",
    )


@FUZZ
@given(
    document=mutated_json(
        {
            "model_type": "gpt2",
            "vocab_size": 8,
            "n_embd": 4,
            "n_positions": 4,
            "n_layer": 1,
            "n_head": 2,
            "activation_function": "gelu_new",
            "rope_scaling": None,
        }
    )
)
def test_import_hf_any_hostile_config_is_refused_cleanly_or_imports(hf, tmp_path_factory, document):
    root = tmp_path_factory.mktemp("mutated")
    model = root / "model"
    shutil.copytree(hf, model)
    (model / "config.json").write_bytes(document)
    code, _, err = run_jgpt(["import-hf", model, "--out", root / "out"])
    if code == 0:
        assert load_artifact(root / "out").architecture.vocabulary == 8
    else:
        line = assert_refused(["import-hf", model, "--out", root / "out"], inputs=[model / "config.json"], watch=[root])
        assert "config.json" in line or "safetensors: " in line, line


def test_import_hf_checks_shapes_before_allocating_anything_vocabulary_sized(hf, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(hf, model)
    config = json.loads((hf / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": DIMENSION_LIMIT}))
    tracemalloc.start()
    with pytest.raises(ApiError) as error:
        convert(model)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert error.value.field == "safetensors" and "wte.weight" in error.value.reason
    assert peak < 4 * DIMENSION_LIMIT  # less than one float32 vector of the claimed vocabulary
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": 10**11}))
    assert_refused(["import-hf", model, "--out", tmp_path / "out"], watch=[tmp_path], field="config.json:vocab_size")


def test_import_hf_overwrite_replaces_only_an_artifact_and_never_the_source(hf, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(hf, model)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert_refused(
        ["import-hf", model, "--out", mine, "--overwrite"], inputs=[mine / "notes.txt"], watch=[tmp_path], field="out"
    )
    assert_refused(
        ["import-hf", model, "--out", model, "--overwrite"],
        inputs=[model / "config.json"],
        watch=[tmp_path],
        field="out",
    )
    assert_refused(
        ["import-hf", model, "--out", tmp_path, "--overwrite"],
        inputs=[model / "config.json"],
        watch=[tmp_path],
        field="out",
    )
    assert_refused(
        ["import-hf", model, "--out", model / "config.json", "--overwrite"],
        inputs=[model / "config.json"],
        watch=[tmp_path],
        field="out",
    )
    assert run_jgpt(["import-hf", model, "--out", tmp_path / "artifact"])[0] == 0
    (tmp_path / "artifact" / "notes.txt").write_text("not the artifact's")
    assert_refused(["import-hf", model, "--out", tmp_path / "artifact", "--overwrite"], watch=[tmp_path], field="out")
    (tmp_path / "artifact" / "notes.txt").unlink()
    before = load_artifact(tmp_path / "artifact").checkpoint_sha256
    assert run_jgpt(["import-hf", model, "--out", tmp_path / "artifact", "--overwrite"])[0] == 0
    assert load_artifact(tmp_path / "artifact").checkpoint_sha256 == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact", "mine", "model"]  # no staging left


BYTES_ONLY = json.loads(Tokenizer.bytes_only().document)
WITH_MERGES = json.loads(Tokenizer.train(["abababab cdcdcd abab"] * 4, 264).document)


@pytest.mark.parametrize(
    "document",
    [
        b"garbage",
        json.dumps({"model": {"type": "WordPiece"}}).encode(),
        json.dumps({**WITH_MERGES, "normalizer": "NFC"}).encode(),
        json.dumps({**WITH_MERGES, "model": {**WITH_MERGES["model"], "merges": [[1, 2]]}}).encode(),
        # a Hugging Face tokenizer.json with no tokenizer_config.json naming its EOS
        json.dumps({**WITH_MERGES, "added_tokens": []}).encode(),
    ],
)
def test_import_hf_refuses_a_foreign_or_garbage_tokenizer_at_import(hf, tmp_path, document):
    model = tmp_path / "model"
    shutil.copytree(hf, model)
    (model / "tokenizer.json").write_bytes(document)
    assert_refused(
        ["import-hf", model, "--out", tmp_path / "out"],
        inputs=[model / "tokenizer.json"],
        watch=[tmp_path],
        field="tokenizer.json",
    )


@FUZZ
@given(document=mutated_json(WITH_MERGES))
def test_tokenizer_files_any_hostile_one_loads_or_is_refused_naming_tokenizer(tmp_path_factory, document):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    path.write_bytes(document)
    try:
        tokenizer = load_tokenizer(path)
    except ApiError as error:
        assert error.field == "tokenizer"
    else:  # accepted: it must work as a tokenizer
        assert tokenizer.decode(tokenizer.encode_text("abab cd")).text == "abab cd"


@pytest.mark.parametrize("value", [float("nan"), "x"])
def test_manifest_a_resealed_field_outside_the_format_is_refused(artifact, tmp_path, value):  # noqa: F811
    """Found by the fuzz test below: a resealed `"": NaN` was refused naming the field `""`."""
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.pop("manifest_sha256")
    manifest[""] = value
    manifest["manifest_sha256"] = hashlib_of(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ApiError) as error:
        load_artifact(copy)
    assert error.value.field == "format" and "['']" in error.value.reason


@FUZZ
@given(data=st.data())
def test_manifest_any_hostile_resealed_manifest_is_refused_naming_a_manifest_field(artifact, tmp_path_factory, data):  # noqa: F811
    copy = tmp_path_factory.mktemp("manifest") / "copy"
    shutil.copytree(artifact, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.pop("manifest_sha256")
    hostile = data.draw(mutated_json(manifest))
    try:
        changed = json.loads(hostile)
        seal = hashlib_of(changed)
    except (ValueError, RecursionError, TypeError):
        (copy / "manifest.json").write_bytes(hostile)
    else:
        if isinstance(changed, dict):
            changed["manifest_sha256"] = seal
        (copy / "manifest.json").write_text(json.dumps(changed))
    fields = set(manifest) | {"path", "manifest_sha256"}
    try:
        loaded = load_artifact(copy)
    except ApiError as error:
        assert error.field.split(".")[0].split("[")[0] in fields | {"architecture"}, error
    else:
        assert loaded.checkpoint_sha256 == manifest["checkpoint_sha256"]


def hashlib_of(document) -> str:
    """The seal a forger would write: canonical JSON, NaN allowed (as a hostile writer might)."""
    import hashlib

    return hashlib.sha256(
        json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()
    ).hexdigest()


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda m: m.pop("assets"), "assets"),
        (lambda m: m["architecture"].update(epsilon=math.nan), "architecture.epsilon"),
        (lambda m: m["architecture"].update(heads="4"), "architecture.heads"),
        (lambda m: m.update(parameters=math.inf), "parameters"),
        (lambda m: m["assets"].append("weights"), "assets[%d]"),
        (lambda m: m.update(tokenizer_sha256=5), "tokenizer_sha256"),
    ],
)
def test_manifest_refuses_resealed_manifests_naming_the_field(artifact, tmp_path, change, field):  # noqa: F811
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    assets = len(json.loads((artifact / "manifest.json").read_text())["assets"])
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.pop("manifest_sha256")
    change(manifest)
    manifest["manifest_sha256"] = hashlib_of(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ApiError) as error:
        load_artifact(copy)
    assert error.value.field == (field % assets if "%d" in field else field)


ENTRY = {
    "id": "m",
    "label": "m",
    "role": "default",
    "parameters": 10,
    "architecture": {"vocabulary": 260},
    "tokenizer": None,
    "weights": {"path": "m", "sha256": "0" * 64, "bytes": 1},
    "stop_ids": [259],
}
CATALOG = {"storage": {"base_url": "."}, "models": [ENTRY]}


SENTINEL = "\u0000"  # replaced by a raw lexeme json.dumps cannot write (NaN, Infinity)


@pytest.mark.parametrize(
    "key, value, lexeme, field",
    [
        ("parameters", "5", None, "models[0].parameters"),
        ("parameters", SENTINEL, "NaN", "models[0].parameters"),
        ("role", "admin", None, "models[0].role"),
        ("id", "", None, "models[0].id"),
        ("stop_ids", [-5], None, "models[0].stop_ids[0]"),
        ("architecture", {"epsilon": SENTINEL}, "Infinity", "models[0].architecture.epsilon"),
    ],
)
def test_catalog_refuses_entries_naming_the_field(tmp_path, key, value, lexeme, field):
    text = json.dumps({**CATALOG, "models": [{**ENTRY, key: value}]})
    path = tmp_path / "catalog.json"
    path.write_text(text.replace('"\\u0000"', lexeme) if lexeme else text)
    with pytest.raises(ApiError) as error:
        read_catalog(path)
    assert error.value.field == field
    assert_refused(["catalog", "--catalog", path], inputs=[path], watch=[tmp_path], field=field)


@FUZZ
@given(document=mutated_json(CATALOG))
def test_catalog_any_hostile_catalog_is_listed_or_refused_naming_a_catalog_field(tmp_path_factory, document):
    root = tmp_path_factory.mktemp("catalog")
    path = root / "catalog.json"
    path.write_bytes(document)
    code, _, err = run_jgpt(["catalog", "--catalog", path])
    if code != 0:
        line = assert_refused(["catalog", "--catalog", path], inputs=[path], watch=[root])
        assert any(f"error: {name}" in line for name in ("catalog", "models", "storage.base_url")), line


def test_import_hf_refuses_an_output_that_is_a_file_or_under_one_before_any_work(hf, tmp_path):
    (tmp_path / "a-file").write_text("mine")
    for out in (tmp_path / "a-file", tmp_path / "a-file" / "artifact"):
        assert_refused(["import-hf", hf, "--out", out], inputs=[tmp_path / "a-file"], watch=[tmp_path], field="out")


def test_import_hf_refuses_a_config_past_the_parameter_limit(hf, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(hf, model)
    config = json.loads((hf / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "n_layer": DIMENSION_LIMIT, "n_embd": 4096, "n_head": 32}))
    assert "more than jgpt's limit" in assert_refused(
        ["import-hf", model, "--out", tmp_path / "out"], watch=[tmp_path], field="config.json"
    )


@FUZZ
@given(
    tensor=st.sampled_from(["wte.weight", "wpe.weight", "ln_f.bias", "h.0.attn.c_attn.weight", "h.0.mlp.c_proj.bias"]),
    at=st.integers(0, 3),
    value=st.sampled_from([math.nan, math.inf, -math.inf, 1e39, -3.5e38]),
)
def test_import_hf_refuses_weights_that_are_not_finite_naming_the_tensor(hf, tmp_path_factory, tensor, at, value):
    """NaN, an infinity or a float64 past float32's range imported as an artifact whose every logit was NaN."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    model = tmp_path_factory.mktemp("weights") / "model"
    shutil.copytree(hf, model)
    tensors = {name: array.astype(np.float64) for name, array in load_file(model / "model.safetensors").items()}
    tensors[f"transformer.{tensor}"].flat[at] = value
    save_file(tensors, str(model / "model.safetensors"))
    out = model.parent / "artifact"
    line = assert_refused(
        ["import-hf", model, "--out", out], inputs=[model / "model.safetensors"], watch=[model.parent]
    )
    assert f": safetensors:{tensor}: holds a value that is not a finite float32 number" in line, line
