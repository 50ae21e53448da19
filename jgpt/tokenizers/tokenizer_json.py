"""The Hugging Face tokenizer.json format, as both kinds of jgpt tokenizer read it, in pure Python.

A file is read within a size bound and parsed as JSON; its "model" must be a BPE whose pieces each
spell their bytes alone, and whose merges name pieces of the vocabulary. Every value the HF library
will read is type-checked before it sees the file: the library panics in Rust on some inconsistent
files (a merge whose result is not in the vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes
from jgpt.foundation.json_input import parse_json
from jgpt.tokenizers.framing import BYTE_COUNT

# The largest tokenizer file read: Llama 3's tokenizer.json is 9 MB; memory follows this bound.
FILE_LIMIT = 64 << 20


def _byte_level_alphabet() -> tuple[str, ...]:
    """The printable stand-in HF ByteLevel uses for each byte (the GPT-2 convention):
    visible Latin-1 characters stand for themselves, the rest shift to U+0100 onwards."""
    visible = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    hidden = iter(range(0x100, 0x200))
    return tuple(chr(b) if b in visible else chr(next(hidden)) for b in range(BYTE_COUNT))


BYTE_LEVEL_ALPHABET = _byte_level_alphabet()
BYTE_OF_CHAR = {char: b for b, char in enumerate(BYTE_LEVEL_ALPHABET)}


def read_limited(path: Path, field: str) -> bytes:
    """A tokenizer file's bytes, refused before reading when it is larger than FILE_LIMIT."""
    try:
        size = path.stat().st_size
    except OSError as error:
        raise ApiError(field, f"cannot read {path}: {error.strerror}") from None
    if size > FILE_LIMIT:
        raise ApiError(field, f"{path} has {size:,} bytes, more than the {FILE_LIMIT:,} a tokenizer file may have")
    return read_bytes(path, field)


def parse_tokenizer_json(document: bytes, source: str) -> Any:
    try:
        return parse_json(document, "tokenizer", source=source)
    except ApiError as error:
        raise ApiError("tokenizer", f"not a JSON tokenizer file: {error.reason}") from None


def bpe_model(spec: Any, reject: Callable[[str], ApiError]) -> dict:
    """The "model" object of a parsed tokenizer.json, checked to be a BPE whose pieces each spell their
    bytes alone (both kinds of tokenizer read only that)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        raise reject('has no "model" object')
    model = spec["model"]
    if (
        model.get("type") != "BPE"
        or not isinstance(model.get("vocab"), dict)
        or not isinstance(model.get("merges"), list)
        or model.get("dropout") is not None
    ):
        raise reject("jgpt reads BPE tokenizers: model must be BPE with a vocab object, a merges list and no dropout")
    if any(model.get(name) is not None for name in ("continuing_subword_prefix", "end_of_word_suffix")):
        raise reject("a piece must spell its bytes alone: no continuing_subword_prefix nor end_of_word_suffix")
    return model


def check_merges(model: dict, reject: Callable[[str], ApiError], control_markers: Collection[str] = ()) -> None:
    """Each merge of a BPE model: two pieces of the vocabulary whose join is in it too, and is none of
    `control_markers` (a merge spelling one would let text forge turn framing)."""
    for n, merge in enumerate(model["merges"]):
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(part, str) and part for part in pair):
            raise reject(f'merges[{n}] must be two pieces, as [left, right] or "left right", got {merge!r}')
        # (The ByteLevel split never puts "<|" and "user" in one word, so training cannot
        # learn such a merge; a hand-made file could.)
        if "".join(pair) in control_markers:
            raise reject("a merge spells a control marker, which would let text forge turn framing")
        missing = next((piece for piece in (*pair, "".join(pair)) if piece not in model["vocab"]), None)
        if missing is not None:
            raise reject(f"merges[{n}] {merge!r}: {missing!r} is not in the vocab")
