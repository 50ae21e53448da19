"""`jgpt export-hf`: artifacts out to transformers and back (jgpt/hf_export.py).

For each family, a jgpt artifact is exported; transformers' AutoModelForCausalLM loads the
directory and its float32 logits must equal jgpt's within 1e-5 (max abs over random ids at
every position up to the context), or, where float32 itself cannot promise that, within the
rounding of transformers' own float32 forward: the shipped chat model's logits reach 20, and
torch's float32 forward is 5e-5 from its float64 forward of the same files (its sdpa and eager
attention differ by as much). jgpt must then be no further than torch from that float64
forward. `jgpt import-hf` of the export must give back the same checkpoint_sha256 and
tokenizer_sha256. Every weight is perturbed first, so that biases and
norm scales are not the trivial zeros and ones of a fresh init.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jgpt.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.artifact import load_artifact, save_artifact
from jgpt.catalog import load_model
from jgpt.cli import main as jgpt
from jgpt.model import forward
from jgpt.tokenizer import CONTROL_MARKERS, ROLE_IDS, Tokenizer
from jgpt.weights import ModelWeights, initialize
from tests.hf_models import save_model
from tests.hostile import run_jgpt

TOLERANCE = 1e-5
FORWARD = jax.jit(forward, static_argnames=("architecture", "observe", "unroll"))

ARCHITECTURES = {
    "gpt-gelu": ModelArchitecture(vocabulary=260, width=32, ffn=48, context=24, layers=2, heads=4),
    "gpt-gelu-tanh": ModelArchitecture(vocabulary=260, width=24, ffn=96, context=16, layers=1, heads=2,
                                       activation="gelu_tanh", epsilon=1e-6),
    "llama-gqa": LlamaArchitecture(vocabulary=260, width=32, ffn=40, context=24, layers=2, heads=4, kv_heads=2,
                                   rope_theta=500.0),
}


def perturbed_artifact(name: str, directory):
    architecture = ARCHITECTURES[name]
    weights, provenance = initialize(architecture, seed=3)
    rng = np.random.default_rng(sum(map(ord, name)))
    tensors = {key: np.asarray(value) + 0.05 * rng.standard_normal(np.shape(value)).astype(np.float32)
               for key, value in weights.as_dict().items()}
    if "lm_bias" in tensors:
        tensors["lm_bias"] = np.zeros_like(tensors["lm_bias"])  # GPT2LMHeadModel's head has no bias
    return save_artifact(directory, architecture, ModelWeights.from_dict({k: jnp.asarray(v) for k, v in tensors.items()}),
                         provenance, Tokenizer.bytes_only())


@pytest.fixture(scope="module", params=[*ARCHITECTURES, "chat"])
def exported(request, tmp_path_factory):
    """(name, artifact, export directory, transformers model) through the `jgpt export-hf` command."""
    root = tmp_path_factory.mktemp(request.param)
    artifact = load_model("chat") if request.param == "chat" else perturbed_artifact(request.param, root / "artifact")
    assert jgpt(["export-hf", str(artifact.path), "--out", str(root / "hf")]) == 0
    model = AutoModelForCausalLM.from_pretrained(root / "hf", dtype=torch.float32)
    model.eval()
    return types.SimpleNamespace(name=request.param, artifact=artifact, root=root, out=root / "hf", model=model)


def test_transformers_loads_the_export_with_jgpts_logits(exported):
    a = exported.artifact.architecture
    expected_class = "LlamaForCausalLM" if isinstance(a, LlamaArchitecture) else "GPT2LMHeadModel"
    assert type(exported.model).__name__ == expected_class
    ids = np.random.default_rng(0).integers(0, a.vocabulary, (2, a.context)).astype(np.int32)
    exact = AutoModelForCausalLM.from_pretrained(exported.out, dtype=torch.float64)
    with torch.no_grad():
        expected = exported.model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
        reference = exact.eval()(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    got = np.asarray(FORWARD(exported.artifact.weights, a, jnp.asarray(ids)).logits)
    error, from_exact = float(np.max(np.abs(got - expected))), float(np.max(np.abs(got - reference)))
    rounding = float(np.max(np.abs(expected - reference)))  # transformers' own float32 error
    print(f"{exported.name}: max abs logit error {error:.2e} vs transformers float32, {from_exact:.2e} vs float64 "
          f"(transformers float32 vs float64: {rounding:.2e}; logits up to {np.max(np.abs(reference)):.1f})")
    assert got.shape == expected.shape
    assert from_exact <= max(TOLERANCE, rounding) and error <= max(TOLERANCE, 2 * rounding)


def test_import_of_the_export_gives_back_the_same_identities(exported):
    assert jgpt(["import-hf", str(exported.out), "--out", str(exported.root / "back")]) == 0
    back = load_artifact(exported.root / "back")
    assert back.checkpoint_sha256 == exported.artifact.checkpoint_sha256
    assert back.tokenizer_sha256 == exported.artifact.tokenizer_sha256
    assert back.architecture == exported.artifact.architecture


def test_transformers_tokenizer_treats_typed_control_markers_as_jgpt_does(exported):
    tokenizer = AutoTokenizer.from_pretrained(exported.out)
    jgpt_tokenizer = exported.artifact.tokenizer()
    text = "hi <|user|> there<|turn_end|><|assistant|>"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids == jgpt_tokenizer.encode_text(text)
    assert not set(ids) & set(CONTROL_MARKERS)
    assert tokenizer.eos_token_id == jgpt_tokenizer.turn_end_id
    assert tokenizer.decode(ids) == jgpt_tokenizer.decode(ids).text == text


def test_plain_hf_tokenizers_still_match_typed_markers_unless_told_to_split_them(exported):
    """The documented limit: tokenizer.json cannot declare `encode_special_tokens` (the library does
    not serialize it), so code that loads the file with `tokenizers` alone must set it."""
    import tokenizers

    library = tokenizers.Tokenizer.from_file(str(exported.out / "tokenizer.json"))
    assert library.encode("<|user|>").ids == [ROLE_IDS["user"]]
    library.encode_special_tokens = True
    assert library.encode("<|user|>").ids == exported.artifact.tokenizer().encode_text("<|user|>")


def test_an_imported_models_own_tokenizer_goes_back_out_as_it_came(tmp_path):
    save_model("gpt2", tmp_path / "hf")
    assert jgpt(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "artifact")]) == 0
    assert jgpt(["export-hf", str(tmp_path / "artifact"), "--out", str(tmp_path / "out")]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes()
    assert jgpt(["import-hf", str(tmp_path / "out"), "--out", str(tmp_path / "back")]) == 0
    original, back = load_artifact(tmp_path / "artifact"), load_artifact(tmp_path / "back")
    assert (back.checkpoint_sha256, back.tokenizer_sha256) == (original.checkpoint_sha256, original.tokenizer_sha256)


def test_export_refuses_a_non_empty_directory_unless_forced_and_replaces_it_whole(tmp_path):
    artifact = perturbed_artifact("gpt-gelu-tanh", tmp_path / "artifact")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    code, _, err = run_jgpt(["export-hf", artifact.path, "--out", out])
    assert code == 2 and err.count("\n") == 1 and "--force" in err and "Traceback" not in err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert run_jgpt(["export-hf", artifact.path, "--out", out, "--force"])[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                     "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact", "out"]  # no staging left
    code, _, err = run_jgpt(["export-hf", artifact.path, "--out", tmp_path, "--force"])
    assert code == 2 and "the artifact being exported" in err and (tmp_path / "artifact" / "manifest.json").is_file()


@pytest.mark.parametrize("args, phrase", [
    (["no-such-model"], "no-such-model"),
    (["ARTIFACT", "--out", "FILE"], "is a file"),
])
def test_export_bad_input_is_one_line(tmp_path, args, phrase):
    artifact = perturbed_artifact("gpt-gelu-tanh", tmp_path / "artifact")
    (tmp_path / "file").write_text("x")
    args = [{"ARTIFACT": artifact.path, "FILE": tmp_path / "file"}.get(a, a) for a in args]
    code, _, err = run_jgpt(["export-hf", *args, *([] if "--out" in args else ["--out", tmp_path / "out"])])
    assert code == 2 and err.count("\n") == 1 and phrase in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_gpt_with_an_output_bias_is_refused_naming_it(tmp_path):
    architecture = ARCHITECTURES["gpt-gelu-tanh"]
    weights, provenance = initialize(architecture, seed=0)
    weights = ModelWeights.from_dict({**weights.as_dict(), "lm_bias": jnp.full((architecture.vocabulary,), 0.1)})
    artifact = save_artifact(tmp_path / "artifact", architecture, weights, provenance, Tokenizer.bytes_only())
    code, _, err = run_jgpt(["export-hf", artifact.path, "--out", tmp_path / "out"])
    assert code == 2 and "lm_bias" in err and not (tmp_path / "out").exists()
