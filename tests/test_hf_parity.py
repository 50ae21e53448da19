"""Parity with Hugging Face transformers: models saved with `save_pretrained`, imported with `jgpt import-hf`.

The reference is torch's own forward of the same randomly initialized model; every
parameter is perturbed before saving so that biases and norm scales are not the
trivial zeros and ones of a fresh init. Tolerance: max abs 1e-5 on float32 logits.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from jgpt.artifacts.artifact import load_artifact
from jgpt.artifacts.hf_import import convert
from jgpt.cli.main import main as jgpt
from jgpt.foundation.errors import ApiError
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.transformer import KVBuffers, forward
from jgpt.model.weights import parameter_count

FORWARD = jax.jit(forward, static_argnames=("architecture", "observe", "unroll"))
TOLERANCE = 1e-5

CONFIGS = {
    "gpt2-base": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=16)),
    "gpt2-exact-gelu-ffn": lambda: GPT2LMHeadModel(
        GPT2Config(
            vocab_size=61,
            n_embd=48,
            n_layer=3,
            n_head=3,
            n_positions=20,
            n_inner=72,
            activation_function="gelu",
            layer_norm_epsilon=1e-6,
        )
    ),
    "gpt2-untied": lambda: GPT2LMHeadModel(
        GPT2Config(
            vocab_size=130,
            n_embd=24,
            n_layer=1,
            n_head=2,
            n_positions=12,
            activation_function="gelu_pytorch_tanh",
            tie_word_embeddings=False,
        )
    ),
    "llama-base": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=16,
        )
    ),
    "llama-gqa-theta": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=61,
            hidden_size=48,
            intermediate_size=40,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            max_position_embeddings=20,
            rms_norm_eps=1e-5,
            rope_theta=500.0,
        )
    ),
    "llama-mqa-tied": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=260,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=12,
            tie_word_embeddings=True,
        )
    ),  # embeds the byte tokenizer
    # A sliding window of 5 over sequences of up to 20 positions, with grouped heads.
    "mistral-window-gqa": lambda: MistralForCausalLM(
        MistralConfig(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=20,
            sliding_window=5,
        )
    ),
    # Biases on the query, key and value projections, grouped heads, the head tied to the embedding.
    "qwen2-bias-gqa-tied": lambda: Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=96,
            hidden_size=48,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            max_position_embeddings=16,
            tie_word_embeddings=True,
        )
    ),
    # Llama 3.1's frequency scaling, its three regimes all present: with head_dim 16 and theta 10000 the
    # wavelengths are 6.3, 19.9, 62.8, .. 19869: 6.3 is below 20 / 2 (kept), 19.9 between 20 / 2 and 20 / 0.5
    # (interpolated), the rest above (divided by the factor).
    "llama3-rope-scaling": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=24,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 0.5,
                "high_freq_factor": 2.0,
                "original_max_position_embeddings": 20,
            },
        )
    ),
}
FAMILIES = {"gpt2": ModelArchitecture, "llama": LlamaArchitecture, "mistral": LlamaArchitecture,
            "qwen2": LlamaArchitecture, "llama3": LlamaArchitecture}  # fmt: skip


def save_perturbed(name: str, directory) -> torch.nn.Module:
    torch.manual_seed(sum(map(ord, name)))
    model = CONFIGS[name]()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.eval()
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def imported(request, tmp_path_factory):
    """(name, torch model, imported artifact) for one configuration, through the `jgpt import-hf` command."""
    root = tmp_path_factory.mktemp(request.param)
    model = save_perturbed(request.param, root / "hf")
    assert jgpt(["import-hf", str(root / "hf"), "--out", str(root / "artifact")]) == 0
    return request.param, model, load_artifact(root / "artifact")


def reference_logits(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()


def test_logits_match_transformers_up_to_the_full_context(imported):
    name, model, artifact = imported
    architecture = artifact.architecture
    assert isinstance(architecture, FAMILIES[name.split("-")[0]])
    ids = np.random.default_rng(0).integers(0, architecture.vocabulary, (3, architecture.context)).astype(np.int32)
    expected = reference_logits(model, ids)
    got = np.asarray(FORWARD(artifact.weights, architecture, jnp.asarray(ids)).logits)
    assert got.shape == expected.shape
    assert np.max(np.abs(got - expected)) <= TOLERANCE
    if isinstance(architecture, LlamaArchitecture) and architecture.attention_window is not None:  # what it holds
        unwindowed = dataclasses.replace(architecture, sliding_window=None)
        assert (
            np.max(np.abs(np.asarray(FORWARD(artifact.weights, unwindowed, jnp.asarray(ids)).logits) - expected)) > 1e-2
        )
    short = ids[:, :5]  # a shorter sequence: the same computation on a prefix
    np.testing.assert_allclose(
        FORWARD(artifact.weights, architecture, jnp.asarray(short)).logits,
        reference_logits(model, short),
        atol=TOLERANCE,
        rtol=0,
    )


def test_cached_continuation_matches_transformers(imported):
    _, model, artifact = imported
    a = artifact.architecture
    B, T, split = 2, a.context, a.context // 3
    ids = np.random.default_rng(1).integers(0, a.vocabulary, (B, T)).astype(np.int32)
    expected = reference_logits(model, ids)
    prefix = FORWARD(artifact.weights, a, jnp.asarray(ids[:, :split]), cache=KVBuffers.empty(a, B, T))
    positions = jnp.broadcast_to(jnp.arange(split, T, dtype=jnp.int32), (B, T - split))
    rest = FORWARD(artifact.weights, a, jnp.asarray(ids[:, split:]), positions=positions, cache=prefix.cache)
    got = np.concatenate([prefix.logits, rest.logits], axis=1)
    assert np.max(np.abs(got - expected)) <= TOLERANCE


def test_parameter_count_matches_the_torch_model(imported):
    name, model, artifact = imported
    a = artifact.architecture
    torch_count = sum(p.numel() for p in model.parameters())  # tied heads are counted once by torch
    tied = bool(model.config.tie_word_embeddings)
    untied_head = a.width * a.vocabulary if tied else 0
    lm_bias = a.vocabulary if name.startswith("gpt2") else 0  # jgpt's GPT keeps an (imported: zero) lm bias
    assert parameter_count(a) == artifact.parameters == torch_count + untied_head + lm_bias
    if name.startswith("gpt2"):
        np.testing.assert_array_equal(artifact.weights.lm_bias, 0.0)
    if tied:
        np.testing.assert_array_equal(artifact.weights.lm_head, artifact.weights.token_embedding.T)
    assert artifact.provenance["kind"] == "import" and artifact.provenance["seed"] is None
    assert type(model).__name__ in artifact.provenance["initializer"]


def test_unsupported_configurations_are_refused_naming_the_setting(tmp_path):
    save_perturbed("gpt2-base", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for setting, value in [
        ("activation_function", "relu"),
        ("scale_attn_by_inverse_layer_idx", True),
        ("model_type", "bert"),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({**config, setting: value}))
        with pytest.raises(ApiError) as error:
            convert(tmp_path)
        assert error.value.field == f"config.json:{setting}"
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ApiError) as error:
        convert(tmp_path)
    assert error.value.field == "directory"


def test_sharded_checkpoints_import_to_the_same_weights(tmp_path):
    model = save_perturbed("llama-gqa-theta", tmp_path / "single")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    _, single, _ = convert(tmp_path / "single")
    _, sharded, provenance = convert(tmp_path / "sharded")
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded)):
        np.testing.assert_array_equal(a, b)
    assert provenance.initializer.count(":sha256:") > 1
    next((tmp_path / "sharded").glob("model-*.safetensors")).unlink()
    with pytest.raises(ApiError) as error:
        convert(tmp_path / "sharded")
    assert error.value.field == "model.safetensors.index.json"


def test_import_hf_command_reports_bad_input_in_one_line(tmp_path, capsys):
    assert jgpt(["import-hf", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_next_to_the_model_becomes_the_artifacts_tokenizer(tmp_path):
    from jgpt.tokenizers.tokenizer import Tokenizer

    save_perturbed("llama-mqa-tied", tmp_path / "hf")
    tokenizer = Tokenizer.bytes_only()
    tokenizer.save(tmp_path / "hf" / "tokenizer.json")
    assert jgpt(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "artifact")]) == 0
    artifact = load_artifact(tmp_path / "artifact")
    assert artifact.tokenizer_sha256 == tokenizer.tokenizer_sha256
    assert (artifact.tokenizer_path).read_bytes() == (tmp_path / "hf" / "tokenizer.json").read_bytes()


def jgpt_greedy(artifact, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy ids after `prompt` by a prefill and then one cached decode step per token, with each step's logits."""
    a = artifact.architecture
    prefill = FORWARD(artifact.weights, a, jnp.asarray([prompt], jnp.int32), cache=KVBuffers.empty(a, 1, a.context))
    logits, cache, ids = [prefill.logits[0, -1]], prefill.cache, list(prompt)
    for position in range(len(prompt), len(prompt) + steps - 1):
        ids.append(int(jnp.argmax(logits[-1])))
        step = FORWARD(artifact.weights, a, jnp.asarray([[ids[-1]]], jnp.int32),
                       positions=jnp.asarray([[position]], jnp.int32), cache=cache)  # fmt: skip
        logits.append(step.logits[0, -1])
        cache = step.cache
    ids.append(int(jnp.argmax(logits[-1])))
    return ids, np.stack(logits)


def transformers_greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    """transformers' own greedy decode: its prefill, then one step per token over its KV cache."""
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        ids = [*prompt, int(out.logits[0, -1].argmax())]
        for _ in range(steps - 1):
            out = model(torch.tensor([[ids[-1]]]), cache=out.past_key_values, use_cache=True)
            ids.append(int(out.logits[0, -1].argmax()))
    return ids


def test_greedy_decode_matches_transformers_step_by_step(imported):
    """The parity table's row: full forward and one-token cached decode logits against transformers' full forward,
    and the greedy ids against transformers' own cached greedy decode, over the whole context (past any window)."""
    name, model, artifact = imported
    a = artifact.architecture
    ids = np.random.default_rng(2).integers(0, a.vocabulary, (1, a.context)).astype(np.int32)
    full = float(np.max(np.abs(np.asarray(FORWARD(artifact.weights, a, jnp.asarray(ids)).logits)
                               - reference_logits(model, ids))))  # fmt: skip
    prompt, steps = ids[0, :4].tolist(), a.context - 4
    greedy, step_logits = jgpt_greedy(artifact, prompt, steps)
    expected = reference_logits(model, np.asarray([greedy[:-1]]))[0, len(prompt) - 1 :]
    cached = float(np.max(np.abs(step_logits - expected)))
    same = greedy == transformers_greedy(model, prompt, steps)
    print(f"| {name} | {full:.1e} | {cached:.1e} | {same} ({steps} tokens) |")
    assert full <= TOLERANCE and cached <= TOLERANCE and same


def test_unsupported_llama_family_settings_are_refused_naming_them(tmp_path):
    save_perturbed("llama3-rope-scaling", tmp_path / "llama")
    save_perturbed("qwen2-bias-gqa-tied", tmp_path / "qwen2")
    llama = json.loads((tmp_path / "llama" / "config.json").read_text())
    qwen2 = json.loads((tmp_path / "qwen2" / "config.json").read_text())
    yarn = {**llama["rope_parameters"], "rope_type": "yarn"}
    for directory, config, field in [
        ("llama", {**llama, "rope_parameters": yarn}, "config.json:rope_parameters.rope_type"),
        ("llama", {**llama, "attention_bias": True}, "config.json:attention_bias"),
        ("qwen2", {**qwen2, "use_sliding_window": True}, "config.json:use_sliding_window"),
        ("qwen2", {**qwen2, "model_type": "mistral", "sliding_window": 0}, "config.json:sliding_window"),
    ]:
        (tmp_path / directory / "config.json").write_text(json.dumps(config))
        with pytest.raises(ApiError) as error:
            convert(tmp_path / directory)
        assert error.value.field == field
