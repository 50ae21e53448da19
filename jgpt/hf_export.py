"""Export a jgpt ModelArtifact as a Hugging Face model directory (the inverse of jgpt/hf_import.py).

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

The directory is staged next to `out` and renamed into place: a reader never sees half
an export, and an existing non-empty directory is replaced only with `force`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from jgpt.architecture import Architecture, LlamaArchitecture
from jgpt.errors import ApiError
from jgpt.identity import write_atomically
from jgpt.output_paths import output_directory
from jgpt.tokenizer import Tokenizer

GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}


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
    from jgpt.hf_tokenizer import HFTokenizer

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
    from safetensors.numpy import save_file

    from jgpt.catalog import load_model

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
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_file(
            {name: np.ascontiguousarray(t) for name, t in tensors.items()},
            staging / "model.safetensors",
            metadata={"format": "pt"},
        )
        for name, data in files.items():
            write_atomically(staging / name, data)
        staging.chmod(0o755)  # mkdtemp makes it private; an export is meant to be shared
        _replace(target, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _check_out(out: Path, force: bool) -> Path:
    output_directory(out, "out")
    if out.is_symlink():
        raise ApiError("out", f"{out} is a symbolic link; give a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ApiError("out", f"{out} is not empty; --force replaces it")
    return out.absolute()


def _replace(target: Path, staging: Path) -> None:
    """The old directory leaves only once the new one is complete."""
    if not target.exists():
        staging.rename(target)
        return
    retired = staging.with_name(f"{staging.name}.replaced")
    target.rename(retired)
    staging.rename(target)
    shutil.rmtree(retired)


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()
