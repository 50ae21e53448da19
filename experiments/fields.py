"""Checks for decoded JSON that name the field at fault (every spec and lab file passes through these)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jgpt.errors import ApiError

_TYPE_NAMES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list", dict: "an object"}


def expect(value: Any, kind: type | tuple[type, ...], field: str) -> Any:
    """`value` if it is of `kind`; booleans never pass as numbers."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds)
    if not ok:
        wanted = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise ApiError(field, f"must be {wanted}, got {type(value).__name__} {value!r}"[:200])
    return value


def expect_text(value: Any, field: str) -> str:
    """A non-blank string."""
    if not expect(value, str, field).strip():
        raise ApiError(field, "must not be empty")
    return value


def expect_list(value: Any, field: str) -> list:
    return expect(value, list, field)


def expect_keys(value: Any, field: str, required: Iterable[str], optional: Iterable[str] = ()) -> Mapping:
    """An object with every required key and no key outside required + optional."""
    if not isinstance(value, Mapping):
        raise ApiError(field, f"must be an object, got {type(value).__name__}")
    required, allowed = tuple(required), set(required) | set(optional)
    for key in value:
        if key not in allowed:
            raise ApiError(f"{field}.{key}" if field else key, f"unknown field; expected {', '.join(sorted(allowed))}")
    for key in required:
        if key not in value:
            raise ApiError(f"{field}.{key}" if field else key, "is required")
    return value
