"""The vocabulary of a foreign Hugging Face tokenizer.json: the bytes each id spells, checked before the
library reads the file. Two BPE kinds are read:

    byte-level        GPT-2's: every vocabulary piece spells bytes through the ByteLevel alphabet
    byte-fallback     Llama's (SentencePiece converted): "▁" spells a space, "<0xNN>" the byte NN

Added tokens join the vocabulary: a special one is framing and spells no text bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import is_integer
from jgpt.tokenizers.framing import is_unicode
from jgpt.tokenizers.tokenizer_json import BYTE_OF_CHAR, bpe_model, check_merges

FALLBACK_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def hf_pieces(spec: Any, source: str) -> tuple[tuple[bytes, ...], dict[int, str], int, np.ndarray]:
    """Check a parsed foreign tokenizer.json; return the bytes each id spells, the special tokens,
    the merge count and which ids are byte-fallback pieces. Every value the library reads is type-checked
    first (it panics in Rust on some inconsistent files, such as a merge whose parts are not in the vocabulary)."""

    def reject(reason: str) -> ApiError:
        return ApiError("tokenizer", f"{source}: {reason}")

    model = bpe_model(spec, reject)
    vocab = model["vocab"]
    if not all(is_integer(token_id) and token_id >= 0 for token_id in vocab.values()):
        raise reject("vocab ids must be non-negative integers")
    added = _added_tokens(spec, reject)
    check_merges(model, reject)
    byte_level = _is_byte_level(spec, model, reject)
    by_id: dict[int, bytes] = {}
    for piece, token_id in vocab.items():
        if token_id in by_id:
            raise reject(f"vocab id {token_id} is given to more than one piece")
        by_id[token_id] = _spelled(piece, byte_level, reject)
    by_id, specials = _with_added_tokens(by_id, added, vocab, reject)
    if set(by_id) != set(range(len(by_id))):
        raise reject(f"vocab and added token ids must run from 0 to {len(by_id) - 1} without gaps")
    fallback = np.zeros(len(by_id), dtype=bool)
    if not byte_level:
        fallback[[token_id for piece, token_id in vocab.items() if FALLBACK_PIECE.fullmatch(piece)]] = True
    return tuple(by_id[token_id] for token_id in range(len(by_id))), specials, len(model["merges"]), fallback


def _added_tokens(spec: dict[str, Any], reject: Callable[[str], ApiError]) -> list[dict[str, Any]]:
    """The file's added_tokens, each checked to have the fields the library reads, typed."""
    added = spec.get("added_tokens", [])
    if not isinstance(added, list) or not all(
        isinstance(token, dict)
        and is_integer(token.get("id"))
        and token["id"] >= 0
        and isinstance(token.get("content"), str)
        and token["content"]
        and isinstance(token.get("special", False), bool)
        for token in added
    ):
        raise reject(
            "added_tokens must be a list of objects with an integer id, a content string and a boolean special"
        )
    return added


def _is_byte_level(spec: dict[str, Any], model: dict[str, Any], reject: Callable[[str], ApiError]) -> bool:
    """Whether the file is byte-level BPE (GPT-2's) rather than byte-fallback BPE (Llama's); any other is refused."""
    byte_level = not model.get("byte_fallback") and _declares(spec.get("decoder"), "ByteLevel")
    if not byte_level and not (model.get("byte_fallback") is True and _declares(spec.get("decoder"), "ByteFallback")):
        raise reject(
            "jgpt reads byte-level BPE (GPT-2's ByteLevel) and byte-fallback BPE (Llama's), "
            "where every piece spells known bytes"
        )
    return byte_level


def _with_added_tokens(
    by_id: dict[int, bytes], added: list[dict[str, Any]], vocab: dict[str, int], reject: Callable[[str], ApiError]
) -> tuple[dict[int, bytes], dict[int, str]]:
    """The bytes each id spells once the added tokens join the vocabulary's, and the special ones by id:
    a special token is framing and spells no text bytes; another spells its UTF-8 where the vocab has no piece."""
    by_id, specials = dict(by_id), {}
    for token in added:
        if token["id"] in by_id and token["content"] not in vocab:
            raise reject(
                f"added token {token['content']!r} takes id {token['id']}, which the vocab gives another piece"
            )
        if not is_unicode(token["content"]):
            raise reject(f"added token {token['content']!r} is not valid Unicode (a lone surrogate)")
        if token.get("special", False):
            specials[token["id"]] = token["content"]
            by_id[token["id"]] = b""
        else:
            by_id.setdefault(token["id"], token["content"].encode("utf-8"))
    return by_id, specials


def _spelled(piece: str, byte_level: bool, reject: Callable[[str], ApiError]) -> bytes:
    if not piece:
        raise reject("the vocab has an empty piece")
    if not is_unicode(piece):
        raise reject(f"vocab entry {piece!r} is not valid Unicode (a lone surrogate)")
    if byte_level:
        if not all(char in BYTE_OF_CHAR for char in piece):
            raise reject(f"vocab entry {piece!r} is not a byte-level piece")
        return bytes(map(BYTE_OF_CHAR.__getitem__, piece))
    fallback = FALLBACK_PIECE.fullmatch(piece)
    return bytes([int(fallback[1], 16)]) if fallback else piece.replace("\u2581", " ").encode("utf-8")


def _declares(component: Any, kind: str) -> bool:
    """Whether a decoder (or a Sequence of them) includes one of type `kind`."""
    if not isinstance(component, dict):
        return False
    parts = component.get("decoders") if component.get("type") == "Sequence" else [component]
    return isinstance(parts, list) and any(isinstance(part, dict) and part.get("type") == kind for part in parts)
