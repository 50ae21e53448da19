"""`jgpt export-hf`: artifacts out to transformers and back (jgpt/artifacts/hf_export.py).

For each family, a jgpt artifact is exported and transformers' AutoModelForCausalLM loads the
directory. The claim that its logits equal jgpt's within 1e-5 (max abs over random ids at every
position up to the context) is checked exactly in float64: jgpt's forward of the export's
weights cast to float64 (in a subprocess, x64 on) against transformers' float64 forward of the
same files, whose Llama RMSNorm and rotary angles, float32 even in a float64 model, are run in
float64 too. Measured: 7.8e-16 (exact GELU), 5.8e-16 (tanh GELU), 6.7e-16 (GQA Llama) and
1.5e-13 (the shipped chat model, logits up to 20.5).

The float32 check is the user-facing one: the float32 logits must agree within 1e-5 or, where
float32 itself cannot promise that, within the rounding of transformers' own float32 forward.
The chat model's float32 forwards are 6.7e-5 (jgpt) and 9.5e-5 (transformers) from the exact
float64 logits: float32 rounding on both sides, so 1e-5 between them is out of float32's reach
there. That test measures against transformers' float64 forward as shipped (itself 7.8e-5 from
the exact one for the chat model) and requires jgpt no further from it than torch's float32.
`jgpt import-hf` of the export must give back the same checkpoint_sha256 and
tokenizer_sha256. Every weight is perturbed first, so that biases and
norm scales are not the trivial zeros and ones of a fresh init.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jgpt.artifacts.artifact import load_artifact, save_artifact
from jgpt.artifacts.catalog import load_model
from jgpt.artifacts.hf_export import llama_family
from jgpt.cli.main import main as jgpt
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture, RopeScaling
from jgpt.model.transformer import forward
from jgpt.model.weights import ModelWeights, initialize
from jgpt.tokenizers.framing import CONTROL_MARKERS, ROLE_IDS, TURN_END_ID, Turn
from jgpt.tokenizers.tokenizer import Tokenizer
from tests.hf_models import save_model
from tests.hostile import run_jgpt

TOLERANCE = 1e-5
FORWARD = jax.jit(forward, static_argnames=("architecture", "observe", "unroll"))
REPOSITORY = Path(__file__).resolve().parents[1]

# jgpt's forward in float64, in its own process so that x64 and the overrides cannot reach other tests.
# The code of jgpt.model.transformer and jgpt.model.operations runs unchanged; only its two dtypes change: `operations.F32`
# (what products accumulate in and the stream, statistics, softmax and logits are kept in) and the
# architecture's `precision` (the operands' dtype; float64 is no precision jgpt offers, so the list is
# widened here). chex's asserts go, as `forward` asserts float32 logits. The program is checked to hold
# no float32 value before it runs. argv: export directory, ids (.npy), logits out (.npy).
FLOAT64_FORWARD = """
import dataclasses, sys
import chex, jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jgpt.model import architecture as declared, operations
from jgpt.artifacts.hf_import import convert
from jgpt.model.transformer import forward
from jgpt.model.weights import ModelWeights
operations.F32 = jnp.float64
declared.PRECISIONS = (*declared.PRECISIONS, "float64")
chex.disable_asserts()
export, ids, out = sys.argv[1:]
architecture, weights, _ = convert(export)
architecture = dataclasses.replace(architecture, precision="float64")
weights = ModelWeights.from_dict({k: jnp.asarray(np.asarray(v), jnp.float64) for k, v in weights.as_dict().items()})
ids = jnp.asarray(np.load(ids))
program = str(jax.make_jaxpr(lambda w, t: forward(w, architecture, t).logits)(weights, ids))
assert "f32" not in program and "float32" not in program, "a float32 value in the float64 forward"
np.save(out, np.asarray(jax.jit(forward, static_argnames="architecture")(weights, architecture, ids).logits))
"""

ARCHITECTURES = {
    "gpt-gelu": ModelArchitecture(vocabulary=260, width=32, ffn=48, context=24, layers=2, heads=4),
    "gpt-gelu-tanh": ModelArchitecture(
        vocabulary=260, width=24, ffn=96, context=16, layers=1, heads=2, activation="gelu_tanh", epsilon=1e-6
    ),
    "llama-gqa": LlamaArchitecture(
        vocabulary=260, width=32, ffn=40, context=24, layers=2, heads=4, kv_heads=2, rope_theta=500.0
    ),
    "mistral-window": LlamaArchitecture(
        vocabulary=260, width=32, ffn=40, context=24, layers=2, heads=4, kv_heads=2, sliding_window=6
    ),
    "qwen2-bias": LlamaArchitecture(
        vocabulary=260, width=48, ffn=40, context=16, layers=2, heads=6, kv_heads=2, attention_bias=True
    ),
    # head_dim 16: rotary wavelengths 6.3 (kept), 19.9 (interpolated), 62.8 and longer (divided by the factor).
    "llama3-scaled": LlamaArchitecture(
        vocabulary=260,
        width=64,
        ffn=40,
        context=24,
        layers=1,
        heads=4,
        kv_heads=2,
        rope_scaling=RopeScaling(factor=8.0, low_freq_factor=0.5, high_freq_factor=2.0, original_context=20),
    ),  # fmt: skip
}


def perturbed_artifact(name: str, directory, prompt_format: str | None = None):
    architecture = ARCHITECTURES[name]
    weights, provenance = initialize(architecture, seed=3)
    rng = np.random.default_rng(sum(map(ord, name)))
    tensors = {
        key: np.asarray(value) + 0.05 * rng.standard_normal(np.shape(value)).astype(np.float32)
        for key, value in weights.as_dict().items()
    }
    if "lm_bias" in tensors:
        tensors["lm_bias"] = np.zeros_like(tensors["lm_bias"])  # GPT2LMHeadModel's head has no bias
    return save_artifact(
        directory,
        architecture,
        ModelWeights.from_dict({k: jnp.asarray(v) for k, v in tensors.items()}),
        provenance,
        Tokenizer.bytes_only(),
        prompt_format=prompt_format,
    )


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
    expected_class = llama_family(a) if isinstance(a, LlamaArchitecture) else "GPT2LMHeadModel"
    assert type(exported.model).__name__ == expected_class
    ids = np.random.default_rng(0).integers(0, a.vocabulary, (2, a.context)).astype(np.int32)
    exact = AutoModelForCausalLM.from_pretrained(exported.out, dtype=torch.float64)
    with torch.no_grad():
        expected = exported.model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
        reference = exact.eval()(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    got = np.asarray(FORWARD(exported.artifact.weights, a, jnp.asarray(ids)).logits)
    error, from_exact = float(np.max(np.abs(got - expected))), float(np.max(np.abs(got - reference)))
    rounding = float(np.max(np.abs(expected - reference)))  # transformers' own float32 error
    print(
        f"{exported.name}: max abs logit error {error:.2e} vs transformers float32, {from_exact:.2e} vs float64 "
        f"(transformers float32 vs float64: {rounding:.2e}; logits up to {np.max(np.abs(reference)):.1f})"
    )
    assert got.shape == expected.shape
    # Both sides are float32 renderings of the same float64 logits; which lands nearer depends on the order
    # of their sums, not on who is right (the shipped chat model: jgpt 6.56e-05, transformers 5.25 6.17e-05
    # from float64), so each may be up to twice the other's distance.
    assert from_exact <= max(TOLERANCE, 2 * rounding) and error <= max(TOLERANCE, 2 * rounding)


def float64_throughout(model):
    """transformers' Llama family keeps two float32 islands in a float64 model (modeling_llama.py: LlamaRMSNorm
    normalizes in float32, LlamaRotaryEmbedding computes its angles in float32; Mistral's and Qwen2's are copies):
    run both in float64, by the same formulas, Llama 3.1's scaling (modeling_rope_utils.py) included. (Its eager
    softmax is a third; the sdpa attention asked for has none.)"""
    config = model.config
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = lambda h, norm=module: (
                norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
            )
        if type(module).__name__.endswith("RotaryEmbedding"):
            rope = config.rope_parameters
            inverse_frequency = 1.0 / rope["rope_theta"] ** (
                torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim
            )
            if rope["rope_type"] == "llama3":
                inverse_frequency = llama3_frequencies(inverse_frequency, rope)

            def rotary(x, position_ids, inverse_frequency=inverse_frequency):
                angles = torch.cat([position_ids[..., None].double() * inverse_frequency] * 2, dim=-1)
                return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

            module.forward = rotary
    return model


def llama3_frequencies(inverse_frequency: torch.Tensor, rope: dict) -> torch.Tensor:
    """modeling_rope_utils.py's `_compute_llama3_parameters`, on float64 frequencies."""
    original, low, high, factor = (rope[k] for k in ("original_max_position_embeddings", "low_freq_factor",
                                                     "high_freq_factor", "factor"))  # fmt: skip
    wavelength = 2 * math.pi / inverse_frequency
    smooth = (original / wavelength - low) / (high - low)
    scaled = torch.where(wavelength > original / low, inverse_frequency / factor, inverse_frequency)
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def test_jgpt_and_transformers_agree_within_1e5_in_float64(exported):
    """The export's claim, exact: the same weights (the export's, cast to float64) through jgpt's forward and
    transformers' in float64 give the same logits; the float32 forwards' distances from them are printed."""
    a = exported.artifact.architecture
    ids = np.random.default_rng(0).integers(0, a.vocabulary, (2, a.context)).astype(np.int32)
    np.save(exported.root / "ids.npy", ids)
    run = subprocess.run(
        [sys.executable, "-c", FLOAT64_FORWARD, exported.out, exported.root / "ids.npy", exported.root / "float64.npy"],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
    )
    assert run.returncode == 0, run.stderr
    got = np.load(exported.root / "float64.npy")
    model = AutoModelForCausalLM.from_pretrained(exported.out, dtype=torch.float64, attn_implementation="sdpa").eval()
    with torch.no_grad():
        as_shipped = model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
        expected = float64_throughout(model)(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
        transformers32 = exported.model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    jgpt32 = np.asarray(FORWARD(exported.artifact.weights, a, jnp.asarray(ids)).logits)
    error = lambda x: float(np.max(np.abs(x - expected)))
    print(
        f"{exported.name}: float64 max abs logit error {error(got):.1e} (logits up to {np.max(np.abs(expected)):.1f}; "
        f"transformers' float64 as shipped {error(as_shipped):.1e}); float32 forwards from it: jgpt "
        f"{error(jgpt32):.1e}, transformers {error(transformers32):.1e}"
    )
    assert got.dtype == expected.dtype == np.float64 and got.shape == expected.shape
    assert error(got) <= TOLERANCE


def test_import_of_the_export_gives_back_the_same_identities(exported):
    assert jgpt(["import-hf", str(exported.out), "--out", str(exported.root / "back")]) == 0
    back = load_artifact(exported.root / "back")
    assert back.checkpoint_sha256 == exported.artifact.checkpoint_sha256
    assert back.tokenizer_sha256 == exported.artifact.tokenizer_sha256
    assert back.architecture == exported.artifact.architecture
    assert back.prompt_format == exported.artifact.prompt_format == "chat"  # by the exported chat template


def test_transformers_tokenizer_treats_typed_control_markers_as_jgpt_does(exported):
    tokenizer = AutoTokenizer.from_pretrained(exported.out)
    jgpt_tokenizer = exported.artifact.tokenizer()
    text = "hi <|user|> there<|turn_end|><|assistant|>"
    # The chat template's markers are special tokens read as such (as in every Hugging Face chat model), so plain
    # text with typed markers is split as jgpt splits it when asked to.
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
    assert ids == jgpt_tokenizer.encode_text(text)
    assert not set(ids) & set(CONTROL_MARKERS)
    assert tokenizer.eos_token_id == jgpt_tokenizer.turn_end_id
    assert tokenizer.decode(ids) == jgpt_tokenizer.decode(ids).text == text


CONVERSATION = [
    {"role": "system", "content": "Réponds brièvement. 日本語もOK"},
    {"role": "user", "content": "Grüße 👋 — what is cafe\u0301?"},  # a combining accent: NFC-normalized by both
    {"role": "assistant", "content": "Café, naïve: ça va."},
    {"role": "user", "content": "and ß?"},
]


def test_apply_chat_template_renders_jgpts_framing_ids(exported):
    """transformers' apply_chat_template on the export gives exactly jgpt's framed ids, the assistant's turn open."""
    tokenizer = AutoTokenizer.from_pretrained(exported.out)
    jgpt_tokenizer = exported.artifact.tokenizer()
    for messages in (CONVERSATION, CONVERSATION[1:2], CONVERSATION[:2]):
        turns = [Turn(m["role"], m["content"]) for m in messages]
        expected = list(jgpt_tokenizer.encode_turns(turns, open_turn="assistant").ids)
        got = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        assert got == expected
        if exported.name == "chat" and messages is CONVERSATION:
            print(
                f"chat: apply_chat_template {got}\n      jgpt encode_turns   {expected}\n      equal: {got == expected}"
            )
    turns = [Turn(m["role"], m["content"]) for m in CONVERSATION]
    closed = list(jgpt_tokenizer.encode_turns(turns).ids)
    assert tokenizer.apply_chat_template(CONVERSATION)["input_ids"] == closed and closed[-1] == TURN_END_ID
    # Typed markers in a message stay text where the caller asks transformers to sanitize them, as jgpt always does.
    typed = [{"role": "user", "content": "say <|assistant|> and <|turn_end|>"}]
    sanitized = tokenizer.apply_chat_template(typed, add_generation_prompt=True, sanitize_control_tokens=True)
    expected = jgpt_tokenizer.encode_turns([Turn("user", typed[0]["content"])], open_turn="assistant").ids
    assert sanitized["input_ids"] == list(expected) and not set(expected[1:-2]) & set(CONTROL_MARKERS)


def test_the_export_names_no_bos_and_turn_end_as_eos_and_padding(exported):
    """jgpt's models start with nothing but their first token: no BOS for transformers to prepend."""
    tokenizer = AutoTokenizer.from_pretrained(exported.out)
    for name in ("config.json", "generation_config.json"):
        document = json.loads((exported.out / name).read_text())
        assert (document["bos_token_id"], document["eos_token_id"], document["pad_token_id"]) == (
            None, TURN_END_ID, TURN_END_ID)  # fmt: skip
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (None, TURN_END_ID, TURN_END_ID)
    assert exported.model.generation_config.bos_token_id is None


def test_a_plain_text_model_exports_no_chat_template_and_splits_typed_markers(tmp_path):
    artifact = perturbed_artifact("gpt-gelu-tanh", tmp_path / "artifact", prompt_format="plain")
    assert jgpt(["export-hf", str(artifact.path), "--out", str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert "chat_template" not in config and config["split_special_tokens"] is True
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "hi <|user|> there<|turn_end|>"
    assert tokenizer(text, add_special_tokens=False).input_ids == list(artifact.tokenizer().encode_text(text))
    assert jgpt(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    assert load_artifact(tmp_path / "back").prompt_format == "plain"


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
    """--force replaces a previous export only (tests/test_hostile_model_io.py has the rest of the rule)."""
    artifact = perturbed_artifact("gpt-gelu-tanh", tmp_path / "artifact")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    for force in ([], ["--force"]):
        code, _, err = run_jgpt(["export-hf", artifact.path, "--out", out, *force])
        assert code == 2 and err.count("\n") == 1 and "--force" in err and "Traceback" not in err
        assert [p.name for p in out.iterdir()] == ["mine.txt"]
    (out / "mine.txt").unlink()
    assert run_jgpt(["export-hf", artifact.path, "--out", out])[0] == 0
    (out / "config.json").write_text("{}")
    assert run_jgpt(["export-hf", artifact.path, "--out", out, "--force"])[0] == 0
    assert (out / "config.json").read_text() != "{}"
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact", "out"]  # no staging left
    code, _, err = run_jgpt(["export-hf", artifact.path, "--out", tmp_path, "--force"])
    assert code == 2 and ": error: out: " in err and (tmp_path / "artifact" / "manifest.json").is_file()


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["no-such-model"], "no-such-model"),
        (["ARTIFACT", "--out", "FILE"], "is a file"),
    ],
)
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
