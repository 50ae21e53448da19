"""The Tokenizer: jgpt's byte-level vocabulary with turn framing and optional BPE merges.

The vocabulary layout and the framing of a turn, `[role marker] text-tokens [TURN_END]`, are
jgpt.tokenizers.framing's. Text is NFC-normalized before encoding; the normalization is declared
in the tokenizer file, so it is part of `tokenizer_sha256`. The file is a standard Hugging Face
`tokenizer.json`; merges are learned and applied by HF `tokenizers`. With zero merges the ids are
the UTF-8 bytes themselves, so that path needs no library call.

Control tokens exist only as ids: text that happens to read "<|user|>" is encoded
as its bytes, so user text can never forge framing.

A file on disk is read by `jgpt.tokenizers.tokenizer_file.load_tokenizer`, which returns this
Tokenizer for jgpt's layout and an `HFTokenizer` for any other.
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from jgpt.foundation.errors import ApiError, library_failure
from jgpt.foundation.identity import write_atomically
from jgpt.foundation.validation import LIMIT, is_integer
from jgpt.tokenizers.encoding import Encoding, Span, check_context_limit, control_span, encoding_of, text_spans
from jgpt.tokenizers.framing import (
    BYTE_COUNT,
    CONTROL_MARKERS,
    FIRST_MERGE_ID,
    NORMALIZATION,
    ROLE_IDS,
    ROLES,
    TURN_END_ID,
    Turn,
    normalize,
)
from jgpt.tokenizers.incremental_decoder import IncrementalDecoder, PieceDecoder
from jgpt.tokenizers.tokenizer_json import (
    BYTE_LEVEL_ALPHABET,
    BYTE_OF_CHAR,
    bpe_model,
    check_merges,
    parse_tokenizer_json,
)
from jgpt.tokenizers.utf8_markers import utf8_with_markers
from jgpt.tokenizers.vocabulary import Decoded, PieceTable, Token, checked_ids, describe_piece

CODEC_VERSION = "jgpt-byte-bpe/1"


@dataclass(frozen=True, repr=False)
class Tokenizer:
    """An identified vocabulary and codec. Build with bytes_only or train; read a file with load_tokenizer."""

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
    def _from_document(cls, document: bytes, context_limit: int | None, source: str = "tokenizer") -> Tokenizer:
        return cls.from_spec(document, parse_tokenizer_json(document, source), context_limit, source)

    @classmethod
    def from_spec(cls, document: bytes, spec: Any, context_limit: int | None, source: str) -> Tokenizer:
        """A tokenizer file's exact bytes and their parse, checked to have jgpt's layout."""
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
        return encoding_of(ids, spans, turns, texts, open_turn, self.manifest)

    # ---- decoding ---------------------------------------------------------------------

    def decode(self, ids: Sequence[int], *, final: bool = True) -> Decoded:
        """Text for ids, control tokens as markers and malformed bytes as <0xNN>.

        With final=False (generation still running) a valid but unfinished UTF-8
        sequence at the very end is no error: it is returned as `pending`.
        """
        checked = checked_ids(ids, self.vocab_size)
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

    def incremental_decoder(self) -> IncrementalDecoder:
        """Decodes ids as they come, each id's text once: the text it has given out after any ids is
        `decode(ids, final=False).text`, and after `finish` `decode(ids).text`."""
        return PieceDecoder(self.pieces, CONTROL_MARKERS)


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
        if not piece or not is_integer(token_id) or not all(char in BYTE_OF_CHAR for char in piece):
            raise reject(f"vocab entry {piece!r} is not a byte-level piece with an integer id")
        if token_id in by_id:
            raise reject(f"vocab id {token_id} is given to more than one piece")
        by_id[token_id] = b"" if token_id in CONTROL_MARKERS else bytes(map(BYTE_OF_CHAR.__getitem__, piece))
    check_merges(model, reject, CONTROL_MARKERS.values())
    if any(by_id.get(b) != bytes([b]) for b in range(BYTE_COUNT)):
        raise reject("ids 0..255 must be the single bytes 0..255")
    if set(by_id) != set(range(len(by_id))):
        raise reject(f"vocab ids must run from 0 to {len(by_id) - 1} without gaps")
    return tuple(by_id[token_id] for token_id in range(len(by_id)))
