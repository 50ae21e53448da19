"""UTF-8 decoding that shows each byte of no valid character as <0xNN>, in pure Python.

Generated ids need not spell valid text: a merge may end inside a character, a model may pick any
byte. Both kinds of tokenizer decode, and describe their vocabulary entries, through this one
reading, so that a malformed byte reads the same wherever it is shown.
"""

from __future__ import annotations

import codecs
import re


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
    escaped = len(ESCAPED_BYTE.findall(text))
    if not escaped:
        return text, None, pending
    try:
        data[: len(data) - len(pending)].decode("utf-8")
    except UnicodeDecodeError as error:  # always raised: it names the first malformed sequence
        bad = error.object[error.start : error.end]
        kind = "incomplete" if error.reason == "unexpected end of data" else "malformed"
        others = f", {escaped} bad bytes in all" if escaped > len(bad) else ""
        problem = f"{kind} UTF-8 ({error.reason}: {' '.join(f'0x{b:02X}' for b in bad)}{others})", error.start
    return marked(text), problem, pending


def marked(text: str) -> str:
    """Text decoded with surrogateescape, each escaped byte written as <0xNN>."""
    return ESCAPED_BYTE.sub(lambda match: f"<0x{ord(match[0]) - 0xDC00:02X}>", text)


ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # a byte surrogateescape could not decode
