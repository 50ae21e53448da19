"""The Tokenizer: a byte-level vocabulary with turn framing and optional BPE merges.

Vocabulary layout (fixed across jgpt):

    0..255    the raw bytes, id == byte value
    256..258  role markers <|system|>, <|user|>, <|assistant|>
    259       TURN_END <|turn_end|>
    260..     learned byte-level BPE merges, in merge order

A turn is framed as `[role marker] text-tokens [TURN_END]`. Text is NFC-normalized
before encoding; the normalization is declared in the tokenizer file, so it is part
of `tokenizer_sha256`. The file is a standard Hugging Face `tokenizer.json`;
merges are learned and applied by HF `tokenizers`. With zero merges the ids are the
UTF-8 bytes themselves, so that path needs no library call.

Control tokens exist only as ids: text that happens to read "<|user|>" is encoded
as its bytes, so user text can never forge framing.

`Tokenizer.load` also reads a Hugging Face tokenizer.json that is not jgpt's layout (an
imported model's own): it returns an `HFTokenizer` (jgpt/tokenizers/hf_tokenizer.py), which keeps
this interface and uses that file as is.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import tokenizers

from jgpt.foundation.errors import ApiError, library_failure
from jgpt.foundation.identity import read_bytes, sha256_json, write_atomically
from jgpt.foundation.json_input import parse_json
from jgpt.foundation.validation import LIMIT, is_integer
from jgpt.tokenizers.encoding import Encoding, Span, control_span, text_spans

ROLES = ("system", "user", "assistant")
BYTE_COUNT = 256
ROLE_IDS = {role: BYTE_COUNT + n for n, role in enumerate(ROLES)}
TURN_END_ID = BYTE_COUNT + len(ROLES)
FIRST_MERGE_ID = TURN_END_ID + 1
CONTROL_MARKERS = {**{ROLE_IDS[role]: f"<|{role}|>" for role in ROLES}, TURN_END_ID: "<|turn_end|>"}

NORMALIZATION: Final = "NFC"
CODEC_VERSION = "jgpt-byte-bpe/1"
# The largest tokenizer file read: Llama 3's tokenizer.json is 9 MB; memory follows this bound.
FILE_LIMIT = 64 << 20


def _byte_level_alphabet() -> tuple[str, ...]:
    """The printable stand-in HF ByteLevel uses for each byte (the GPT-2 convention):
    visible Latin-1 characters stand for themselves, the rest shift to U+0100 onwards."""
    visible = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    hidden = iter(range(0x100, 0x200))
    return tuple(chr(b) if b in visible else chr(next(hidden)) for b in range(BYTE_COUNT))


BYTE_LEVEL_ALPHABET = _byte_level_alphabet()
_BYTE_OF_CHAR = {char: b for b, char in enumerate(BYTE_LEVEL_ALPHABET)}


@dataclass(frozen=True)
class Turn:
    """One role-tagged conversation input."""

    role: str  # system | user | assistant
    text: str

    def __post_init__(self):
        if self.role not in ROLE_IDS:
            raise ApiError("role", f"unknown role {self.role!r}; choose one of {', '.join(ROLES)}")
        if not isinstance(self.text, str):
            raise ApiError("text", f"must be a string, got {type(self.text).__name__}")


@dataclass(frozen=True)
class Token:
    """One vocabulary entry, described for display.

    kind: "byte" | "merge" | "control". piece: the entry as text, with `<0xNN>` for
    bytes that are not whole UTF-8 characters. group: "turn framing" for controls;
    for bytes "ascii", "utf-8 lead", "utf-8 continuation" or "never in utf-8"; for
    merges "whole characters" or "partial characters".
    """

    id: int
    kind: str
    piece: str
    group: str


@dataclass(frozen=True)
class Decoded:
    """Text for a sequence of ids. `note` (the decoding_note) is None exactly when the
    bytes were valid UTF-8; control tokens appear as their markers, e.g. <|turn_end|>."""

    text: str
    note: str | None
    pending: bytes = b""  # a valid UTF-8 prefix held back at the end when final=False


@dataclass(frozen=True)
class PieceTable:
    """The bytes each id spells, laid out for vectorized lookups (controls spell b"")."""

    pieces: tuple[bytes, ...]  # [vocab]
    lengths: np.ndarray  # [vocab] int64
    starts: np.ndarray  # [vocab] int64 offset of each piece in `flat`
    flat: np.ndarray  # [sum(lengths)] uint8, all pieces back to back

    @classmethod
    def of(cls, pieces: tuple[bytes, ...]) -> PieceTable:
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        flat = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        return cls(pieces, lengths, np.cumsum(lengths) - lengths, flat)

    def bytes_of(self, ids: np.ndarray) -> bytes:
        """The concatenated bytes of ids: one gather over `flat`, no loop over tokens."""
        lengths = self.lengths[ids]  # [n]
        output_starts = np.cumsum(lengths) - lengths  # [n] where each piece lands in the output
        shift = np.repeat(self.starts[ids] - output_starts, lengths)  # [total] flat offset minus output offset
        return self.flat[shift + np.arange(shift.size)].tobytes()


@dataclass(frozen=True, repr=False)
class Tokenizer:
    """An identified vocabulary and codec. Build with bytes_only, train or load."""

    document: bytes  # the exact tokenizer.json bytes
    tokenizer_sha256: str
    context_limit: int | None
    table: PieceTable = field(compare=False)  # derived from document
    _library: tokenizers.Tokenizer | None = field(compare=False)  # None: pure bytes

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, tokenizer_sha256={self.tokenizer_sha256[:16]}..., "
            f"context_limit={self.context_limit})"
        )

    # ---- construction -------------------------------------------------------------

    @classmethod
    def bytes_only(cls, context_limit: int | None = None) -> Tokenizer:
        """Zero merges: vocabulary 260, every text id is a UTF-8 byte."""
        return cls._from_document(_document(merges=[]), context_limit)

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2, context_limit: int | None = None
    ) -> Tokenizer:
        """Learn byte-level BPE merges with HF tokenizers until the vocabulary reaches
        vocab_size (fewer when no pair occurs min_frequency times)."""
        if isinstance(texts, str):
            raise ApiError("texts", "must be an iterable of strings, not one string")
        if not isinstance(vocab_size, int) or vocab_size < FIRST_MERGE_ID:
            raise ApiError(
                "vocab_size", f"must be an integer >= {FIRST_MERGE_ID} (bytes plus control tokens), got {vocab_size!r}"
            )
        if not is_integer(min_frequency) or not 1 <= min_frequency <= LIMIT:
            raise ApiError("min_frequency", f"must be an integer in [1, 2^53], got {min_frequency!r}")
        learner = tokenizers.Tokenizer(tokenizers.models.BPE())
        learner.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size - len(CONTROL_MARKERS),
            min_frequency=min_frequency,
            initial_alphabet=list(BYTE_LEVEL_ALPHABET),
            show_progress=False,
        )
        learner.train_from_iterator((normalize(text, "texts") for text in texts), trainer=trainer)
        merges = [tuple(pair) for pair in json.loads(learner.to_str())["model"]["merges"]]
        return cls._from_document(_document(merges), context_limit)

    @classmethod
    def load(cls, path: str | os.PathLike, context_limit: int | None = None) -> Tokenizer:
        """jgpt's own tokenizer file, or any other Hugging Face tokenizer.json as an HFTokenizer
        (with the tokenizer_config.json beside it, as Hugging Face saves them)."""
        document = read_limited(Path(path), "tokenizer")
        spec = _parse(document, str(path))
        if _is_jgpt_layout(spec):
            return Tokenizer._from_spec(document, spec, context_limit, str(path))
        from jgpt.tokenizers.hf_tokenizer import HFTokenizer

        return HFTokenizer.of(document, spec, Path(path).parent, context_limit, str(path))

    @classmethod
    def _from_document(cls, document: bytes, context_limit: int | None, source: str = "tokenizer") -> Tokenizer:
        return cls._from_spec(document, _parse(document, source), context_limit, source)

    @classmethod
    def _from_spec(cls, document: bytes, spec: Any, context_limit: int | None, source: str) -> Tokenizer:
        check_context_limit(context_limit)
        pieces = _pieces_of(spec, source)
        merges = spec["model"]["merges"]
        # The runtime copy drops the controls and the normalizer: controls are framing ids,
        # never matched in text, and NFC is applied once in Python (see `normalize`).
        text_vocab = {
            piece: token_id for piece, token_id in spec["model"]["vocab"].items() if token_id not in CONTROL_MARKERS
        }
        runtime = {**spec, "added_tokens": [], "normalizer": None, "model": {**spec["model"], "vocab": text_vocab}}
        try:
            library = tokenizers.Tokenizer.from_str(json.dumps(runtime)) if merges else None
        except BaseException as error:  # its own exception types, or a Rust panic on what _pieces_of missed
            if not library_failure(error):
                raise
            raise ApiError("tokenizer", f"{source}: HF tokenizers rejects it: {error}") from None
        return cls(document, hashlib.sha256(document).hexdigest(), context_limit, PieceTable.of(pieces), library)

    def with_context_limit(self, context_limit: int | None) -> Tokenizer:
        check_context_limit(context_limit)
        return replace(self, context_limit=context_limit)

    def save(self, path: str | os.PathLike) -> None:
        """Write the exact file bytes (so tokenizer_sha256 holds), atomically."""
        write_atomically(Path(path), self.document)

    # ---- vocabulary -------------------------------------------------------------------

    @property
    def pieces(self) -> tuple[bytes, ...]:
        """The bytes each id spells; b"" for control tokens."""
        return self.table.pieces

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @property
    def merge_count(self) -> int:
        return self.vocab_size - FIRST_MERGE_ID

    @property
    def turn_end_id(self) -> int:
        return TURN_END_ID

    def role_id(self, role: str) -> int:
        if role not in ROLE_IDS:
            raise ApiError("role", f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
        return ROLE_IDS[role]

    def token(self, token_id: int) -> Token:
        if not 0 <= token_id < self.vocab_size:
            raise ApiError("id", f"{token_id} is not in the vocabulary of {self.vocab_size}")
        if token_id in CONTROL_MARKERS:
            return Token(token_id, "control", CONTROL_MARKERS[token_id], "turn framing")
        return describe_piece(token_id, self.pieces[token_id], merge=token_id >= FIRST_MERGE_ID)

    @property
    def manifest(self) -> dict[str, Any]:
        """Everything that determines an encoding: its sha256 is Encoding.manifest_sha256."""
        return {
            "codec_version": CODEC_VERSION,
            "context_limit": self.context_limit,
            "control_tokens": {marker: token_id for token_id, marker in CONTROL_MARKERS.items()},
            "normalization": NORMALIZATION,
            "tokenizer_sha256": self.tokenizer_sha256,
            "unicode_version": unicodedata.unidata_version,
            "vocab_size": self.vocab_size,
        }

    # ---- encoding ---------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Ids of the NFC-normalized UTF-8 of text, without framing."""
        return self._encode_normalized([normalize(text, "text")])[0]

    def _encode_normalized(self, texts: list[str]) -> list[list[int]]:
        if self._library is None:
            return [list(text.encode("utf-8")) for text in texts]
        return [encoding.ids for encoding in self._library.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_turns(self, turns: Sequence[Turn], *, open_turn: str | None = None) -> Encoding:
        """Frame turns as [role] text [TURN_END] each; open_turn appends one more role
        marker without TURN_END: the prompt from which that role's reply is generated."""
        if open_turn is not None:
            self.role_id(open_turn)
        if not_turns := [n for n, turn in enumerate(turns) if not isinstance(turn, Turn)]:
            raise ApiError(f"turns[{not_turns[0]}]", f"must be a Turn, got {type(turns[not_turns[0]]).__name__}")
        texts = [normalize(turn.text, f"turns[{n}].text") for n, turn in enumerate(turns)]
        sources = [text.encode("utf-8") for text in texts]
        ids: list[int] = []
        spans: list[Span] = []
        byte_offset = 0
        for n, (turn, source, text_ids) in enumerate(zip(turns, sources, self._encode_normalized(texts))):
            spans.append(control_span(ROLE_IDS[turn.role], len(ids), n))
            ids.append(ROLE_IDS[turn.role])
            spans += text_spans(
                np.asarray(text_ids, dtype=np.int64),
                source,
                self.table.lengths,
                first_merge_id=FIRST_MERGE_ID,
                token_offset=len(ids),
                byte_offset=byte_offset,
                turn=n,
            )
            ids += text_ids
            spans.append(control_span(TURN_END_ID, len(ids), n))
            ids.append(TURN_END_ID)
            byte_offset += len(source)
        if open_turn is not None:
            spans.append(control_span(ROLE_IDS[open_turn], len(ids), len(turns)))
            ids.append(ROLE_IDS[open_turn])
        return self._encoding(ids, spans, turns, texts, open_turn)

    def _encoding(
        self, ids: list[int], spans: list[Span], turns: Sequence[Turn], texts: list[str], open_turn: str | None
    ) -> Encoding:
        """The Encoding of encoded turns (either kind of tokenizer), refused past the context limit."""
        if self.context_limit is not None and len(ids) > self.context_limit:
            raise ApiError(
                "context_limit",
                f"the input encodes to {len(ids)} token ids, more than the context_limit of {self.context_limit}",
            )
        canonical_input = {
            "open_turn": open_turn,
            "turns": [{"role": turn.role, "text": text} for turn, text in zip(turns, texts)],
        }
        manifest = self.manifest
        return Encoding(
            ids=tuple(ids),
            spans=tuple(spans),
            input_sha256=sha256_json(canonical_input),
            input_kind="conversation" if open_turn is None else "generation prompt",
            manifest_sha256=sha256_json(manifest),
            context_limit=self.context_limit,
            codec_version=manifest["codec_version"],
            unicode_version=manifest["unicode_version"],
        )

    # ---- decoding ---------------------------------------------------------------------

    def decode(self, ids: Sequence[int], *, final: bool = True) -> Decoded:
        """Text for ids, control tokens as markers and malformed bytes as <0xNN>.

        With final=False (generation still running) a valid but unfinished UTF-8
        sequence at the very end is no error: it is returned as `pending`.
        """
        checked = self._id_array(ids)
        # Runs of text tokens between control tokens decode independently: a control
        # token cuts any character still open before it.
        controls = np.flatnonzero((checked >= BYTE_COUNT) & (checked < FIRST_MERGE_ID)).tolist()
        parts: list[str] = []
        notes: list[str] = []
        pending = b""
        for start, stop in zip([0, *(c + 1 for c in controls)], [*controls, checked.size]):
            run = checked[start:stop]
            hold = not final and stop == checked.size
            text, problem, pending = utf8_with_markers(self.table.bytes_of(run), hold)
            parts.append(text)
            if stop < checked.size:
                parts.append(CONTROL_MARKERS[int(checked[stop])])
            if problem:
                reason, byte = problem
                position = start + int(np.searchsorted(np.cumsum(self.table.lengths[run]), byte, side="right"))
                notes.append(f"{reason} in the token at position {position}")
        return Decoded("".join(parts), "; ".join(notes) or None, pending)

    def _id_array(self, ids: Sequence[int]) -> np.ndarray:
        """ids as int64 [n], each checked to be in the vocabulary."""
        array = np.asarray(ids)
        if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
            raise ApiError("ids", f"must be a flat sequence of integers, got shape {array.shape} of {array.dtype}")
        array = array.astype(np.int64, copy=False)  # also types an empty sequence
        out_of_range = np.flatnonzero((array < 0) | (array >= self.vocab_size))
        if out_of_range.size:
            n = int(out_of_range[0])
            raise ApiError("ids", f"id {int(array[n])} at position {n} is not in the vocabulary of {self.vocab_size}")
        return array


def describe_piece(token_id: int, piece: bytes, *, merge: bool) -> Token:
    """A text token's entry: a merge (or any piece of several bytes), or one byte grouped by its UTF-8 role."""
    text, problem, _ = utf8_with_markers(piece)
    if merge:
        return Token(token_id, "merge", text, "partial characters" if problem else "whole characters")
    byte = piece[0]
    group = (
        "ascii"
        if byte < 0x80
        else "utf-8 continuation"
        if byte < 0xC0
        else "utf-8 lead"
        if 0xC2 <= byte <= 0xF4
        else "never in utf-8"
    )
    return Token(token_id, "byte", text, group)


def read_limited(path: Path, field: str) -> bytes:
    """A tokenizer file's bytes, refused before reading when it is larger than FILE_LIMIT."""
    try:
        size = path.stat().st_size
    except OSError as error:
        raise ApiError(field, f"cannot read {path}: {error.strerror}") from None
    if size > FILE_LIMIT:
        raise ApiError(field, f"{path} has {size:,} bytes, more than the {FILE_LIMIT:,} a tokenizer file may have")
    return read_bytes(path, field)


def _parse(document: bytes, source: str) -> Any:
    try:
        return parse_json(document, "tokenizer", source=source)
    except ApiError as error:
        raise ApiError("tokenizer", f"not a JSON tokenizer file: {error.reason}") from None


def _is_jgpt_layout(spec: Any) -> bool:
    """A file that declares any of jgpt's control tokens at its id is jgpt's (and checked as such)."""
    added = spec.get("added_tokens") if isinstance(spec, dict) else None
    return isinstance(added, list) and any(
        CONTROL_MARKERS.get(token["id"]) == token.get("content")
        for token in added
        if isinstance(token, dict) and is_integer(token.get("id"))
    )


def check_context_limit(context_limit: Any) -> None:
    if context_limit is not None and (not is_integer(context_limit) or context_limit < 1):
        raise ApiError("context_limit", f"must be a positive integer or None, got {context_limit!r}")


def normalize(text: str, field_name: str) -> str:
    """NFC-normalize text, rejecting what has no UTF-8 (lone surrogates, e.g. from
    undecodable command-line bytes)."""
    if not isinstance(text, str):
        raise ApiError(field_name, f"must be a string, got {type(text).__name__}")
    normalized = unicodedata.normalize(NORMALIZATION, text)
    try:
        normalized.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ApiError(
            field_name,
            f"is not valid Unicode: lone surrogate U+{ord(error.object[error.start]):04X} "
            f"at character {error.start} (undecodable input bytes?)",
        ) from None
    return normalized


def turns_from_json(value: Any, field_name: str = "turns") -> tuple[Turn, ...]:
    """Turns from a parsed JSON list of {"role", "text"} objects."""
    if not isinstance(value, list):
        raise ApiError(field_name, f'must be a JSON list of {{"role", "text"}} objects, got {_json_type(value)}')
    turns = []
    for n, item in enumerate(value):
        where = f"{field_name}[{n}]"
        if not isinstance(item, dict):
            raise ApiError(where, f'must be an object with "role" and "text", got {_json_type(item)}')
        for key in ("role", "text"):
            if not isinstance(item.get(key), str):
                reason = "missing" if key not in item else f"must be a string, got {_json_type(item[key])}"
                raise ApiError(f"{where}.{key}", reason)
        if unknown := set(item) - {"role", "text"}:
            raise ApiError(where, f'unknown fields {sorted(unknown)}; a turn has only "role" and "text"')
        try:
            turns.append(Turn(item["role"], item["text"]))
        except ApiError as error:
            raise ApiError(f"{where}.{error.field}", error.reason) from None
    return tuple(turns)


def _json_type(value: Any) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def utf8_with_markers(data: bytes, hold_pending: bool = False) -> tuple[str, tuple[str, int] | None, bytes]:
    """Decode UTF-8, writing each byte that is not part of a valid character as <0xNN>.

    Returns (text, problem, pending). problem is None for valid UTF-8, else a
    description of the first malformed sequence and its byte offset. With
    hold_pending an unfinished but valid sequence at the end is returned as pending
    bytes, not as a problem. Linear in len(data), however many bytes are malformed.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")  # bad byte b -> U+DC00+b
    text = decoder.decode(data, final=not hold_pending)
    pending = decoder.getstate()[0]
    escaped = len(_ESCAPED_BYTE.findall(text))
    if not escaped:
        return text, None, pending
    try:
        data[: len(data) - len(pending)].decode("utf-8")
    except UnicodeDecodeError as error:  # always raised: it names the first malformed sequence
        bad = error.object[error.start : error.end]
        kind = "incomplete" if error.reason == "unexpected end of data" else "malformed"
        others = f", {escaped} bad bytes in all" if escaped > len(bad) else ""
        problem = f"{kind} UTF-8 ({error.reason}: {' '.join(f'0x{b:02X}' for b in bad)}{others})", error.start
    return _ESCAPED_BYTE.sub(lambda match: f"<0x{ord(match[0]) - 0xDC00:02X}>", text), problem, pending


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


# GPT-2's split of text into words, spaces and punctuation before merging; no prefix space,
# so the ids of a text are exactly its bytes' pieces.
PRE_TOKENIZER = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def _document(merges: list[tuple[str, str]]) -> bytes:
    """The canonical tokenizer.json for a merge list: fixed key order, compact
    separators, UTF-8, so the same merges always give the same bytes and sha256.

    The control markers sit in the model vocabulary too, so that plain HF loading
    gives them ids 256..259 (added tokens missing from the vocabulary get new ids).
    """
    vocab = {char: b for b, char in enumerate(BYTE_LEVEL_ALPHABET)}
    vocab |= {marker: token_id for token_id, marker in CONTROL_MARKERS.items()}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": token_id,
                "content": marker,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for token_id, marker in CONTROL_MARKERS.items()
        ],
        "normalizer": {"type": NORMALIZATION},
        "pre_tokenizer": PRE_TOKENIZER,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [list(pair) for pair in merges],
        },
    }
    return (json.dumps(spec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


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


def _pieces_of(spec: Any, source: str) -> tuple[bytes, ...]:
    """Check that a parsed tokenizer.json has jgpt's layout; return the bytes of each id.

    Every value the HF library will read is type-checked here first: the library panics
    in Rust on some inconsistent files (a merge whose result is not in the vocabulary).
    """

    def reject(reason: str) -> ApiError:
        return ApiError("tokenizer", f"{source}: {reason}")

    model = bpe_model(spec, reject)
    if not isinstance(spec.get("normalizer"), dict) or spec["normalizer"].get("type") != NORMALIZATION:
        raise reject(f"must declare the {NORMALIZATION} normalizer")
    pre_tokenizer = spec.get("pre_tokenizer")
    if (
        not isinstance(pre_tokenizer, dict)
        or pre_tokenizer.get("type") != "ByteLevel"
        or pre_tokenizer.get("add_prefix_space")
    ):
        raise reject("must use the ByteLevel pre-tokenizer without add_prefix_space")
    added = spec.get("added_tokens")
    if not isinstance(added, list) or not all(isinstance(token, dict) for token in added):
        raise reject("added_tokens must be a list of objects")
    controls = {token.get("id"): token.get("content") for token in added if isinstance(token.get("id"), int)}
    if (
        len(controls) != len(added)
        or controls != CONTROL_MARKERS
        or any(model["vocab"].get(marker) != token_id for token_id, marker in CONTROL_MARKERS.items())
    ):
        raise reject(f"added_tokens and vocab must hold exactly the control tokens {CONTROL_MARKERS}")
    by_id: dict[int, bytes] = {}
    for piece, token_id in model["vocab"].items():
        if not piece or not is_integer(token_id) or not all(char in _BYTE_OF_CHAR for char in piece):
            raise reject(f"vocab entry {piece!r} is not a byte-level piece with an integer id")
        if token_id in by_id:
            raise reject(f"vocab id {token_id} is given to more than one piece")
        by_id[token_id] = b"" if token_id in CONTROL_MARKERS else bytes(map(_BYTE_OF_CHAR.__getitem__, piece))
    for n, merge in enumerate(model["merges"]):
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(part, str) and part for part in pair):
            raise reject(f'merges[{n}] must be two pieces, as [left, right] or "left right", got {merge!r}')
        # (The ByteLevel split never puts "<|" and "user" in one word, so training cannot
        # learn such a merge; a hand-made file could.)
        if "".join(pair) in CONTROL_MARKERS.values():
            raise reject("a merge spells a control marker, which would let text forge turn framing")
        missing = next((piece for piece in (*pair, "".join(pair)) if piece not in model["vocab"]), None)
        if missing is not None:
            raise reject(f"merges[{n}] {merge!r}: {missing!r} is not in the vocab")
    if any(by_id.get(b) != bytes([b]) for b in range(BYTE_COUNT)):
        raise reject("ids 0..255 must be the single bytes 0..255")
    if set(by_id) != set(range(len(by_id))):
        raise reject(f"vocab ids must run from 0 to {len(by_id) - 1} without gaps")
    return tuple(by_id[token_id] for token_id in range(len(by_id)))
