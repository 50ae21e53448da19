"""CacheEvent (the spec's ExperimentEvent of a CacheRun) and Measurement: kvsim's typed record entries.

Both are NamedTuples, so the engine creates them as cheaply as plain tuples and
every reader names the field it reads (`event.kind`, not `event[3]`). The kinds
are str-valued enums: a member is its JSON string, so records written from them
are byte-for-byte the records written from plain strings.

Inside a run event ids and causes are ints (an event's index); a record writes
them as "e<index>".
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class EventKind(StrEnum):
    """What happened, in the order a request meets them (docs/kvsim.md lists when each is emitted)."""

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


def event_json(event: CacheEvent) -> dict:
    """The record's CacheEvent object, fields in CacheEvent order."""
    return {
        **event._asdict(),
        "event_id": f"e{event.event_id}",
        "causes": [f"e{c}" for c in event.causes],
    }


def measurement_json(measurement: Measurement) -> dict:
    return {**measurement._asdict(), "event_id": f"e{measurement.event_id}"}
