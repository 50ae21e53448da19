"""Export a jgpt ModelArtifact as a Hugging Face model directory (the inverse of jgpt/artifacts/hf_import.py).

Writes `config.json`, `generation_config.json`, `model.safetensors` and the tokenizer
(`tokenizer.json` with a `tokenizer_config.json`) so that transformers'
`AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load
it with nothing downloaded and no remote code: the GPT baseline as `GPT2LMHeadModel`
(learned positions, LayerNorm, GELU), the Llama alternative as `LlamaForCausalLM`
(rotary positions, RMSNorm, SwiGLU, grouped-query attention, Llama 3.1's scaled rotary
frequencies), as `MistralForCausalLM` with a sliding window, as `Qwen2ForCausalLM` with
query/key/value biases. Every head is written untied, so `jgpt import-hf` of the export
gives back the same `checkpoint_sha256`.

The tokenizer: an imported model's own files are written back as they came. jgpt's
byte tokenizer.json is written unchanged (its bytes are its identity) with a
tokenizer_config.json carrying, for a chat model (`prompt_format` "chat"), jgpt's framing
as a chat template, so that transformers' `apply_chat_template(messages,
add_generation_prompt=True)` gives jgpt's ids (a plain-text model gets none, and its typed
markers stay bytes); EOS and padding are TURN_END, and there is no BOS (`SpecialIds.of` says
why). Imported back, the template makes the model a chat model again, the config's absence
a plain one. A model without a
tokenizer exports jgpt's pure-byte one, which is what it reads.

The directory is staged next to `out` and renamed into place (jgpt/foundation/output_paths.py): a
reader never sees half an export, a full disk leaves nothing behind, and a signal cannot
fall between the two renames of a replacement. An existing non-empty directory is replaced
only with `force`, and only when it is a previous export: it holds nothing but the files an
export writes, and its model.safetensors carries the export's mark in its metadata.
"""

from __future__ import annotations

import dataclasses
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
from jgpt.tokenizers.framing import ROLES
from jgpt.tokenizers.hf_tokenizer import COMPANIONS
from jgpt.tokenizers.prompt_format import CHAT
from jgpt.tokenizers.tokenizer import Tokenizer

GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
FAMILY_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
WEIGHTS = "model.safetensors"
# What an export writes; `--force` replaces a directory holding these and nothing else.
EXPORT_FILES = frozenset({"config.json", "generation_config.json", WEIGHTS, "tokenizer.json", *COMPANIONS})
# transformers reads `format`; `jgpt_export` marks the directory as jgpt's own, which `--force` may replace.
EXPORT_METADATA = {"format": "pt", "jgpt_export": "jgpt-hf-export-v1"}
# The start of an export's safetensors header: its metadata comes first, in key order.
_MARK = json.dumps({"__metadata__": dict(sorted(EXPORT_METADATA.items()))}, separators=(",", ":")).encode()[:-1]


def gpt2_config(a: Architecture, tokens: SpecialIds) -> dict[str, Any]:
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
        **tokens.to_json(),
        "dtype": a.precision,
    }


def llama_family(a: LlamaArchitecture) -> str:
    """The transformers class that computes `a`: Qwen2 for query/key/value biases, Mistral for a sliding window,
    else Llama. Both at once no transformers class computes (Qwen2's window is per layer, and off in every
    released model), so that is refused."""
    if a.attention_bias and a.sliding_window is not None:
        raise ApiError(
            "sliding_window",
            f"{a.sliding_window} with attention_bias: no transformers class has both (Qwen2's biases, Mistral's window)",
        )
    return "Qwen2ForCausalLM" if a.attention_bias else "MistralForCausalLM" if a.sliding_window else "LlamaForCausalLM"


def llama_config(a: LlamaArchitecture, tokens: SpecialIds) -> dict[str, Any]:
    family = llama_family(a)
    rope = {"rope_type": "default", "rope_theta": a.rope_theta}
    if a.rope_scaling is not None:
        s = a.rope_scaling
        rope = {"rope_type": "llama3", "rope_theta": a.rope_theta, "factor": s.factor,
                "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_context}  # fmt: skip
    config = {
        "architectures": [family],
        "model_type": FAMILY_TYPES[family],
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
        "rope_parameters": rope,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        **tokens.to_json(),
        "dtype": a.precision,
    }
    if family == "MistralForCausalLM":
        config["sliding_window"] = a.sliding_window
    if family == "Qwen2ForCausalLM":  # its biases are the class's own, not a setting; no layer slides
        del config["attention_bias"], config["mlp_bias"]
        config |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": a.layers}
    return config


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
        if a.attention_bias:
            tensors |= {f"{layer}self_attn.{name}.bias": w[f"{ours}_bias"][i]
                        for name, ours in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"))}  # fmt: skip
    return tensors


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The token ids config.json and generation_config.json name: BOS (None: the model has none), EOS (where a
    reply ends and generation stops) and padding (None: none declared)."""

    bos: int | None
    eos: int
    pad: int | None

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> SpecialIds:
        """An imported tokenizer's own (its tokenizer_config.json's bos, eos and pad tokens). jgpt's: no BOS, since
        jgpt starts a sequence with nothing but its first token (a role marker, or a plain model's first text
        byte), so a BOS id would make transformers prepend a token the model never saw there; EOS is TURN_END;
        padding is TURN_END too, the usual choice for a model without a pad token, which batched generation in
        transformers needs (the attention mask hides it)."""
        from jgpt.tokenizers.hf_tokenizer import HFTokenizer

        if isinstance(tokenizer, HFTokenizer):
            return cls(tokenizer.special_id("bos_token"), tokenizer.eos_id, tokenizer.special_id("pad_token"))
        return cls(None, tokenizer.turn_end_id, tokenizer.turn_end_id)

    def to_json(self) -> dict[str, int | None]:
        return {"bos_token_id": self.bos, "eos_token_id": self.eos, "pad_token_id": self.pad}


def chat_template(tokenizer: Tokenizer) -> str:
    """jgpt's framing as a Hugging Face chat template: each message `[role marker] content [TURN_END]`, and with
    add_generation_prompt the assistant's marker, its turn left open. Rendered and tokenized by transformers
    (`apply_chat_template`), it gives exactly jgpt's ids: the markers are the tokenizer's special tokens, which
    split the text into the turns' own, each NFC-normalized and encoded as jgpt encodes it."""
    markers = {role: tokenizer.token(tokenizer.role_id(role)).piece for role in ROLES}
    turn_end = tokenizer.token(tokenizer.turn_end_id).piece
    roles = ", ".join(ROLES)
    return (
        f"{{%- set markers = {json.dumps(markers)} -%}}"
        "{%- for message in messages -%}"
        "{%- if message.role not in markers -%}"
        f"{{{{- raise_exception('jgpt frames the roles {roles}, not ' + message.role) -}}}}"
        "{%- elif message.content is not string -%}"
        "{{- raise_exception('a message content must be text') -}}"
        "{%- endif -%}"
        f"{{{{- markers[message.role] + message.content + {json.dumps(turn_end)} -}}}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- markers.assistant -}}{%- endif -%}"
    )


def tokenizer_files(tokenizer: Tokenizer, context: int, prompt_format: str) -> dict[str, bytes]:
    """The tokenizer's files for transformers: an imported one's own, or jgpt's with a config declaring it, whose
    chat template is jgpt's framing where the model is a chat model (`prompt_format` "chat")."""
    from jgpt.tokenizers.hf_tokenizer import HFTokenizer

    if isinstance(tokenizer, HFTokenizer):
        return {"tokenizer.json": tokenizer.document, **dict(tokenizer.companions)}
    eos = tokenizer.token(tokenizer.turn_end_id).piece
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "pad_token": eos,
        # A plain-text model frames nothing: typed "<|user|>" is its bytes in transformers too, as in jgpt.
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
    }
    if prompt_format == CHAT:
        # The chat template's markers must be read as the special ids they are, so special tokens are not split:
        # as in every Hugging Face chat model, typed "<|user|>" is the control id unless the caller splits it
        # (`tokenizer(text, split_special_tokens=True)`, `apply_chat_template(..., sanitize_control_tokens=True)`).
        config |= {"chat_template": chat_template(tokenizer), "split_special_tokens": False}
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
    tokens = SpecialIds.of(tokenizer)
    tensors = (llama_tensors if llama else gpt2_tensors)(weights, a)
    config = (llama_config if llama else gpt2_config)(a, tokens)
    files = {
        "config.json": _json(config),
        "generation_config.json": _json({**tokens.to_json(), "do_sample": False}),
        **tokenizer_files(tokenizer, a.context, artifact.prompt_format),
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
