"""Import a GPT-2 or Llama model a user already has in Hugging Face format.

Reads a local directory holding `config.json`, `model.safetensors` (or the shards
named by `model.safetensors.index.json`) and, if present, `tokenizer.json`, with the
safetensors numpy reader, so neither torch nor transformers is needed, and nothing
is downloaded. Hugging Face stores GPT-2
projections as `[in, out]` (its Conv1D) and Llama projections as `[out, in]`
(nn.Linear); both become ModelWeights' `[in, out]` with the layer axis stacked.
A head tied to the embedding is copied; GPT-2's missing lm bias becomes zeros.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jgpt.architecture import Architecture, LlamaArchitecture, ModelArchitecture
from jgpt.errors import ApiError
from jgpt.weights import InitializationProvenance, ModelWeights

GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def _setting(config: Mapping[str, Any], name: str, default: Any = None) -> Any:
    value = config.get(name, default)
    if value is None:
        raise ApiError(f"config.json:{name}", "is required")
    return value


def _require_setting(config: Mapping[str, Any], name: str, expected: Any) -> None:
    if config.get(name, expected) != expected:
        raise ApiError(f"config.json:{name}", f"{config[name]!r} is not supported; jgpt needs {expected!r}")


def _precision(config: Mapping[str, Any]) -> str:
    return "bfloat16" if config.get("dtype", config.get("torch_dtype")) == "bfloat16" else "float32"


def _gpt2_architecture(config: Mapping[str, Any]) -> ModelArchitecture:
    activation = _setting(config, "activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        raise ApiError("config.json:activation_function", f"{activation!r} is not supported")
    _require_setting(config, "scale_attn_weights", True)
    _require_setting(config, "scale_attn_by_inverse_layer_idx", False)
    width = _setting(config, "n_embd")
    return ModelArchitecture(
        vocabulary=_setting(config, "vocab_size"),
        width=width,
        ffn=config.get("n_inner") or 4 * width,
        context=_setting(config, "n_positions"),
        layers=_setting(config, "n_layer"),
        heads=_setting(config, "n_head"),
        epsilon=_setting(config, "layer_norm_epsilon", 1e-5),
        activation=GPT2_ACTIVATIONS[activation],
        precision=_precision(config),
    )


def _llama_architecture(config: Mapping[str, Any]) -> LlamaArchitecture:
    _require_setting(config, "hidden_act", "silu")
    _require_setting(config, "attention_bias", False)
    _require_setting(config, "mlp_bias", False)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ApiError("config.json:rope_parameters", f"only default rotary positions are supported, got {rope}")
    width, heads = _setting(config, "hidden_size"), _setting(config, "num_attention_heads")
    if config.get("head_dim", width // heads) != width // heads:
        raise ApiError("config.json:head_dim", f"must equal hidden_size/num_attention_heads = {width // heads}")
    return LlamaArchitecture(
        vocabulary=_setting(config, "vocab_size"),
        width=width,
        ffn=_setting(config, "intermediate_size"),
        context=_setting(config, "max_position_embeddings"),
        layers=_setting(config, "num_hidden_layers"),
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        epsilon=_setting(config, "rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        precision=_precision(config),
    )


class _Tensors:
    """Named float32 tensors of a safetensors file, with the module prefix stripped."""

    def __init__(self, tensors: Mapping[str, np.ndarray], prefix: str):
        self._tensors = {name.removeprefix(prefix): value for name, value in tensors.items()}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._tensors:
            raise ApiError("safetensors", f"the model files hold no tensor {name!r}")
        return np.asarray(self._tensors[name], dtype=np.float32)

    def stacked(self, layers: int, name: Callable[[int], str], transpose: bool = False) -> np.ndarray:
        return np.stack([self[name(i)].T if transpose else self[name(i)] for i in range(layers)])


def _gpt2_weights(a: ModelArchitecture, t: _Tensors) -> dict[str, np.ndarray]:
    L, C = a.layers, a.width
    qkv = t.stacked(L, lambda i: f"h.{i}.attn.c_attn.weight")  # [L, C, 3C]
    qkv_bias = t.stacked(L, lambda i: f"h.{i}.attn.c_attn.bias")  # [L, 3C]
    embedding = t["wte.weight"]
    return {
        "token_embedding": embedding,
        "position_embedding": t["wpe.weight"],
        "ln1_scale": t.stacked(L, lambda i: f"h.{i}.ln_1.weight"),
        "ln1_bias": t.stacked(L, lambda i: f"h.{i}.ln_1.bias"),
        "query": qkv[..., :C],
        "key": qkv[..., C : 2 * C],
        "value": qkv[..., 2 * C :],
        "query_bias": qkv_bias[..., :C],
        "key_bias": qkv_bias[..., C : 2 * C],
        "value_bias": qkv_bias[..., 2 * C :],
        "attention_output": t.stacked(L, lambda i: f"h.{i}.attn.c_proj.weight"),
        "attention_output_bias": t.stacked(L, lambda i: f"h.{i}.attn.c_proj.bias"),
        "ln2_scale": t.stacked(L, lambda i: f"h.{i}.ln_2.weight"),
        "ln2_bias": t.stacked(L, lambda i: f"h.{i}.ln_2.bias"),
        "ff_up": t.stacked(L, lambda i: f"h.{i}.mlp.c_fc.weight"),
        "ff_up_bias": t.stacked(L, lambda i: f"h.{i}.mlp.c_fc.bias"),
        "ff_down": t.stacked(L, lambda i: f"h.{i}.mlp.c_proj.weight"),
        "ff_down_bias": t.stacked(L, lambda i: f"h.{i}.mlp.c_proj.bias"),
        "ln_final_scale": t["ln_f.weight"],
        "ln_final_bias": t["ln_f.bias"],
        "lm_head": (t["lm_head.weight"] if "lm_head.weight" in t else embedding).T.copy(),
        "lm_bias": np.zeros(a.vocabulary, np.float32),
    }


def _llama_weights(a: LlamaArchitecture, t: _Tensors) -> dict[str, np.ndarray]:
    L = a.layers
    linear = lambda name: t.stacked(L, lambda i: f"layers.{i}.{name}.weight", transpose=True)
    embedding = t["embed_tokens.weight"]
    return {
        "token_embedding": embedding,
        "ln1_scale": t.stacked(L, lambda i: f"layers.{i}.input_layernorm.weight"),
        "query": linear("self_attn.q_proj"),
        "key": linear("self_attn.k_proj"),
        "value": linear("self_attn.v_proj"),
        "attention_output": linear("self_attn.o_proj"),
        "ln2_scale": t.stacked(L, lambda i: f"layers.{i}.post_attention_layernorm.weight"),
        "ff_gate": linear("mlp.gate_proj"),
        "ff_up": linear("mlp.up_proj"),
        "ff_down": linear("mlp.down_proj"),
        "ln_final_scale": t["norm.weight"],
        "lm_head": (t["lm_head.weight"] if "lm_head.weight" in t else embedding).T.copy(),
    }


# Hugging Face class -> (architecture reader, weight converter, module prefix in the safetensors file)
_FAMILIES = {
    "GPT2LMHeadModel": (_gpt2_architecture, _gpt2_weights, "transformer."),
    "LlamaForCausalLM": (_llama_architecture, _llama_weights, "model."),
}
_MODEL_TYPES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


def _weight_files(directory: Path) -> list[Path]:
    """model.safetensors, or the shards its index names (as save_pretrained writes large models)."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as error:
            raise ApiError(index.name, f"is not a safetensors index: {error}") from None
        missing = [name for name in shards if not (directory / name).is_file()]
        if missing:
            raise ApiError(index.name, f"names {missing[0]}, which {directory} does not hold")
        return [directory / name for name in shards]
    raise ApiError("directory", f"{directory} has no model.safetensors (nor model.safetensors.index.json)")


def convert(directory: str | Path) -> tuple[Architecture, ModelWeights, InitializationProvenance]:
    """Architecture, weights and import provenance of a local Hugging Face model directory."""
    from safetensors.numpy import load_file

    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ApiError("directory", f"{directory} has no config.json")
    weight_files = _weight_files(directory)
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise ApiError("config.json", f"is not readable JSON: {error}") from None
    family = _MODEL_TYPES.get(config.get("model_type"))
    if family is None:
        raise ApiError("config.json:model_type", f"{config.get('model_type')!r} is not one of {', '.join(_MODEL_TYPES)}")
    read_architecture, read_weights, prefix = _FAMILIES[family]
    architecture = read_architecture(config)
    tensors = {}
    for path in weight_files:
        try:
            tensors |= load_file(path)
        except Exception as error:  # safetensors raises its own error types for damaged files
            raise ApiError(path.name, f"cannot be read: {error}") from None
    weights = ModelWeights.from_dict(read_weights(architecture, _Tensors(tensors, prefix)))
    sources = ",".join(f"{path.name}:sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}" for path in weight_files)
    provenance = InitializationProvenance(initializer=f"huggingface:{family}:{sources}", kind="import", seed=None)
    return architecture, weights, provenance


def import_hf(directory: str | Path, out: str | Path, *, overwrite: bool = False):
    """Convert a local Hugging Face model directory into a jgpt ModelArtifact at `out`."""
    from jgpt.artifact import save_artifact

    architecture, weights, provenance = convert(directory)
    tokenizer = Path(directory) / "tokenizer.json"
    tokenizer = tokenizer if tokenizer.is_file() else None
    return save_artifact(out, architecture, weights, provenance, tokenizer, overwrite=overwrite)
