"""Incremental decoding: the text of ids as they are generated, each new id's text computed once.

A stream (the HTTP server's server-sent events) wants, after each id, the text that id adds. Decoding the
whole sequence again and diffing costs time linear in the sequence per id; these decoders keep just enough
state to emit only the new text, with exactly the whole decode's result: after any ids, the text emitted
so far is `tokenizer.decode(ids, final=False).text`, and with `finish` it is `tokenizer.decode(ids).text`.
So a split UTF-8 character waits for the ids that complete it, and malformed bytes read `<0xNN>` (or the
library's replacement) exactly as the whole decode reads them.

    PieceDecoder    jgpt's byte-level tokenizer: ids -> bytes is a table lookup, and the bytes go through one
                    incremental UTF-8 decoder; a control id closes the character open before it, as in decode
    WindowDecoder   any other tokenizer (an imported Hugging Face one): its own decode over a bounded window,
                    the ids since the one before the last text given out (the usual prefix-offset technique:
                    the text a decoder strips from a window's start is stripped from both decodes that are
                    diffed), so each id costs a decode of a few ids
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from jgpt.tokenizers.utf8_markers import ESCAPED_BYTE, marked
from jgpt.tokenizers.vocabulary import Decoded


class IncrementalDecoder(Protocol):
    def add(self, ids: Sequence[int]) -> str:
        """The text these ids add (ids the decoder knows to be in the vocabulary); maybe empty while a
        character is unfinished."""
        ...

    def finish(self) -> str:
        """The text still held back, now that no id will follow."""
        ...


class PieceDecoder:
    """jgpt's byte-level decode, one id at a time: each id's bytes from the table, control ids as markers."""

    def __init__(self, pieces: Sequence[bytes], controls: Mapping[int, str]):
        self.pieces, self.controls = pieces, controls
        self.utf8 = codecs.getincrementaldecoder("utf-8")("surrogateescape")  # bad byte b -> U+DC00+b

    def add(self, ids: Sequence[int]) -> str:
        parts = []
        for token_id in ids:
            marker = self.controls.get(token_id)
            if marker is None:
                parts.append(self.utf8.decode(self.pieces[token_id]))
            else:  # a control cuts the character open before it, as `Tokenizer.decode` cuts its runs
                parts += [self.utf8.decode(b"", final=True), marker]
                self.utf8.reset()
        return _marked("".join(parts))

    def finish(self) -> str:
        return _marked(self.utf8.decode(b"", final=True))


def _marked(text: str) -> str:
    return marked(text) if ESCAPED_BYTE.search(text) else text


class WindowDecoder:
    """A tokenizer's own decode over a window of ids: from the start of the text given out before the last
    (`anchor`, so the window's first ids always have text before them) to the newest id. `lengths` are the
    bytes each id spells: they tell which ids the decode held back (its `pending` bytes)."""

    def __init__(self, decode: Callable[..., Decoded], lengths: np.ndarray):
        self.decode, self.lengths = decode, lengths
        self.window: list[int] = []  # the ids from the anchor on
        self.read = 0  # the window's ids whose text has been given out
        self.given = ""  # their text, as the window's decode reads it

    def add(self, ids: Sequence[int]) -> str:
        self.window += ids
        return self.advance(final=False)

    def finish(self) -> str:
        return self.advance(final=True)

    def advance(self, final: bool) -> str:
        decoded = self.decode(self.window, final=final)
        assert decoded.text.startswith(self.given), "a window's text only grows as ids are added"
        new = decoded.text[len(self.given) :]
        ends = np.cumsum(self.lengths[self.window])
        # The ids the decode kept are those up to the end of the bytes it did not hold back.
        kept = int(np.searchsorted(ends, (ends[-1] if ends.size else 0) - len(decoded.pending), side="right"))
        if kept > self.read:  # slide: the new window starts at the ids just given out
            self.window = self.window[self.read :]
            self.read = kept - self.read
            # Their bytes are decided (a later id cannot change their text): decoded as final.
            self.given = self.decode(self.window[: self.read]).text
        return new
