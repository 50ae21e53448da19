"""A CacheRun as Chrome/Perfetto trace JSON (open it in ui.perfetto.dev).

One track per request holds its events as 1 us slices named by kind (so flow
arrows can bind to them); the compute track shows each service step and the
link track each transfer as a slice of its virtual duration. Every cause
becomes a flow arrow from the cause's slice to the effect's slice. Timestamps
are virtual microseconds, which is the trace format's unit.
"""

from __future__ import annotations

from jgpt.errors import ApiError

PID, COMPUTE_TID, LINK_TID, FIRST_REQUEST_TID = 1, 1, 2, 10


def trace_events(record: dict) -> dict:
    tids = {request_id: FIRST_REQUEST_TID + i for i, request_id in enumerate(record["outcomes"]["requests"])}
    out = [
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": f"kvsim {record['id']}"}},
        {"ph": "M", "pid": PID, "tid": COMPUTE_TID, "name": "thread_name", "args": {"name": "compute"}},
        {"ph": "M", "pid": PID, "tid": LINK_TID, "name": "thread_name", "args": {"name": "link"}},
        *(
            {"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": rid}}
            for rid, tid in tids.items()
        ),
    ]
    where: dict[str, tuple[int, int]] = {}  # event_id -> (tid, ts)
    opened: dict[tuple[str, str | None], dict] = {}  # compute or transfer start awaiting its end
    for event in record["events"]:
        tid, ts = tids[event["request_id"]], event["time_us"]
        where[event["event_id"]] = (tid, ts)
        args = {k: v for k, v in event.items() if k not in ("time_us", "causes") and v not in (None, "")}
        out.append(
            {"ph": "X", "pid": PID, "tid": tid, "ts": ts, "dur": 1, "name": event["kind"], "cat": "kvsim", "args": args}
        )
        kind = event["kind"]
        if kind in ("compute_start", "transfer_start"):
            opened[(event["request_id"] if kind == "compute_start" else event["state_id"], kind)] = event
        elif kind in ("compute_end", "transfer_end"):
            start_kind = kind.replace("_end", "_start")
            start = opened.pop((event["request_id"] if kind == "compute_end" else event["state_id"], start_kind), None)
            if start is None:
                raise ApiError(f"record.events.{event['event_id']}", f"{kind} without a {start_kind} before it")
            name = (
                f"{start['phase']} {start['request_id']}"
                if kind == "compute_end"
                else f"{start['transfer_direction']} {start['state_id']}"
            )
            out.append({
                "ph": "X", "pid": PID, "tid": COMPUTE_TID if kind == "compute_end" else LINK_TID,
                "ts": start["time_us"], "dur": ts - start["time_us"], "name": name, "cat": "kvsim",
                "args": {"start": start["event_id"], "end": event["event_id"]},
            })  # fmt: skip
        for cause in event["causes"]:
            cause_tid, cause_ts = where[cause]
            flow = {"name": "cause", "cat": "kvsim", "pid": PID, "id": len(out)}  # the id is unique: an index
            out.append({**flow, "ph": "s", "tid": cause_tid, "ts": cause_ts})
            out.append({**flow, "ph": "f", "bp": "e", "tid": tid, "ts": ts})
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"record": record["id"], "clock": "virtual_us"}}
