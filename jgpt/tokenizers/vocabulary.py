"""What each id of a vocabulary spells, shared by both kinds of tokenizer: the PieceTable of bytes per id,
the Token that describes an entry for display, the Decoded text of ids, and ids checked against it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.tokenizers.utf8_markers import utf8_with_markers


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


def checked_ids(ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """ids as int64 [n], each checked to be in a vocabulary of vocab_size."""
    array = np.asarray(ids)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ApiError("ids", f"must be a flat sequence of integers, got shape {array.shape} of {array.dtype}")
    array = array.astype(np.int64, copy=False)  # also types an empty sequence
    out_of_range = np.flatnonzero((array < 0) | (array >= vocab_size))
    if out_of_range.size:
        n = int(out_of_range[0])
        raise ApiError("ids", f"id {int(array[n])} at position {n} is not in the vocabulary of {vocab_size}")
    return array
