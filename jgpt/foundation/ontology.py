"""The ontology registry: the 42 admitted concepts of the jgpt domain model, as data.

Each Concept carries what the spec says about it (description, lifecycle, what it
owns and excludes) and the records it defines with their field names. The data
lives in `ontology.json` next to this module, generated from the spec text by
`tools/ontology_from_spec.py`; nothing here reads the spec at run time.

OntologyBinding ties an experiment control to the concept it acts on. Importing
this module must stay cheap (no jax): kvsim and the command line use it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import ListOf, Object, String

_DATA = Path(__file__).with_name("ontology.json")


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of a record: its name and the spec's type or note for it."""

    name: str
    note: str


@dataclasses.dataclass(frozen=True)
class Record:
    """A named shape a concept owns (e.g. KVCacheConfig under KVCache)."""

    name: str
    fields: tuple[Field, ...]

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(field.name for field in self.fields)


@dataclasses.dataclass(frozen=True)
class Concept:
    """An admitted concept: what it is, how long it lives, what it owns and excludes."""

    name: str
    description: str
    lifecycle: str
    owns: tuple[str, ...]
    excludes: tuple[str, ...]
    records: tuple[Record, ...]

    def record(self, name: str) -> Record:
        for record in self.records:
            if record.name == name:
                return record
        raise ApiError("record", f"{self.name} defines no record {name!r}")


@functools.cache
def _registry() -> Mapping[str, Concept]:
    document = json.loads(_DATA.read_text(encoding="utf-8"))
    concepts = {}
    for entry in document["concepts"]:
        records = tuple(
            Record(name, tuple(Field(f["name"], f["note"]) for f in fields))
            for name, fields in entry["records"].items()
        )
        concepts[entry["name"]] = Concept(
            name=entry["name"],
            description=entry["description"],
            lifecycle=entry["lifecycle"],
            owns=tuple(entry["owns"]),
            excludes=tuple(entry["excludes"]),
            records=records,
        )
    return concepts


def admitted_concepts() -> tuple[Concept, ...]:
    """Every admitted concept, in the spec's order."""
    return tuple(_registry().values())


def is_admitted(name: str) -> bool:
    return isinstance(name, str) and name in _registry()


def concept(name: str) -> Concept:
    """The admitted concept called `name`; ApiError if there is none."""
    if not is_admitted(name):
        raise ApiError("concept", f"{name!r} is not an admitted ontology concept")
    return _registry()[name]


def owner_of_record(record_name: str) -> Concept:
    """The concept that defines a record name (e.g. 'KVCacheConfig' -> KVCache)."""
    for candidate in _registry().values():
        if any(record.name == record_name for record in candidate.records):
            return candidate
    raise ApiError("record", f"no admitted concept defines a record {record_name!r}")


# Whether a name is an admitted concept is checked by _check_binding, against the registry.
ONTOLOGY_BINDING = Object(
    {"primary": String()},
    {"related": ListOf(String())},
    about="OntologyBinding: one admitted primary concept and other related ones.",
)


@dataclasses.dataclass(frozen=True)
class OntologyBinding:
    """The ontology subjects of a control: one admitted primary, other admitted related concepts."""

    primary: str
    related: tuple[str, ...] = ()

    def __post_init__(self):
        _check_binding(self.primary, self.related, "ontology_binding")

    @classmethod
    def from_json(cls, value: Any, field: str = "ontology_binding") -> OntologyBinding:
        """Read a binding from decoded JSON; errors name `field` and the part at fault."""
        value = ONTOLOGY_BINDING.read(value, field)
        related = value.get("related", [])
        _check_binding(value["primary"], related, field)
        return cls(value["primary"], tuple(related))

    def to_json(self) -> dict[str, Any]:
        return {"primary": self.primary, "related": list(self.related)}


def _check_binding(primary: Any, related: Any, field: str) -> None:
    if not is_admitted(primary):
        raise ApiError(f"{field}.primary", f"{primary!r} is not an admitted ontology concept")
    if not isinstance(related, (tuple, list)):
        raise ApiError(f"{field}.related", f"must be a sequence of concept names, got {type(related).__name__}")
    seen = set()
    for i, name in enumerate(related):
        where = f"{field}.related[{i}]"
        if not is_admitted(name):
            raise ApiError(where, f"{name!r} is not an admitted ontology concept")
        if name == primary:
            raise ApiError(where, f"{name!r} is the primary subject; related concepts exclude it")
        if name in seen:
            raise ApiError(where, f"{name!r} is listed twice")
        seen.add(name)
