"""The parts of a CacheRun record that `plot` and `perfetto` draw, checked before drawing.

`replay` trusts nothing but the declaration (it re-runs it and compares bytes), but the
viewers read a record's events and outcomes as written. A record edited by hand (events
that are strings, a cause naming a later event, a time of 1e308) must be refused naming
the field, not fail half-way through a drawing. Every number a viewer reads is an integer
of at most 2^53 (285 years in microseconds, 9 PB), so a plot can never overflow a float.
"""

from __future__ import annotations

from typing import Any

from jgpt.errors import ApiError
from kvsim import fields

LIMIT = fields.LIMIT
EVENT = {
    "event_id": str, "request_id": str, "time_us": int, "kind": str, "state_id": (str, None), "bytes": int,
    "device_reserved_bytes": int, "host_retained_bytes": int, "detail": str, "causes": list, "phase": (str, None),
    "transfer_direction": (str, None),
}  # fmt: skip
OUTCOME = {
    "status": str, "arrival_us": int, "admitted_us": (int, None), "first_token_us": (int, None), "end_us": int,
    "ttft_us": (int, None), "e2e_us": (int, None),
}  # fmt: skip


def check_viewable(record: dict) -> dict:
    """`record` (from `read_record`) when its events, outcomes and KV budgets are what kvsim writes."""
    budgets = fields.loose_mapping(
        fields.loose_mapping(fields.loose_mapping(record["declaration"], "record.declaration", {"system"})["system"],
                             "record.declaration.system", {"kv_cache"})["kv_cache"],
        "record.declaration.system.kv_cache", {"device_kv_bytes", "host_kv_bytes"})  # fmt: skip
    for name in ("device_kv_bytes", "host_kv_bytes"):
        _value(budgets[name], int, f"record.declaration.system.kv_cache.{name}")
    outcomes = fields.loose_mapping(record["outcomes"], "record.outcomes", {"requests"})["requests"]
    if not isinstance(outcomes, dict):
        raise ApiError("record.outcomes.requests", "expected an object of request outcomes")
    for request_id, outcome in outcomes.items():
        _shaped(outcome, OUTCOME, f"record.outcomes.requests.{request_id}")
    seen: set[str] = set()
    for index, event in enumerate(fields.array(record["events"], "record.events")):
        at = f"record.events[{index}]"
        _shaped(event, EVENT, at)
        if event["request_id"] not in outcomes:
            raise ApiError(f"{at}.request_id", f"{event['request_id']!r} has no outcome in record.outcomes.requests")
        for cause in event["causes"]:
            if not isinstance(cause, str) or cause not in seen:
                raise ApiError(f"{at}.causes", f"{cause!r} is not an earlier event")
        seen.add(event["event_id"])
    return record


def _shaped(value: Any, shape: dict[str, Any], field: str) -> None:
    fields.loose_mapping(value, field, set(shape))
    for name, kind in shape.items():
        _value(value[name], kind, f"{field}.{name}")


def _value(value: Any, kind: Any, field: str) -> None:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if value is None and None in kinds:
        return
    if int in kinds and type(value) is int:
        if not -LIMIT <= value <= LIMIT:
            raise ApiError(field, f"must be at most 2^53 in magnitude, got {value}")
        return
    if not any(k is not None and k is not int and isinstance(value, k) for k in kinds):
        names = " or ".join("null" if k is None else {int: "an integer", str: "a string", list: "an array"}[k]
                            for k in kinds)
        raise ApiError(field, f"expected {names}, got {type(value).__name__}")
