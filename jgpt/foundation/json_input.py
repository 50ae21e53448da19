"""JSON read from outside: bounded nesting, finite numbers, and an ApiError naming the field.

Every document jgpt reads from a file (turns, workloads, kvsim inputs and records,
traces, training configs, lab records, catalogs, manifests, Hugging Face configs) goes
through `parse_json`. Python's decoder recurses once per nesting level, so a file of
100,000 `[` ends in RecursionError; the depth is therefore measured by a flat scan
before the decoder runs. NaN and Infinity are not JSON (RFC 8259) and no field of ours
means them, so they are refused unless a caller says otherwise. Cheap to import (no jax).
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes

# jgpt's own documents nest a few levels (the worked kvsim input 6; a tensor observation adds
# one per axis); 64 leaves room for hand-written files, far below the decoder's recursion limit.
DEPTH_LIMIT = 64

# A string literal (skipped whole, so brackets inside text do not count) or one bracket.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def parse_json(
    data: bytes | str,
    field: str,
    *,
    source: str | None = None,
    allow_non_finite: bool = False,
    depth_limit: int = DEPTH_LIMIT,
) -> Any:
    """The JSON value in `data`; anything else is an ApiError naming `field` (and `source`, the file)."""
    where = f"{source} " if source else ""
    text = _text(data, field, where)
    if _nests_deeper(text, depth_limit):
        raise ApiError(field, f"{where}nests deeper than {depth_limit} levels")
    try:
        return json.loads(
            text,
            parse_constant=_constant(field, where, allow_non_finite),
            parse_float=_float(field, where, allow_non_finite),
        )
    except json.JSONDecodeError as error:
        raise ApiError(field, f"{where}is not JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    except (ValueError, RecursionError) as error:  # an integer of more than 4300 digits; the scan's backstop
        raise ApiError(field, f"{where}is not usable JSON: {error}") from None


def read_json(
    path: str | os.PathLike, field: str, *, allow_non_finite: bool = False, depth_limit: int = DEPTH_LIMIT
) -> Any:
    """The JSON document in file `path`; unreadable, not UTF-8, too deep or not JSON is an ApiError."""
    return parse_json(
        read_bytes(path, field), field, source=str(path), allow_non_finite=allow_non_finite, depth_limit=depth_limit
    )


def _text(data: bytes | str, field: str, where: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = " ".join(f"0x{b:02X}" for b in data[error.start : error.end])
        raise ApiError(field, f"{where}is not valid UTF-8: {error.reason} ({bad}) at byte {error.start}") from None


def _nests_deeper(text: str, limit: int) -> bool:
    if text.count("[") + text.count("{") <= limit:  # most documents: no scan needed
        return False
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return True
        elif token in "]}":
            depth -= 1
    return False


def _constant(field: str, where: str, allow: bool):
    def constant(lexeme: str) -> float:
        if not allow:
            raise ApiError(field, f"{where}holds {lexeme}, which is not a finite number")
        return float(lexeme)

    return constant


def _float(field: str, where: str, allow: bool):
    def number(lexeme: str) -> float:
        value = float(lexeme)
        if not allow and not math.isfinite(value):
            raise ApiError(field, f"{where}holds {lexeme[:32]}, which overflows a finite number")
        return value

    return number
