"""The parts of a CacheRun record that `plot` and `perfetto` draw, checked before drawing.

`replay` trusts nothing but the declaration (it re-runs it and compares bytes), but the
viewers read a record's events and outcomes as written. A record edited by hand (events
that are strings, a cause naming a later event, a time of 1e308) must be refused naming
the field, not fail half-way through a drawing. Every number a viewer reads is an integer
of at most 2^53 (285 years in microseconds, 9 PB), so a plot can never overflow a float.
"""

from __future__ import annotations

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import Integer, ListOf, MapOf, Nullable, Object, String, array, integer, loose_mapping

_INT, _TEXT = Integer(minimum=None), String()
EVENT = Object(
    {"event_id": _TEXT, "request_id": _TEXT, "time_us": _INT, "kind": _TEXT, "state_id": Nullable(_TEXT),
     "bytes": _INT, "device_reserved_bytes": _INT, "host_retained_bytes": _INT, "detail": _TEXT,
     "causes": ListOf(_TEXT), "phase": Nullable(_TEXT), "transfer_direction": Nullable(_TEXT)},
    open=True,
    about="ExperimentEvent (CacheEvent): one state change, with the earlier events that caused it.",
)  # fmt: skip
OUTCOME = Object(
    {"status": _TEXT, "arrival_us": _INT, "admitted_us": Nullable(_INT), "first_token_us": Nullable(_INT),
     "end_us": _INT, "ttft_us": Nullable(_INT), "e2e_us": Nullable(_INT)},
    open=True,
)  # fmt: skip
OUTCOMES = Object({"requests": MapOf(OUTCOME)}, open=True)


def check_viewable(record: dict) -> dict:
    """`record` (from `read_record`) when its events, outcomes and KV budgets are what kvsim writes."""
    budgets = loose_mapping(
        loose_mapping(loose_mapping(record["declaration"], "record.declaration", {"system"})["system"],
                      "record.declaration.system", {"kv_cache"})["kv_cache"],
        "record.declaration.system.kv_cache", {"device_kv_bytes", "host_kv_bytes"})  # fmt: skip
    for name in ("device_kv_bytes", "host_kv_bytes"):
        integer(budgets[name], f"record.declaration.system.kv_cache.{name}", minimum=None)
    outcomes = OUTCOMES.read(record["outcomes"], "record.outcomes")["requests"]
    seen: set[str] = set()
    for index, event in enumerate(array(record["events"], "record.events")):
        at = f"record.events[{index}]"
        EVENT.read(event, at)
        if event["request_id"] not in outcomes:
            raise ApiError(f"{at}.request_id", f"{event['request_id']!r} has no outcome in record.outcomes.requests")
        for cause in event["causes"]:
            if cause not in seen:
                raise ApiError(f"{at}.causes", f"{cause!r} is not an earlier event")
        seen.add(event["event_id"])
    return record
