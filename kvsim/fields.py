"""Readers that turn parsed JSON into checked Python values or raise ApiError.

Every kvsim input passes through these, so a bad value is reported with the full
dotted path of the field (`system.kv_cache.device_kv_bytes`) and one reason. Every
number is at most LIMIT in magnitude: 2^53 microseconds is 285 years and 2^53 bytes
9 PB, and past it times and sizes would stop being exact as floats (1e308 as a link
latency once broke the plots with an OverflowError).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from jgpt.errors import ApiError

LIMIT = 1 << 53


def mapping(value: Any, field: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    """A JSON object with exactly the required keys and any of the optional ones."""
    if not isinstance(value, dict):
        raise ApiError(field, f"expected an object, got {_kind(value)}")
    unknown = sorted(set(value) - required - optional)
    if unknown:
        raise ApiError(f"{field}.{unknown[0]}", "unknown field")
    missing = sorted(required - set(value))
    if missing:
        raise ApiError(f"{field}.{missing[0]}", "missing required field")
    return value


def loose_mapping(value: Any, field: str, required: set[str]) -> dict:
    """A JSON object that may carry extra fields (documents other packages may extend)."""
    if not isinstance(value, dict):
        raise ApiError(field, f"expected an object, got {_kind(value)}")
    missing = sorted(required - set(value))
    if missing:
        raise ApiError(f"{field}.{missing[0]}", "missing required field")
    return value


def integer(value: Any, field: str, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(field, f"expected an integer, got {_kind(value)}")
    if minimum is not None and value < minimum:
        raise ApiError(field, f"must be >= {minimum}, got {value}")
    if abs(value) > LIMIT:
        raise ApiError(field, f"must be at most 2^53 in magnitude, got {value}")
    return value


def positive_rate(value: Any, field: str) -> Fraction:
    """A positive JSON number as the exact rational its lexeme denotes (1.1 is 11/10)."""
    rate = number(value, field, minimum=None)
    if rate <= 0:
        raise ApiError(field, f"must be positive, got {value}")
    if rate < Fraction(1, LIMIT):  # work divided by it must stay a float-sized duration
        raise ApiError(field, f"must be at least 2^-53, got {value}")
    return rate


def number(value: Any, field: str, minimum: Fraction | None = Fraction(0)) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(field, f"expected a number, got {_kind(value)}")
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        raise ApiError(field, f"must be finite, got {value}")
    exact = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    if minimum is not None and exact < minimum:
        raise ApiError(field, f"must be >= {minimum}, got {value}")
    if abs(exact) > LIMIT:
        raise ApiError(field, f"must be at most 2^53 in magnitude, got {value}")
    return exact


def json_number(value: Fraction) -> int | float:
    """An integer stays an integer; a decimal rational is written as the float that reads back to it."""
    return value.numerator if value.denominator == 1 else float(value)


def string(value: Any, field: str, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str):
        raise ApiError(field, f"expected a string, got {_kind(value)}")
    if choices is not None and value not in choices:
        raise ApiError(field, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def array(value: Any, field: str) -> list:
    if not isinstance(value, list):
        raise ApiError(field, f"expected an array, got {_kind(value)}")
    return value


def integers(value: Any, field: str, minimum: int = 0) -> list[int]:
    """An array of integers, checked in one pass (documents hold millions of them)."""
    items = array(value, field)
    for index, item in enumerate(items):
        if type(item) is not int or item < minimum or item > LIMIT:
            integer(item, f"{field}[{index}]", minimum)
    return items


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
