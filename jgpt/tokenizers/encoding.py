"""Encoding and Span: the recorded evidence of one tokenizer run over framed turns.

An Encoding is the token-ID input a model receives plus the spans that explain
where every id came from. Spans are the unit of inspection:

* a *control* span is one framing token (a role marker or TURN_END); it covers no
  source bytes, so its byte range is null;
* a *text* span is the shortest run of consecutive text tokens of one turn whose
  bytes end on a UTF-8 character boundary. Its raw bytes are therefore always
  whole characters, even when BPE merged part of a character with its neighbour
  or when a character is spelled by several single-byte tokens.

Byte ranges index the UTF-8 of the *source*: the NFC-normalized texts of all turns
concatenated in order, without framing. Text spans tile that source exactly, and
all spans tile the ids exactly; the tests check both properties.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import sha256_json
from jgpt.foundation.validation import is_integer
from jgpt.tokenizers.framing import Turn

# Why a span exists, as recorded in `Span.reason`.
TURN_FRAMING = "turn framing"  # a role marker or TURN_END
BYTE = "byte"  # one single-byte token: one ASCII character
UTF8_SEQUENCE = "utf-8 sequence"  # several single-byte tokens spelling one character
BPE_MERGE = "bpe merge"  # at least one learned merge token


@dataclass(frozen=True)
class Span:
    """Where a run of token ids came from. Control spans have null byte ranges."""

    kind: str  # "control" | "text"
    reason: str  # TURN_FRAMING | BYTE | UTF8_SEQUENCE | BPE_MERGE
    byte_start: int | None  # into the UTF-8 of the normalized source, inclusive
    byte_end: int | None  # exclusive
    token_start: int  # into Encoding.ids, inclusive
    token_end: int  # exclusive
    raw_bytes: bytes  # the source bytes the ids spell; empty for control spans
    ids: tuple[int, ...]
    turn: int | None  # index of the turn the span belongs to

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "byte_start": self.byte_start,
            "byte_end": self.byte_end,
            "token_start": self.token_start,
            "token_end": self.token_end,
            "raw_bytes": list(self.raw_bytes),
            "ids": list(self.ids),
            "turn": self.turn,
        }


@dataclass(frozen=True)
class Encoding:
    """Token ids for framed turns, the spans explaining them, and the identities to reproduce them."""

    ids: tuple[int, ...]
    spans: tuple[Span, ...]
    input_sha256: str  # of the canonical JSON of the normalized turns (see docs/tokenizer.md)
    input_kind: str  # "conversation" (every turn closed) | "generation prompt" (ends in an open role marker)
    manifest_sha256: str  # of the tokenizer's codec manifest: file identity, normalization, control tokens, limit
    context_limit: int | None
    codec_version: str
    unicode_version: str  # of the NFC tables that normalized the text

    def to_json(self) -> dict[str, Any]:
        return {
            "ids": list(self.ids),
            "spans": [span.to_json() for span in self.spans],
            "input_sha256": self.input_sha256,
            "input_kind": self.input_kind,
            "manifest_sha256": self.manifest_sha256,
            "context_limit": self.context_limit,
            "codec_version": self.codec_version,
            "unicode_version": self.unicode_version,
        }


def encoding_of(
    ids: list[int],
    spans: list[Span],
    turns: Sequence[Turn],
    texts: list[str],
    open_turn: str | None,
    manifest: Mapping[str, Any],
) -> Encoding:
    """The Encoding of encoded turns (either kind of tokenizer, whose codec `manifest` names the
    context_limit), refused past that limit."""
    context_limit = manifest["context_limit"]
    if context_limit is not None and len(ids) > context_limit:
        raise ApiError(
            "context_limit",
            f"the input encodes to {len(ids)} token ids, more than the context_limit of {context_limit}",
        )
    canonical_input = {
        "open_turn": open_turn,
        "turns": [{"role": turn.role, "text": text} for turn, text in zip(turns, texts)],
    }
    return Encoding(
        ids=tuple(ids),
        spans=tuple(spans),
        input_sha256=sha256_json(canonical_input),
        input_kind="conversation" if open_turn is None else "generation prompt",
        manifest_sha256=sha256_json(manifest),
        context_limit=context_limit,
        codec_version=manifest["codec_version"],
        unicode_version=manifest["unicode_version"],
    )


def check_context_limit(context_limit: Any) -> None:
    if context_limit is not None and (not is_integer(context_limit) or context_limit < 1):
        raise ApiError("context_limit", f"must be a positive integer or None, got {context_limit!r}")


def control_span(token_id: int, token_start: int, turn: int) -> Span:
    return Span("control", TURN_FRAMING, None, None, token_start, token_start + 1, b"", (token_id,), turn)


def text_spans(
    ids: np.ndarray,
    source: bytes,
    piece_lengths: np.ndarray,
    *,
    first_merge_id: int,
    token_offset: int,
    byte_offset: int,
    turn: int,
) -> list[Span]:
    """Group one turn's text tokens into spans that end on UTF-8 character boundaries.

    ids: [n] text-token ids of the turn; source: the turn's normalized UTF-8, which
    they spell exactly; piece_lengths: [vocabulary] byte length of each id.
    """
    if ids.size == 0:
        return []
    token_ends = np.cumsum(piece_lengths[ids])  # [n] byte offset after each token
    source_array = np.frombuffer(source + b"\0", dtype=np.uint8)  # the sentinel marks the end a boundary
    ends_character = (source_array[token_ends] & 0xC0) != 0x80  # next byte is not a continuation byte
    span_ends = np.flatnonzero(ends_character) + 1  # [s] token index after each span
    span_starts = np.concatenate([[0], span_ends[:-1]])  # [s]
    merged = np.add.reduceat(ids >= first_merge_id, span_starts) > 0  # [s]
    byte_ends = token_ends[span_ends - 1]
    byte_starts = np.concatenate([[0], byte_ends[:-1]])
    reasons = np.where(merged, BPE_MERGE, np.where(span_ends - span_starts == 1, BYTE, UTF8_SEQUENCE))
    bounds = (span_starts, span_ends, byte_starts, byte_ends)
    return bounded_text_spans(ids.tolist(), source, bounds, reasons, token_offset, byte_offset, turn)


def bounded_text_spans(
    ids: list[int],
    source: bytes,
    bounds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    reasons: np.ndarray,
    token_offset: int,
    byte_offset: int,
    turn: int,
) -> list[Span]:
    """One text Span per run of tokens: bounds are [s] token starts, token ends, byte starts and byte ends
    within the turn (ids and source), reasons [s] each span's reason."""
    columns = (*(column.tolist() for column in bounds), reasons)
    return [
        Span(
            "text",
            str(reason),
            byte_offset + b0,
            byte_offset + b1,
            token_offset + t0,
            token_offset + t1,
            source[b0:b1],
            tuple(ids[t0:t1]),
            turn,
        )
        for t0, t1, b0, b1, reason in zip(*columns)
    ]
