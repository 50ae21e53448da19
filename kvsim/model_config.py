"""The analytic model of an architecture someone serves, read from where its sizes are written down.

`--model-config PATH` takes a jgpt artifact directory (its manifest.json's architecture), a jgpt
architecture JSON (the fields of jgpt.model.architecture's `to_json`, read here because kvsim imports no
model code), or a Hugging Face `config.json` (or its directory) of the gpt2, llama, mistral or qwen2
model types. Every size is an integer from 1 to DIMENSION_LIMIT, as `import-hf` reads a config; what
the analytic model cannot count (Qwen2's layered sliding window, biases where jgpt has none) is refused
naming the field, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import read_json
from jgpt.foundation.validation import is_integer, kind
from kvsim.analytic import AnalyticModel
from kvsim.analytic_documents import DIMENSION_LIMIT

JGPT_PRECISIONS = {"float32": 4, "bfloat16": 2}
# A Hugging Face config's dtype: what its weights are published in (absent: transformers' float32).
HF_PRECISIONS = {"float32": 4, "bfloat16": 2, "float16": 2}
HF_MODEL_TYPES = ("gpt2", "llama", "mistral", "qwen2")

# The jgpt alternatives (jgpt.model.architecture): the conventions each `position` implies.
_GPT = {"normalization": ("layernorm",), "activation": ("gelu", "gelu_tanh")}
_LLAMA = {"normalization": ("rmsnorm",), "activation": ("swiglu",)}
_JGPT_SIZES = ("vocabulary", "width", "ffn", "context", "layers", "heads")
# Fields that do not change a count: read (checked by the model when it loads), not used.
_JGPT_UNCOUNTED = ("epsilon",)
_ROPE_ONLY = ("kv_heads", "attention_bias", "sliding_window", "rope_theta", "rope_scaling")

Field = Callable[[str], str]  # a member's name as an error names it


def config_file(path: Path, option: str = "--model-config") -> Path:
    """The file `read_model_config` reads for `path`: the path itself, or a directory's manifest.json or
    config.json (so a command can keep its output off it)."""
    if not path.is_dir():
        return path
    for name in ("manifest.json", "config.json"):
        if (path / name).is_file():
            return path / name
    raise ApiError(option, f"{path} holds neither a jgpt manifest.json nor a Hugging Face config.json")


def read_model_config(path: Path, option: str = "--model-config") -> AnalyticModel:
    """The analytic model of the architecture at `path` (an artifact directory, a jgpt architecture JSON,
    a Hugging Face config.json or a directory holding one)."""
    path = config_file(path, option)
    document = read_json(path, option)
    if not isinstance(document, dict):
        raise ApiError(option, f"{path} must hold a JSON object, got {kind(document)}")
    if "model_type" in document:
        return hf_model(document, lambda name: f"{path.name}:{name}")
    if "architecture" in document:  # an artifact's manifest
        architecture = document["architecture"]
        if not isinstance(architecture, dict):
            raise ApiError(f"{path.name}:architecture", f"must be a JSON object, got {kind(architecture)}")
        return jgpt_model(architecture, lambda name: f"{path.name}:architecture.{name}")
    return jgpt_model(document, lambda name: f"{path.name}:{name}")


def _size(document: Mapping[str, Any], name: str, field: Field, default: Any = None) -> int:
    value = document.get(name, default)
    if value is None:
        raise ApiError(field(name), "is required")
    if not is_integer(value) or not 0 < value <= DIMENSION_LIMIT:
        raise ApiError(field(name), f"must be an integer from 1 to {DIMENSION_LIMIT}, got {value!r}")
    return value


def _choice(document: Mapping[str, Any], name: str, field: Field, choices: Mapping[Any, Any] | tuple, default: Any):
    value = document.get(name, default)
    if not isinstance(value, str | bool | type(None)) or value not in choices:
        raise ApiError(field(name), f"{value!r} is not one of {', '.join(map(str, choices))}")
    return value


def _heads(width: int, heads: int, kv_heads: int, head_dim: int | None, field: Field, names: tuple[str, str]) -> None:
    """Query heads in whole groups per key/value head, and a head width that splits the width if none is given."""
    if heads % kv_heads:
        raise ApiError(field(names[1]), f"{names[0]}={heads} is not a multiple of {names[1]}={kv_heads}")
    if head_dim is None and width % heads:
        raise ApiError(field(names[0]), f"width {width} is not divisible by {names[0]}={heads}")


def jgpt_model(architecture: Mapping[str, Any], field: Field) -> AnalyticModel:
    """A jgpt architecture (ModelArchitecture or LlamaArchitecture `to_json`, same field names)."""
    position = _choice(architecture, "position", field, ("learned", "rope"), "learned")
    conventions = _GPT if position == "learned" else _LLAMA
    known = {*_JGPT_SIZES, *_JGPT_UNCOUNTED, "position", "precision", *conventions}
    if position == "rope":
        known |= set(_ROPE_ONLY)
    unknown = sorted(set(architecture) - known)
    if unknown:
        raise ApiError(field(unknown[0]), f"is not a field of a {position}-position jgpt architecture")
    for name, choices in conventions.items():
        _choice(architecture, name, field, choices, choices[0])
    vocabulary, width, ffn, context, layers, heads = (_size(architecture, name, field) for name in _JGPT_SIZES)
    kv_heads = heads if architecture.get("kv_heads") is None else _size(architecture, "kv_heads", field)
    _heads(width, heads, kv_heads, None, field, ("heads", "kv_heads"))
    attention_bias = _choice(architecture, "attention_bias", field, (False, True), False)
    precision = _choice(architecture, "precision", field, tuple(JGPT_PRECISIONS), "float32")
    return AnalyticModel(
        layers=layers,
        width=width,
        ffn=ffn,
        vocabulary=vocabulary,
        precision_bytes=JGPT_PRECISIONS[precision],
        context=context,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=width // heads,
        gated=position == "rope",
        positions="learned" if position == "learned" else "rotary",
        biases="every" if position == "learned" else "query_key_value" if attention_bias else "none",
        sliding_window=_window(architecture, field),
    )


def _window(document: Mapping[str, Any], field: Field) -> int | None:
    """A sliding window: null (none) or a size."""
    return None if document.get("sliding_window") is None else _size(document, "sliding_window", field)


def hf_model(config: Mapping[str, Any], field: Field) -> AnalyticModel:
    """A Hugging Face config.json of a gpt2, llama, mistral or qwen2 model, as jgpt would serve it."""
    model_type = _choice(config, "model_type", field, HF_MODEL_TYPES, None)
    dtype_name = "dtype" if "dtype" in config else "torch_dtype"
    precision = _choice(config, dtype_name, field, tuple(HF_PRECISIONS), "float32")
    if model_type == "gpt2":
        width = _size(config, "n_embd", field)
        heads = _size(config, "n_head", field)
        _heads(width, heads, heads, None, field, ("n_head", "n_head"))
        return AnalyticModel(
            layers=_size(config, "n_layer", field),
            width=width,
            ffn=4 * width if config.get("n_inner") is None else _size(config, "n_inner", field),
            vocabulary=_size(config, "vocab_size", field),
            precision_bytes=HF_PRECISIONS[precision],
            context=_size(config, "n_positions", field),
            heads=heads,
            kv_heads=heads,
            head_dim=width // heads,
            tied_embeddings=_choice(config, "tie_word_embeddings", field, (True, False), True),
        )
    return _llama_family(config, model_type, HF_PRECISIONS[precision], field)


def _llama_family(config: Mapping[str, Any], model_type: str, precision_bytes: int, field: Field) -> AnalyticModel:
    _choice(config, "hidden_act", field, ("silu",), "silu")
    if model_type == "qwen2":  # biases on the query, key and value projections, always
        biases = "query_key_value"
        # Its window covers only the layers past max_window_layers; off (as in every released Qwen2), transformers
        # ignores sliding_window.
        if _choice(config, "use_sliding_window", field, (False, True), False):
            raise ApiError(field("use_sliding_window"), "true is not counted: a window over some layers only")
    else:
        biases = "none"
        for name in ("attention_bias", "mlp_bias"):
            if _choice(config, name, field, (False, True), False):
                raise ApiError(field(name), "true is not counted: jgpt's Llama family has no such biases")
    width, heads = _size(config, "hidden_size", field), _size(config, "num_attention_heads", field)
    kv_heads = heads if config.get("num_key_value_heads") is None else _size(config, "num_key_value_heads", field)
    head_dim = None if config.get("head_dim") is None else _size(config, "head_dim", field)
    _heads(width, heads, kv_heads, head_dim, field, ("num_attention_heads", "num_key_value_heads"))
    return AnalyticModel(
        layers=_size(config, "num_hidden_layers", field),
        width=width,
        ffn=_size(config, "intermediate_size", field),
        vocabulary=_size(config, "vocab_size", field),
        precision_bytes=precision_bytes,
        context=_size(config, "max_position_embeddings", field),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=width // heads if head_dim is None else head_dim,
        gated=True,
        positions="rotary",
        biases=biases,
        tied_embeddings=_choice(config, "tie_word_embeddings", field, (True, False), False),
        sliding_window=_window(config, field) if model_type == "mistral" else None,  # transformers' llama has none
    )
