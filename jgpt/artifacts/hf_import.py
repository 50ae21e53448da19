"""Import a GPT-2 or Llama-family (Llama, Mistral, Qwen2) model a user already has in Hugging Face format.

Reads a local directory holding `config.json`, `model.safetensors` (or the shards
named by `model.safetensors.index.json`) and, if present, `tokenizer.json`, with the
safetensors numpy reader, so neither torch nor transformers is needed, and nothing
is downloaded. Hugging Face stores GPT-2
projections as `[in, out]` (its Conv1D) and Llama projections as `[out, in]`
(nn.Linear); both become ModelWeights' `[in, out]` with the layer axis stacked.
A head tied to the embedding is copied; GPT-2's missing lm bias becomes zeros.
Mistral is Llama with a sliding window (`sliding_window`, null for none) and Qwen2 is
Llama with biases on the query, key and value projections: both become a LlamaArchitecture
with those fields. Llama 3.1's `rope_type: "llama3"` frequency scaling is read into its
`rope_scaling`. What jgpt does not compute is refused naming the config field (another
`rope_type`, Qwen2's `use_sliding_window: true`, a `head_dim` other than hidden_size/heads).

Everything read is checked before anything model-sized is allocated: every size in
config.json is a positive integer of at most DIMENSION_LIMIT, the parameters they
imply at most jgpt.foundation.limits.PARAMETER_LIMIT, every number finite,
every shard the index names lies inside the directory, and every tensor's shape (read
from the safetensors headers alone) is the one the config implies. So memory follows
the files' size, never a number written in them. A tokenizer.json (jgpt's own, or the
model's Hugging Face one used as is, with the tokenizer_config.json and chat_template.jinja
beside it: see jgpt/tokenizers/hf_tokenizer.py) must load and have no more ids than the model embeds.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jgpt.foundation.errors import ApiError, library_failure
from jgpt.foundation.identity import require_finite
from jgpt.foundation.json_input import read_json
from jgpt.foundation.limits import PARAMETER_LIMIT
from jgpt.foundation.output_paths import output_directory
from jgpt.foundation.paths import confined
from jgpt.foundation.validation import is_integer, is_number
from jgpt.model.architecture import Architecture, LlamaArchitecture, ModelArchitecture, RopeScaling
from jgpt.model.weights import InitializationProvenance, ModelWeights, parameter_count

GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
# The largest vocabulary, width, context, layer or head count read from config.json: past
# today's largest open models, and small enough that no product of two overflows float32 counts.
DIMENSION_LIMIT = 1 << 20
INDEX = "model.safetensors.index.json"


def _setting(config: Mapping[str, Any], name: str, default: Any = None) -> Any:
    value = config.get(name, default)
    if value is None:
        raise ApiError(f"config.json:{name}", "is required")
    return value


def _size(config: Mapping[str, Any], name: str, default: Any = None) -> int:
    value = _setting(config, name, default)
    if not is_integer(value) or not 0 < value <= DIMENSION_LIMIT:
        raise ApiError(f"config.json:{name}", f"must be an integer from 1 to {DIMENSION_LIMIT}, got {value!r}")
    return value


def _positive(config: Mapping[str, Any], name: str, default: Any = None) -> float:
    value = _setting(config, name, default)
    if not is_number(value) or not value > 0:
        raise ApiError(f"config.json:{name}", f"must be a positive finite number, got {value!r}")
    return value


def _require_setting(config: Mapping[str, Any], name: str, expected: Any) -> None:
    if config.get(name, expected) != expected:
        raise ApiError(f"config.json:{name}", f"{config[name]!r} is not supported; jgpt needs {expected!r}")


def _precision(config: Mapping[str, Any]) -> str:
    return "bfloat16" if config.get("dtype", config.get("torch_dtype")) == "bfloat16" else "float32"


def _gpt2_architecture(config: Mapping[str, Any]) -> ModelArchitecture:
    activation = _setting(config, "activation_function", "gelu_new")
    if not isinstance(activation, str) or activation not in GPT2_ACTIVATIONS:
        raise ApiError("config.json:activation_function", f"{activation!r} is not supported")
    _require_setting(config, "scale_attn_weights", True)
    _require_setting(config, "scale_attn_by_inverse_layer_idx", False)
    width = _size(config, "n_embd")
    return ModelArchitecture(
        vocabulary=_size(config, "vocab_size"),
        width=width,
        ffn=_size(config, "n_inner") if config.get("n_inner") is not None else 4 * width,
        context=_size(config, "n_positions"),
        layers=_size(config, "n_layer"),
        heads=_size(config, "n_head"),
        epsilon=_positive(config, "layer_norm_epsilon", 1e-5),
        activation=GPT2_ACTIVATIONS[activation],
        precision=_precision(config),
    )


def _llama_architecture(config: Mapping[str, Any]) -> LlamaArchitecture:
    _require_setting(config, "attention_bias", False)
    return _llama_family(config)


def _mistral_architecture(config: Mapping[str, Any]) -> LlamaArchitecture:
    window = config.get("sliding_window")
    if window is not None and (not is_integer(window) or not 0 < window <= DIMENSION_LIMIT):
        raise ApiError(
            "config.json:sliding_window", f"must be null or an integer from 1 to {DIMENSION_LIMIT}, got {window!r}"
        )
    return _llama_family(config, sliding_window=window)


def _qwen2_architecture(config: Mapping[str, Any]) -> LlamaArchitecture:
    # With use_sliding_window false (every released Qwen2) transformers ignores sliding_window and max_window_layers.
    _require_setting(config, "use_sliding_window", False)
    return _llama_family(config, attention_bias=True)


def _llama_family(
    config: Mapping[str, Any], *, attention_bias: bool = False, sliding_window: int | None = None
) -> LlamaArchitecture:
    _require_setting(config, "hidden_act", "silu")
    _require_setting(config, "mlp_bias", False)
    width, heads = _size(config, "hidden_size"), _size(config, "num_attention_heads")
    if config.get("head_dim", width // heads) not in (width // heads, None):
        raise ApiError("config.json:head_dim", f"must equal hidden_size/num_attention_heads = {width // heads}")
    theta, rope_scaling = _rotary(config)
    return LlamaArchitecture(
        vocabulary=_size(config, "vocab_size"),
        width=width,
        ffn=_size(config, "intermediate_size"),
        context=_size(config, "max_position_embeddings"),
        layers=_size(config, "num_hidden_layers"),
        heads=heads,
        kv_heads=_size(config, "num_key_value_heads") if config.get("num_key_value_heads") is not None else heads,
        epsilon=_positive(config, "rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        precision=_precision(config),
        attention_bias=attention_bias,
        sliding_window=sliding_window,
        rope_scaling=rope_scaling,
    )


def _rotary(config: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope_scaling) from `rope_parameters` (transformers 5) or `rope_scaling` with a top-level
    `rope_theta` (earlier versions): default rotary positions, or Llama 3.1's scaled ones."""
    field = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    rope = config.get(field) or {}
    if not isinstance(rope, dict):
        raise ApiError(f"config.json:{field}", f"must be an object, got {rope!r}")
    theta = _positive(rope, "rope_theta") if "rope_theta" in rope else _positive(config, "rope_theta", 10000.0)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ApiError(
            f"config.json:{field}.rope_type",
            f"{kind!r} is not supported; jgpt reads 'default' and 'llama3' rotary positions",
        )
    scope = {f"{field}.{name}": value for name, value in rope.items()}
    factors = {
        name: float(_positive(scope, f"{field}.{name}")) for name in ("factor", "low_freq_factor", "high_freq_factor")
    }
    return theta, RopeScaling(**factors, original_context=_size(scope, f"{field}.original_max_position_embeddings"))


class _Tensors:
    """Named float32 tensors of a safetensors file, with the module prefix stripped."""

    def __init__(self, tensors: Mapping[str, np.ndarray], prefix: str):
        self._tensors = {name.removeprefix(prefix): value for name, value in tensors.items()}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._tensors:
            raise ApiError("safetensors", f"the model files hold no tensor {name!r}")
        with np.errstate(over="ignore"):  # a float64 past float32's range becomes an infinity, refused below
            tensor = np.asarray(self._tensors[name], dtype=np.float32)
        if not np.isfinite(tensor).all():
            raise ApiError(f"safetensors:{name}", "holds a value that is not a finite float32 number")
        return tensor

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
    bias = lambda name: t.stacked(L, lambda i: f"layers.{i}.self_attn.{name}.bias")
    projections = (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"))
    biases = {f"{ours}_bias": bias(name) for name, ours in projections} if a.attention_bias else {}
    return biases | {
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


def _gpt2_shapes(a: ModelArchitecture) -> Iterator[tuple[str, tuple[int, ...]]]:
    C, F = a.width, a.ffn
    yield from (("wte.weight", (a.vocabulary, C)), ("wpe.weight", (a.context, C)))
    for i in range(a.layers):
        yield from (
            (f"h.{i}.ln_1.weight", (C,)),
            (f"h.{i}.ln_1.bias", (C,)),
            (f"h.{i}.attn.c_attn.weight", (C, 3 * C)),
            (f"h.{i}.attn.c_attn.bias", (3 * C,)),
            (f"h.{i}.attn.c_proj.weight", (C, C)),
            (f"h.{i}.attn.c_proj.bias", (C,)),
            (f"h.{i}.ln_2.weight", (C,)),
            (f"h.{i}.ln_2.bias", (C,)),
            (f"h.{i}.mlp.c_fc.weight", (C, F)),
            (f"h.{i}.mlp.c_fc.bias", (F,)),
            (f"h.{i}.mlp.c_proj.weight", (F, C)),
            (f"h.{i}.mlp.c_proj.bias", (C,)),
        )
    yield from (("ln_f.weight", (C,)), ("ln_f.bias", (C,)))


def _llama_shapes(a: LlamaArchitecture) -> Iterator[tuple[str, tuple[int, ...]]]:
    C, F, KV = a.width, a.ffn, a.kv_width
    yield "embed_tokens.weight", (a.vocabulary, C)
    for i in range(a.layers):
        yield from (
            (f"layers.{i}.input_layernorm.weight", (C,)),
            (f"layers.{i}.self_attn.q_proj.weight", (C, C)),
            (f"layers.{i}.self_attn.k_proj.weight", (KV, C)),
            (f"layers.{i}.self_attn.v_proj.weight", (KV, C)),
            (f"layers.{i}.self_attn.o_proj.weight", (C, C)),
            (f"layers.{i}.post_attention_layernorm.weight", (C,)),
            (f"layers.{i}.mlp.gate_proj.weight", (F, C)),
            (f"layers.{i}.mlp.up_proj.weight", (F, C)),
            (f"layers.{i}.mlp.down_proj.weight", (C, F)),
        )
        if a.attention_bias:
            yield from (
                (f"layers.{i}.self_attn.q_proj.bias", (C,)),
                (f"layers.{i}.self_attn.k_proj.bias", (KV,)),
                (f"layers.{i}.self_attn.v_proj.bias", (KV,)),
            )
    yield "norm.weight", (C,)


# Hugging Face class -> (architecture reader, tensor shapes, weight converter, module prefix in the safetensors file)
# Each family's readers take that family's architecture alone (the pairing is by row, so typed Any here):
# (read_architecture, shapes, read_weights, module prefix).
_FAMILIES: dict[
    str,
    tuple[
        Callable[[Mapping[str, Any]], Architecture],
        Callable[[Any], Iterator[tuple[str, tuple[int, ...]]]],
        Callable[[Any, _Tensors], dict[str, np.ndarray]],
        str,
    ],
] = {
    "GPT2LMHeadModel": (_gpt2_architecture, _gpt2_shapes, _gpt2_weights, "transformer."),
    "LlamaForCausalLM": (_llama_architecture, _llama_shapes, _llama_weights, "model."),
    "MistralForCausalLM": (_mistral_architecture, _llama_shapes, _llama_weights, "model."),
    "Qwen2ForCausalLM": (_qwen2_architecture, _llama_shapes, _llama_weights, "model."),
}
_MODEL_TYPES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def _model_file(directory: Path, name: str, field: str | None = None) -> Path | None:
    """`directory/name` when it is a regular file inside the directory (a link may lead to one there),
    None when there is nothing of that name. A link out of the directory, a directory, a FIFO or a device
    is refused naming the file: each used to be read through the link, or taken for an absent file."""
    field = field or name
    path = confined(directory, name, field)
    if not os.path.lexists(directory / name):
        return None
    if not path.exists():
        raise ApiError(field, f"{directory / name} is a symbolic link to nothing")
    if not path.is_file():
        raise ApiError(field, f"{directory / name} is a directory, not a file")
    return path


def _weight_files(directory: Path) -> list[Path]:
    """model.safetensors, or the shards its index names (as save_pretrained writes large models)."""
    if single := _model_file(directory, "model.safetensors"):
        return [single]
    if index := _model_file(directory, INDEX):
        weight_map = read_json(index, INDEX)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
            raise ApiError(INDEX, "is not a safetensors index: it needs a weight_map of tensor names to shard files")
        names = sorted(set(weight_map.values()))
        for name in names:  # every name is judged before any file is looked at
            confined(directory, name, INDEX)
        shards = [(name, _model_file(directory, name, INDEX)) for name in names]
        missing = [name for name, shard in shards if shard is None]
        if missing:
            raise ApiError(INDEX, f"names {missing[0]}, which {directory} does not hold")
        return [shard for _, shard in shards if shard is not None]
    raise ApiError("directory", f"{directory} has no model.safetensors (nor {INDEX})")


def _check_shapes(
    files: list[Path],
    prefix: str,
    architecture: Architecture,
    shapes: Callable[[Any], Iterator[tuple[str, tuple[int, ...]]]],
) -> None:
    """Compare every tensor's shape, read from the headers alone, with what the config implies."""
    from safetensors import safe_open

    found: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            with safe_open(path, framework="numpy") as file:
                found |= {name.removeprefix(prefix): tuple(file.get_slice(name).get_shape()) for name in file.keys()}
        except BaseException as error:  # safetensors' own error types, or a Rust panic on a hostile header
            if not library_failure(error):
                raise
            raise ApiError(path.name, f"cannot be read: {error}") from None
    optional = [("lm_head.weight", (architecture.vocabulary, architecture.width))] if "lm_head.weight" in found else []
    expected: set[str] = set()
    # Lazily: a config claiming a million layers stops at the first tensor the files lack.
    for name, shape in itertools.chain(optional, shapes(architecture)):
        if name not in found:
            raise ApiError("safetensors", f"the model files hold no tensor {name!r}")
        if found[name] != shape:
            raise ApiError(
                "safetensors", f"tensor {name!r} has shape {list(found[name])}; config.json implies {list(shape)}"
            )
        expected.add(name)
    # A tensor the config does not describe (a layer past num_hidden_layers) would be dropped without a word,
    # importing a truncated model. Only the buffers older transformers saved beside a layer may be left over.
    unused = sorted(name for name in found.keys() - expected if not _is_buffer(name, architecture.layers))
    if unused:
        raise ApiError(
            "safetensors",
            f"tensor {unused[0]!r} is not part of the model config.json describes "
            f"({len(unused)} such; does config.json give fewer layers than the weights hold?)",
        )


# Non-parameters that older transformers versions saved: GPT-2's causal mask buffers, Llama's rotary frequencies.
_BUFFER = re.compile(r"h\.(\d+)\.attn\.(?:masked_)?bias|(?:layers\.(\d+)\.self_attn\.)?rotary_emb\.inv_freq")


def _is_buffer(name: str, layers: int) -> bool:
    """Whether `name` is a buffer of one of the `layers` layers (a buffer of a layer beyond them is not)."""
    match = _BUFFER.fullmatch(name)
    layer = match and (match.group(1) or match.group(2))
    return bool(match) and (not layer or int(layer) < layers)


def convert(directory: str | Path) -> tuple[Architecture, ModelWeights, InitializationProvenance]:
    """Architecture, weights and import provenance of a local Hugging Face model directory."""
    from safetensors.numpy import load_file

    directory = Path(directory)
    config_path = _model_file(directory, "config.json")
    if config_path is None:
        raise ApiError("directory", f"{directory} has no config.json")
    weight_files = _weight_files(directory)
    _model_file(directory, "tokenizer.json")  # refused now, before any tensor is read, if it is not a file
    config = read_json(config_path, "config.json", allow_non_finite=True)
    if not isinstance(config, dict):
        raise ApiError("config.json", "must be a JSON object")
    for name, value in config.items():
        require_finite(value, f"config.json:{name}")
    model_type = config.get("model_type")
    family = _MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ApiError("config.json:model_type", f"{model_type!r} is not one of {', '.join(_MODEL_TYPES)}")
    read_architecture, shapes, read_weights, prefix = _FAMILIES[family]
    try:
        architecture = read_architecture(config)
    except ApiError as error:  # a rule between sizes (the width divides into heads) names jgpt's field, not the file's
        if error.field.startswith("config.json"):
            raise
        raise ApiError("config.json", f"describes no valid architecture: {error}") from None
    if parameter_count(architecture) > PARAMETER_LIMIT:
        raise ApiError(
            "config.json",
            f"describes {parameter_count(architecture):,} parameters, more than jgpt's limit of {PARAMETER_LIMIT:,}",
        )
    _check_shapes(weight_files, prefix, architecture, shapes)
    tensors: dict[str, np.ndarray] = {}
    for path in weight_files:
        try:
            tensors |= load_file(path)
        except BaseException as error:  # safetensors raises its own error types for damaged files
            if not library_failure(error):
                raise
            raise ApiError(path.name, f"cannot be read: {error}") from None
    weights = ModelWeights.from_dict(read_weights(architecture, _Tensors(tensors, prefix)))
    sources = ",".join(f"{path.name}:sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}" for path in weight_files)
    provenance = InitializationProvenance(initializer=f"huggingface:{family}:{sources}", kind="import", seed=None)
    return architecture, weights, provenance


def import_hf(directory: str | Path, out: str | Path, *, overwrite: bool = False):
    """Convert a local Hugging Face model directory into a jgpt ModelArtifact at `out`."""
    from jgpt.artifacts.artifact import save_artifact
    from jgpt.tokenizers.prompt_format import imported_prompt_format

    output_directory(out, "out")  # a file, or a path under one, is refused before any work
    source, target = Path(directory).resolve(), Path(out).resolve()
    if source.is_relative_to(target):
        raise ApiError("out", f"{out} is (or holds) the model directory being imported; choose another")
    architecture, weights, provenance = convert(directory)
    tokenizer = _tokenizer(Path(directory), architecture)
    prompt_format = imported_prompt_format(tokenizer, Path(directory))  # chat-template with a chat template, else plain
    return save_artifact(
        out, architecture, weights, provenance, tokenizer, prompt_format=prompt_format, overwrite=overwrite
    )


def _tokenizer(directory: Path, architecture: Architecture):
    """The Tokenizer of tokenizer.json when present, checked now rather than when the model first generates."""
    from jgpt.tokenizers.tokenizer_file import load_tokenizer

    if _model_file(directory, "tokenizer.json") is None:
        return None
    try:  # read by its name in the directory, so that its companions are looked for beside it there
        tokenizer = load_tokenizer(directory / "tokenizer.json")
    except ApiError as error:
        raise ApiError(
            "tokenizer.json", f"{error.reason} (move it aside to import the model without a tokenizer)"
        ) from None
    if tokenizer.vocab_size > architecture.vocabulary:
        raise ApiError(
            "tokenizer.json",
            f"has {tokenizer.vocab_size} ids, more than the model's vocab_size {architecture.vocabulary} can embed",
        )
    return tokenizer
