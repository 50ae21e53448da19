"""A CacheRun as Chrome/Perfetto trace JSON (open it in ui.perfetto.dev), written as the record is read.

Tracks, whatever the number of requests:

* **KV bytes**: a counter track with two series, device (reservations plus
  retained states) and host, written whenever either changes;
* **compute**: one slice per service step, from compute start to compute end;
* **link**: one slice per transfer, from transfer start to transfer end;
* **events**: every CacheEvent as an instant named by its kind, its request,
  state, bytes, detail and causes (event ids) in its arguments.

Causes are arguments, not flow arrows: an arrow binds to a slice, and a slice
per event on a track per request made a 5,000-request trace 92 MB. Timestamps
are virtual microseconds, which is the trace format's unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from jgpt.foundation.errors import ApiError
from kvsim.cache_event import CacheEvent, EventKind
from kvsim.cache_run import dumps

PID, COMPUTE_TID, LINK_TID, EVENTS_TID = 1, 1, 2, 3
_BATCH = 4096  # trace entries encoded per write
_STARTS = {EventKind.COMPUTE_END: EventKind.COMPUTE_START, EventKind.TRANSFER_END: EventKind.TRANSFER_START}


def trace_chunks(entries: Iterable[tuple[str, Any]]) -> Iterator[bytes]:
    """The trace's JSON bytes from a record's entries (`record_lines.streamed_view` or `whole_view`)."""
    entries = iter(entries)
    _, head = next(entries)
    metadata = [
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": "kvsim"}},
        *({"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": name}}
          for tid, name in ((COMPUTE_TID, "compute"), (LINK_TID, "link"), (EVENTS_TID, "events"))),
    ]  # fmt: skip
    yield b'{"traceEvents":[' + _encoded(metadata)
    budgets = head["declaration"]["system"]["kv_cache"]
    trace: list[dict] = []
    occupancy, run_id = (-1, -1), None
    opened: dict[tuple[str | None, EventKind], CacheEvent] = {}  # starts awaiting their end
    for section, value in entries:
        if section == "event":
            occupancy = _drawn(value, occupancy, opened, trace)
            if len(trace) >= _BATCH:
                yield b"," + _encoded(trace)
                trace.clear()
        elif section == "end":
            run_id = value["id"]
    if trace:
        yield b"," + _encoded(trace)
    other = {"record": run_id, "clock": "virtual_us", "device_kv_bytes": budgets["device_kv_bytes"],
             "host_kv_bytes": budgets["host_kv_bytes"]}  # fmt: skip
    yield b'],"displayTimeUnit":"ms","otherData":' + dumps(other) + b"}\n"


def _drawn(event: CacheEvent, occupancy: tuple[int, int], opened: dict, trace: list[dict]) -> tuple[int, int]:
    """Appends what one event draws; returns the occupancy after it."""
    ts, kind = event.time_us, event.kind
    now = (event.device_reserved_bytes, event.host_retained_bytes)
    if now != occupancy:
        trace.append({"ph": "C", "pid": PID, "ts": ts, "name": "KV bytes", "args": {"device": now[0], "host": now[1]}})
    args: dict[str, Any] = {"event": event.event_id, "request": event.request_id}
    for name in ("state_id", "bytes", "detail", "phase", "transfer_direction"):
        value = getattr(event, name)
        if value not in (None, "", 0):
            args[name] = value
    if event.causes:
        args["causes"] = list(event.causes)
    trace.append({"ph": "i", "s": "t", "pid": PID, "tid": EVENTS_TID, "ts": ts, "name": kind, "args": args})
    if kind in (EventKind.COMPUTE_START, EventKind.TRANSFER_START):
        opened[(event.request_id if kind == EventKind.COMPUTE_START else event.state_id, kind)] = event
    elif kind in _STARTS:
        start = opened.pop((event.request_id if kind == EventKind.COMPUTE_END else event.state_id, _STARTS[kind]), None)
        if start is None:
            raise ApiError(f"record event {event.event_id}", f"{kind} without a {_STARTS[kind]} before it")
        computed = kind == EventKind.COMPUTE_END
        trace.append({
            "ph": "X", "pid": PID, "tid": COMPUTE_TID if computed else LINK_TID, "ts": start.time_us,
            "dur": ts - start.time_us, "cat": "kvsim",
            "name": f"{start.phase} {start.request_id}" if computed else f"{start.transfer_direction} {start.state_id}",
            "args": {"start": start.event_id, "end": event.event_id},
        })  # fmt: skip
    return now


def _encoded(items: list) -> bytes:
    """Items joined by commas, without the list's brackets."""
    return dumps(items)[1:-1]
