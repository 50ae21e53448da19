"""Export a jgpt ModelArtifact as a Hugging Face model directory (the inverse of jgpt/artifacts/hf_import.py).

Writes `config.json`, `generation_config.json`, `model.safetensors` and the tokenizer
(`tokenizer.json` with a `tokenizer_config.json`) so that transformers'
`AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load
it with nothing downloaded and no remote code: the GPT baseline as `GPT2LMHeadModel`
(learned positions, LayerNorm, GELU), the Llama alternative as `LlamaForCausalLM`
(rotary positions, RMSNorm, SwiGLU, grouped-query attention). Both heads are written
untied, so `jgpt import-hf` of the export gives back the same `checkpoint_sha256`.

The tokenizer: an imported model's own files are written back as they came. jgpt's
byte tokenizer.json is written unchanged (its bytes are its identity) with a
tokenizer_config.json that sets `split_special_tokens`, so transformers encodes typed
"<|user|>" as its bytes, as jgpt does; EOS is TURN_END. A model without a tokenizer
exports jgpt's pure-byte one, which is what it reads.

The directory is staged next to `out` and renamed into place (jgpt/foundation/output_paths.py): a
reader never sees half an export, a full disk leaves nothing behind, and a signal cannot
fall between the two renames of a replacement. An existing non-empty directory is replaced
only with `force`, and only when it is a previous export: it holds nothing but the files an
export writes, and its model.safetensors carries the export's mark in its metadata.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import write_atomically
from jgpt.foundation.output_paths import output_directory, recover_replaced, replace_directory, staged
from jgpt.model.architecture import Architecture, LlamaArchitecture
from jgpt.tokenizers.hf_tokenizer import COMPANIONS
from jgpt.tokenizers.tokenizer import Tokenizer

GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
WEIGHTS = "model.safetensors"
# What an export writes; `--force` replaces a directory holding these and nothing else.
EXPORT_FILES = frozenset({"config.json", "generation_config.json", WEIGHTS, "tokenizer.json", *COMPANIONS})
# transformers reads `format`; `jgpt_export` marks the directory as jgpt's own, which `--force` may replace.
EXPORT_METADATA = {"format": "pt", "jgpt_export": "jgpt-hf-export-v1"}
# The start of an export's safetensors header: its metadata comes first, in key order.
_MARK = json.dumps({"__metadata__": dict(sorted(EXPORT_METADATA.items()))}, separators=(",", ":")).encode()[:-1]


def gpt2_config(a: Architecture, eos_id: int) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": a.vocabulary,
        "n_embd": a.width,
        "n_inner": a.ffn,
        "n_positions": a.context,
        "n_layer": a.layers,
        "n_head": a.heads,
        "layer_norm_epsilon": a.epsilon,
        "activation_function": GPT2_ACTIVATIONS[a.activation],
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "dtype": a.precision,
    }


def llama_config(a: LlamaArchitecture, eos_id: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": a.vocabulary,
        "hidden_size": a.width,
        "intermediate_size": a.ffn,
        "max_position_embeddings": a.context,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "rms_norm_eps": a.epsilon,
        "rope_theta": a.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": a.rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "dtype": a.precision,
    }


def gpt2_tensors(w: dict[str, np.ndarray], a: Architecture) -> dict[str, np.ndarray]:
    """GPT-2's Conv1D keeps [in, out] like ModelWeights; query, key and value share one c_attn."""
    if np.any(w["lm_bias"]):
        raise ApiError(
            "lm_bias",
            "is not zero, and GPT2LMHeadModel's head has no bias: this model cannot be exported exactly as GPT-2",
        )
    tensors = {
        "transformer.wte.weight": w["token_embedding"],
        "transformer.wpe.weight": w["position_embedding"],
        "transformer.ln_f.weight": w["ln_final_scale"],
        "transformer.ln_f.bias": w["ln_final_bias"],
        "lm_head.weight": w["lm_head"].T,
    }
    for i in range(a.layers):
        h = f"transformer.h.{i}."
        tensors |= {
            h + "ln_1.weight": w["ln1_scale"][i],
            h + "ln_1.bias": w["ln1_bias"][i],
            h + "attn.c_attn.weight": np.concatenate([w["query"][i], w["key"][i], w["value"][i]], axis=-1),
            h + "attn.c_attn.bias": np.concatenate([w["query_bias"][i], w["key_bias"][i], w["value_bias"][i]]),
            h + "attn.c_proj.weight": w["attention_output"][i],
            h + "attn.c_proj.bias": w["attention_output_bias"][i],
            h + "ln_2.weight": w["ln2_scale"][i],
            h + "ln_2.bias": w["ln2_bias"][i],
            h + "mlp.c_fc.weight": w["ff_up"][i],
            h + "mlp.c_fc.bias": w["ff_up_bias"][i],
            h + "mlp.c_proj.weight": w["ff_down"][i],
            h + "mlp.c_proj.bias": w["ff_down_bias"][i],
        }
    return tensors


def llama_tensors(w: dict[str, np.ndarray], a: LlamaArchitecture) -> dict[str, np.ndarray]:
    """Llama's nn.Linear keeps [out, in]: every projection is transposed."""
    tensors = {
        "model.embed_tokens.weight": w["token_embedding"],
        "model.norm.weight": w["ln_final_scale"],
        "lm_head.weight": w["lm_head"].T,
    }
    linear = {
        "self_attn.q_proj": "query",
        "self_attn.k_proj": "key",
        "self_attn.v_proj": "value",
        "self_attn.o_proj": "attention_output",
        "mlp.gate_proj": "ff_gate",
        "mlp.up_proj": "ff_up",
        "mlp.down_proj": "ff_down",
    }
    for i in range(a.layers):
        layer = f"model.layers.{i}."
        tensors |= {
            layer + "input_layernorm.weight": w["ln1_scale"][i],
            layer + "post_attention_layernorm.weight": w["ln2_scale"][i],
        }
        tensors |= {f"{layer}{name}.weight": w[ours][i].T for name, ours in linear.items()}
    return tensors


def tokenizer_files(tokenizer: Tokenizer, context: int) -> dict[str, bytes]:
    """The tokenizer's files for transformers: an imported one's own, or jgpt's with a config declaring it."""
    from jgpt.tokenizers.hf_tokenizer import HFTokenizer

    if isinstance(tokenizer, HFTokenizer):
        return {"tokenizer.json": tokenizer.document, **dict(tokenizer.companions)}
    eos = tokenizer.token(tokenizer.turn_end_id).piece
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        # HF tokenizers would match typed "<|user|>" as the control id; jgpt encodes it as bytes.
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
    }
    return {"tokenizer.json": tokenizer.document, "tokenizer_config.json": _json(config)}


def export_hf(model: str | os.PathLike, out: str | os.PathLike, *, force: bool = False) -> Path:
    """Write the artifact (catalog id or directory) `model` as a Hugging Face directory `out`."""
    from jgpt.artifacts.catalog import load_model

    target = _check_out(Path(out), force)
    artifact = load_model(model)
    source, resolved = artifact.path.resolve(), target.resolve()
    if source.is_relative_to(resolved) or resolved.is_relative_to(source):
        raise ApiError("out", f"{out} is, holds or lies inside the artifact being exported; choose another")
    a = artifact.architecture
    if a.precision != "float32":
        raise ApiError("precision", f"{a.precision} models are not exported yet; jgpt exports float32 weights")
    tokenizer = artifact.tokenizer()
    weights = {name: np.asarray(tensor, dtype=np.float32) for name, tensor in artifact.weights.as_dict().items()}
    llama = isinstance(a, LlamaArchitecture)
    tensors = (llama_tensors if llama else gpt2_tensors)(weights, a)
    config = (llama_config if llama else gpt2_config)(a, tokenizer.turn_end_id)
    files = {
        "config.json": _json(config),
        "generation_config.json": _json(
            {"bos_token_id": tokenizer.turn_end_id, "eos_token_id": tokenizer.turn_end_id, "do_sample": False}
        ),
        **tokenizer_files(tokenizer, a.context),
    }
    with staged(target, "out") as staging:
        write_atomically(staging / WEIGHTS, safetensors_chunks(tensors, EXPORT_METADATA))
        for name, data in files.items():
            write_atomically(staging / name, data)
        replace_directory(staging, target)
    return target


def safetensors_chunks(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> Iterator[bytes]:
    """The safetensors file of float32 `tensors` laid out as the library lays it out (tensors in name order,
    the header padded to 8 bytes), one tensor at a time: no second copy of the model in memory, and every
    byte written by `write_atomically`, which turns a full disk into one line. The metadata is written in
    key order: the library's own writer orders two or more keys at random, so its bytes would vary."""
    names = sorted(tensors)
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name in names:
        end = offset + tensors[name].size * 4
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    yield struct.pack("<Q", len(text)) + text
    for name in names:
        yield np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()


def _check_out(out: Path, force: bool) -> Path:
    """Where the export may go: a missing or empty directory, or with `force` a previous export of jgpt's
    holding nothing else. Never the working directory or one holding it, $HOME or the root, whose
    replacement would delete whatever they hold (`--out . --force` used to delete the current directory)."""
    output_directory(out, "out")
    if out.is_symlink():
        raise ApiError("out", f"{out} is a symbolic link; give a directory")
    target = Path(os.path.abspath(out))  # `.` and `..` spelled out, so that the name is the directory's own
    resolved = target.resolve()
    if Path.cwd().resolve().is_relative_to(resolved):
        raise ApiError("out", f"{out} is the current directory or holds it; give a new directory")
    if resolved in (Path(resolved.anchor), Path(os.path.expanduser("~")).resolve()):  # never raises, unlike home()
        raise ApiError("out", f"{out} is {resolved}; give a new directory")
    recover_replaced(target, is_export)
    if target.is_dir() and any(target.iterdir()):
        if not force:
            raise ApiError("out", f"{out} is not empty; --force replaces a previous export")
        if not is_export(target):
            raise ApiError(
                "out", f"{out} is not a previous export of jgpt's (or holds other files); --force replaces only one"
            )
    return target


def is_export(directory: Path) -> bool:
    """Whether `directory` holds what an export writes and nothing else: regular files of the export's names
    with config.json and a model.safetensors whose header carries the export's mark."""
    try:
        entries = list(directory.iterdir())
        if directory.is_symlink() or not entries:
            return False
        if not all(entry.name in EXPORT_FILES and stat.S_ISREG(entry.lstat().st_mode) for entry in entries):
            return False
        if not (directory / "config.json").is_file():
            return False
        with open(directory / WEIGHTS, "rb") as file:
            return file.read(len(_MARK) + 8)[8:] == _MARK
    except OSError:
        return False


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()
