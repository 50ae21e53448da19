"""Parity with Hugging Face transformers: models saved with `save_pretrained`, imported with `jgpt import-hf`.

The reference is torch's own forward of the same randomly initialized model; every
parameter is perturbed before saving so that biases and norm scales are not the
trivial zeros and ones of a fresh init. Tolerance: max abs 1e-5 on float32 logits.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

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
}


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
    assert isinstance(architecture, LlamaArchitecture if name.startswith("llama") else ModelArchitecture)
    ids = np.random.default_rng(0).integers(0, architecture.vocabulary, (3, architecture.context)).astype(np.int32)
    expected = reference_logits(model, ids)
    got = np.asarray(FORWARD(artifact.weights, architecture, jnp.asarray(ids)).logits)
    assert got.shape == expected.shape
    assert np.max(np.abs(got - expected)) <= TOLERANCE
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
