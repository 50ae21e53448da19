"""Typed readers for parsed JSON, and declarative descriptions of documents built from them.

Every document jgpt reads from a file passes through these, so a bad value is reported
as an ApiError with the full dotted path of the field (`system.kv_cache.device_kv_bytes`)
and one reason. Integers are never booleans (JSON `true` is not 1) and every number is at
most LIMIT in magnitude: 2^53 microseconds is 285 years and 2^53 bytes 9 PB, and past it
times and sizes would stop being exact as floats (1e308 as a link latency once broke the
plots with an OverflowError).

A description (`Integer`, `Number`, `String`, `Object`, `ListOf`, ...) is a frozen value
with two faces: `read(value, field)` checks parsed JSON and returns it, and `schema()`
writes the same rules as JSON Schema (draft 2020-12). A document is described once, next
to its reader, so the reader and its published schema cannot drift apart (`jgpt schema`).
What a schema cannot say (a length that must equal another field's, ids that must be
unique) stays in the reader's code, after `read`. Cheap to import (no jax).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from fractions import Fraction
from typing import Any, Protocol

from jgpt.foundation.errors import ApiError

LIMIT = 1 << 53
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


# -- readers --------------------------------------------------------------------------------------------------


def mapping(value: Any, field: str, required: AbstractSet[str], optional: AbstractSet[str] = frozenset()) -> dict:
    """A JSON object with exactly the required keys and any of the optional ones."""
    if not isinstance(value, dict):
        raise ApiError(field, f"expected an object, got {kind(value)}")
    unknown = sorted(set(value) - required - optional)
    if unknown:
        raise ApiError(member(field, unknown[0]), "unknown field")
    missing = sorted(required - set(value))
    if missing:
        raise ApiError(member(field, missing[0]), "missing required field")
    return value


def loose_mapping(value: Any, field: str, required: AbstractSet[str]) -> dict:
    """A JSON object that may carry extra fields (documents other packages may extend)."""
    if not isinstance(value, dict):
        raise ApiError(field, f"expected an object, got {kind(value)}")
    missing = sorted(required - set(value))
    if missing:
        raise ApiError(member(field, missing[0]), "missing required field")
    return value


def member(field: str, name: str) -> str:
    """The dotted path of field `name` of the object at `field` ("" is a document's top level)."""
    return f"{field}.{name}" if field else name


def is_integer(value: Any) -> bool:
    """An int that is not a boolean (JSON `true` is not 1): the test behind every integer reader, for checks
    written as one expression."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or float that is not a boolean (finiteness is the readers' to check)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(value: Any, field: str, minimum: int | None = 0, maximum: int | None = None) -> int:
    if not is_integer(value):
        raise ApiError(field, f"expected an integer, got {kind(value)}")
    if minimum is not None and value < minimum:
        raise ApiError(field, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ApiError(field, f"must be <= {maximum}, got {value}")
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
    """A finite JSON number as the exact rational its lexeme denotes."""
    if not is_number(value):
        raise ApiError(field, f"expected a number, got {kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
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
        raise ApiError(field, f"expected a string, got {kind(value)}")
    if choices is not None and value not in choices:
        raise ApiError(field, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def text(value: Any, field: str) -> str:
    """A string with something in it besides white space."""
    if not string(value, field).strip():
        raise ApiError(field, "must not be empty")
    return value


def boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise ApiError(field, f"expected true or false, got {kind(value)}")
    return value


def array(value: Any, field: str) -> list:
    if not isinstance(value, list):
        raise ApiError(field, f"expected an array, got {kind(value)}")
    return value


def integers(value: Any, field: str, minimum: int = 0, maximum: int = LIMIT) -> list[int]:
    """An array of integers, checked in one pass (documents hold millions of them)."""
    items = array(value, field)
    for index, item in enumerate(items):
        if type(item) is not int or item < minimum or item > maximum:
            integer(item, f"{field}[{index}]", minimum, maximum)
    return items


def kind(value: Any) -> str:
    """The JSON-ish name of a value's type, for error messages."""
    return "null" if value is None else type(value).__name__


# -- descriptions ---------------------------------------------------------------------------------------------


class Description(Protocol):
    def read(self, value: Any, field: str) -> Any: ...

    def schema(self) -> dict[str, Any]: ...


def _bounds(minimum: float | None, maximum: float | None) -> dict[str, Any]:
    return {"minimum": -LIMIT if minimum is None else minimum, "maximum": LIMIT if maximum is None else maximum}


@dataclasses.dataclass(frozen=True)
class Integer:
    minimum: int | None = 0
    maximum: int | None = None

    def read(self, value: Any, field: str) -> int:
        return integer(value, field, self.minimum, self.maximum)

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", **_bounds(self.minimum, self.maximum)}


@dataclasses.dataclass(frozen=True)
class Number:
    """A finite number within [minimum, LIMIT]: the exact rational its lexeme denotes, or as written."""

    minimum: float | None = 0
    exact: bool = True
    positive: bool = False  # above zero, not merely at least `minimum`

    def read(self, value: Any, field: str) -> Fraction | int | float:
        rational = number(value, field, None if self.minimum is None else Fraction(self.minimum))
        if self.positive and rational <= 0:
            raise ApiError(field, f"must be positive, got {value}")
        return rational if self.exact else value

    def schema(self) -> dict[str, Any]:
        return {"type": "number", **_bounds(self.minimum, None)} | ({"exclusiveMinimum": 0} if self.positive else {})


@dataclasses.dataclass(frozen=True)
class Rate:
    """A positive number of at least 2^-53, read as the exact rational its lexeme denotes."""

    def read(self, value: Any, field: str) -> Fraction:
        return positive_rate(value, field)

    def schema(self) -> dict[str, Any]:
        return {"type": "number", "minimum": 2.0**-53, "maximum": LIMIT}


@dataclasses.dataclass(frozen=True)
class String:
    """A string: one of `choices`, or non-empty, or matching `pattern` (whose `meaning` the error gives)."""

    choices: tuple[str, ...] | None = None
    non_empty: bool = False
    pattern: str | None = None
    meaning: str = ""

    def read(self, value: Any, field: str) -> str:
        string(value, field, self.choices)
        if self.non_empty and not value:
            raise ApiError(field, "must not be empty")
        if self.pattern is not None and not re.search(self.pattern, value):
            raise ApiError(field, f"{value!r} must be {self.meaning or f'a match of {self.pattern}'}")
        return value

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        if self.choices is not None:
            schema["enum"] = list(self.choices)
        if self.non_empty:
            schema["minLength"] = 1
        return schema | ({"pattern": self.pattern} if self.pattern is not None else {})


@dataclasses.dataclass(frozen=True)
class Text:
    """A string with something in it besides white space."""

    def read(self, value: Any, field: str) -> str:
        return text(value, field)

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": r"\S"}


# An absolute path, a '..' part, a backslash (a separator on Windows) or a NUL: what no path jgpt writes holds.
UNSAFE_PATH = r"^/|\\|\x00|(^|/)\.\.(/|$)"


@dataclasses.dataclass(frozen=True)
class RelativePath:
    """A path that, by its text alone, stays inside the directory it is relative to (`jgpt.foundation.paths.confined`
    also follows symbolic links, once the directory is known)."""

    def read(self, value: Any, field: str) -> str:
        if re.search(UNSAFE_PATH, text(value, field)):
            raise ApiError(field, f"{value!r} must be a relative path inside its directory (no absolute path, no '..')")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": r"\S", "not": {"pattern": UNSAFE_PATH}}


@dataclasses.dataclass(frozen=True)
class Const:
    """Exactly one value (a document's `format` or `version`)."""

    value: str | int

    def read(self, value: Any, field: str) -> str | int:
        if value != self.value or type(value) is not type(self.value):
            raise ApiError(field, f"expected {self.value!r}, got {value!r}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"const": self.value}


@dataclasses.dataclass(frozen=True)
class Boolean:
    def read(self, value: Any, field: str) -> bool:
        return boolean(value, field)

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclasses.dataclass(frozen=True)
class Anything:
    """Any JSON value; what it must be is decided elsewhere (`about` says where)."""

    about: str = ""

    def read(self, value: Any, field: str) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        return {"description": self.about} if self.about else {}


@dataclasses.dataclass(frozen=True)
class Nullable:
    inner: Description

    def read(self, value: Any, field: str) -> Any:
        return None if value is None else self.inner.read(value, field)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [self.inner.schema(), {"type": "null"}]}


@dataclasses.dataclass(frozen=True)
class Integers:
    """An array of integers in [minimum, maximum], checked in one pass."""

    minimum: int = 0
    maximum: int = LIMIT
    min_items: int = 0

    def read(self, value: Any, field: str) -> list[int]:
        items = integers(value, field, self.minimum, self.maximum)
        if len(items) < self.min_items:
            raise ApiError(field, f"needs at least {self.min_items} entries, got {len(items)}")
        return items

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "items": Integer(self.minimum, self.maximum).schema()} | _min_items(self.min_items)


@dataclasses.dataclass(frozen=True)
class ListOf:
    item: Description
    min_items: int = 0

    def read(self, value: Any, field: str) -> list:
        items = [self.item.read(entry, f"{field}[{index}]") for index, entry in enumerate(array(value, field))]
        if len(items) < self.min_items:
            raise ApiError(field, f"needs at least {self.min_items} entries, got {len(items)}")
        return value if all(map(operator.is_, items, value)) else items

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "items": self.item.schema()} | _min_items(self.min_items)


def _min_items(count: int) -> dict[str, Any]:
    return {"minItems": count} if count else {}


@dataclasses.dataclass(frozen=True)
class MapOf:
    """An object whose keys are names the document chooses (request ids) and whose values share one description."""

    value: Description

    def read(self, value: Any, field: str) -> dict:
        return {
            key: self.value.read(item, member(field, key)) for key, item in loose_mapping(value, field, set()).items()
        }

    def schema(self) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": self.value.schema()}


@dataclasses.dataclass(frozen=True)
class Object:
    """A JSON object with known fields; `open` ones may carry fields other packages add, which are kept as given."""

    required: Mapping[str, Description]
    optional: Mapping[str, Description] = dataclasses.field(default_factory=dict)
    open: bool = False
    about: str = ""

    def __contains__(self, name: str) -> bool:
        return name in self.required or name in self.optional

    def keys(self, value: Any, field: str) -> dict:
        """`value` with its keys checked, not its values (for readers that read each field themselves)."""
        if self.open:
            return loose_mapping(value, field, self._names[0])
        return mapping(value, field, *self._names)

    def read(self, value: Any, field: str) -> dict:
        self.keys(value, field)
        known, plain, converted = self._known, self._plain, None
        for key, item in value.items():
            check = plain.get(key)
            if check is not None and check(item) or key not in known:
                continue
            read = known[key].read(item, member(field, key))  # only now is the field's path spelled out
            if read is not item:
                converted = converted or dict(value)
                converted[key] = read
        return value if converted is None else converted

    # Computed once: documents hold millions of small objects (decode steps), each read with these.
    @functools.cached_property
    def _plain(self) -> dict[str, Callable[[Any], bool]]:
        return {name: check for name, d in self._known.items() if (check := _plain_check(d)) is not None}

    @functools.cached_property
    def _names(self) -> tuple[frozenset[str], frozenset[str]]:
        return frozenset(self.required), frozenset(self.optional)

    @functools.cached_property
    def _known(self) -> dict[str, Description]:
        return {**self.required, **self.optional}

    def schema(self) -> dict[str, Any]:
        properties = {name: d.schema() for name, d in {**self.required, **self.optional}.items()}
        document: dict[str, Any] = {"description": self.about} if self.about else {}
        document |= {"type": "object", "properties": properties, "required": sorted(self.required)}
        return document if self.open else document | {"additionalProperties": False}


def _plain_check(description: Description) -> Callable[[Any], bool] | None:
    """A quick test that `description.read` would return a value unchanged, for the common leaves."""
    if isinstance(description, Integer):
        low = -LIMIT if description.minimum is None else max(description.minimum, -LIMIT)
        high = LIMIT if description.maximum is None else min(description.maximum, LIMIT)
        return lambda value: type(value) is int and low <= value <= high
    if isinstance(description, String) and description == String():
        return lambda value: type(value) is str
    return None


@dataclasses.dataclass(frozen=True)
class Tagged:
    """Alternative objects told apart by the string in field `key` (absent means `default`)."""

    key: str
    alternatives: Mapping[str, Object]
    default: str | None = None

    def read(self, value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise ApiError(field, f"expected an object, got {kind(value)}")
        tag = string(value.get(self.key, self.default), member(field, self.key), tuple(self.alternatives))
        return self.alternatives[tag].read(value, field)

    def schema(self) -> dict[str, Any]:
        return {"type": "object", "oneOf": [self._branch(tag, a) for tag, a in self.alternatives.items()]}

    def _branch(self, tag: str, alternative: Object) -> dict[str, Any]:
        schema = alternative.schema()
        schema["properties"] = {**schema["properties"], self.key: {"const": tag}}
        if tag != self.default:
            schema["required"] = sorted({*schema["required"], self.key})
        return schema


@dataclasses.dataclass(frozen=True)
class Either:
    """One of several descriptions told apart by JSON type (a path string or an inline document)."""

    alternatives: tuple[Description, ...]

    def read(self, value: Any, field: str) -> Any:
        for alternative in self.alternatives:
            if _json_type(value) in _types(alternative.schema()):
                return alternative.read(value, field)
        wanted = " or ".join(sorted({t for a in self.alternatives for t in _types(a.schema())}))
        raise ApiError(field, f"expected {wanted}, got {kind(value)}")

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [alternative.schema() for alternative in self.alternatives]}


def _types(schema: Mapping[str, Any]) -> set[str]:
    if schema.get("type") == "number":  # JSON Schema's integers are numbers too
        return {"number", "integer"}
    return (
        {schema["type"]} if "type" in schema else {"integer", "number", "string", "boolean", "array", "object", "null"}
    )


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def json_schema(description: Description, name: str, title: str) -> dict[str, Any]:
    """A standalone JSON Schema document for `description`."""
    return {"$schema": SCHEMA_DIALECT, "$id": f"https://jgpt.invalid/schemas/{name}.json", "title": title,
            **description.schema()}  # fmt: skip
