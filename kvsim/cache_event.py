"""CacheEvent (the spec's ExperimentEvent of a CacheRun) and Measurement: kvsim's typed record entries.

Both are NamedTuples, so every reader names the field it reads (`event.kind`, not
`event[3]`). The engine appends plain tuples in their field order, the kinds as
their values (plain strings), and a run hands them out as `Rows`, which makes
each entry its NamedTuple, kinds as enum members, when it is read: the garbage
collector stops tracking a tuple of ints and strings, but keeps traversing every
NamedTuple, and every tuple holding an enum member, that a run holds (docs/kvsim-record.md
says why). The kinds are str-valued enums: a member is its
JSON string, so records written from them are byte-for-byte the records written
from plain strings.

Inside a run event ids and causes are ints (an event's index); a record writes
them as "e<index>".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from enum import StrEnum
from typing import Any, Generic, NamedTuple, TypeVar, overload


class EventKind(StrEnum):
    """What happened, in the order a request meets them (docs/kvsim-record.md lists when each is emitted)."""

    ARRIVAL = "arrival"
    REJECT = "reject"
    ADMIT = "admit"
    LOOKUP_MISS = "lookup_miss"
    LOOKUP_HIT = "lookup_hit"
    RESERVE = "reserve"
    OFFLOAD = "offload"
    RELOAD = "reload"
    DROP = "drop"
    TRANSFER_START = "transfer_start"
    TRANSFER_END = "transfer_end"
    COMPUTE_START = "compute_start"
    COMPUTE_END = "compute_end"
    PUBLISH = "publish"
    CONSUME = "consume"
    CANCEL_REQUEST = "cancel_request"
    # how a request that ran finishes (exactly one of these, or REJECT)
    COMPLETE = "complete"
    STOP = "stop"
    CANCEL = "cancel"
    RELEASE = "release"
    RETAIN = "retain"
    RETAIN_SKIP = "retain_skip"


class Phase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class TransferDirection(StrEnum):
    DEVICE_TO_HOST = "device_to_host"
    HOST_TO_DEVICE = "host_to_device"


class MeasurementKind(StrEnum):
    COMPUTE_PREFILL = "compute_prefill"
    COMPUTE_DECODE = "compute_decode"
    TRANSFER_DEVICE_TO_HOST = "transfer_device_to_host"
    TRANSFER_HOST_TO_DEVICE = "transfer_host_to_device"
    CONSUME_WAIT = "consume_wait"  # how long a consume action waited for the published output to cover it


class CacheEvent(NamedTuple):
    event_id: int
    request_id: str
    time_us: int
    kind: EventKind
    state_id: str | None
    bytes: int
    device_reserved_bytes: int  # reservations plus device-resident retained states, after the event
    host_retained_bytes: int
    detail: str
    causes: tuple[int, ...]  # earlier events that made this one happen
    phase: Phase | None
    transfer_direction: TransferDirection | None


class Measurement(NamedTuple):
    event_id: int  # the event that ends what was measured
    kind: MeasurementKind
    elapsed_us: int
    bytes: int


# Positions of the fields the run's own folds read from the plain tuples (kvsim.cache_run.Tally).
KIND, BYTES, DIRECTION = (CacheEvent._fields.index(name) for name in ("kind", "bytes", "transfer_direction"))
Row = TypeVar("Row", CacheEvent, Measurement)


def _reader(kind: type[Row], enums: dict[str, type[StrEnum]]) -> Callable[[tuple], Row]:
    """Makes a `kind` from a plain tuple whose fields named in `enums` hold values (or None)."""
    members = [(kind._fields.index(name), {member.value: member for member in enum}) for name, enum in enums.items()]

    def make(row: tuple) -> Row:
        values: list[Any] = list(row)
        for index, of in members:
            if values[index] is not None:
                values[index] = of[values[index]]
        return kind._make(values)

    return make


_READERS: dict[type, Callable[[tuple], Any]] = {
    CacheEvent: _reader(CacheEvent, {"kind": EventKind, "phase": Phase, "transfer_direction": TransferDirection}),
    Measurement: _reader(Measurement, {"kind": MeasurementKind}),
}


class Rows(Sequence[Row], Generic[Row]):
    """A run's plain tuples (`rows`, in the field order of `kind`, kinds as their values), read as `kind`s."""

    __slots__ = ("_make", "rows")

    def __init__(self, kind: type[Row], rows: list[tuple]):
        self._make, self.rows = _READERS[kind], rows

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...

    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        if isinstance(index, slice):
            return list(map(self._make, self.rows[index]))
        return self._make(self.rows[index])

    def __iter__(self) -> Iterator[Row]:
        return map(self._make, self.rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def event_json(event: CacheEvent) -> dict:
    """The record's CacheEvent object, fields in CacheEvent order."""
    return {
        **event._asdict(),
        "event_id": f"e{event.event_id}",
        "causes": [f"e{c}" for c in event.causes],
    }


def measurement_json(measurement: Measurement) -> dict:
    return {**measurement._asdict(), "event_id": f"e{measurement.event_id}"}
