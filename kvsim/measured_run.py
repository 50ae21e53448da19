"""A measured-run document as kvsim reads it: its fields checked, and the serving thread's times per work.

`inference.measured_run` writes the document (docs/measured-run.md) from an InferenceEngine's run;
kvsim reads it without jax. `read_measured_run` checks every field that calibration (kvsim.calibration)
and prediction (kvsim.fidelity) read; `host_gaps`, `idle_us`, `after_other` and `finishes` say, per
work in the order the engine's serving thread ran them, what the thread did around it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jgpt.foundation import validation
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes
from kvsim.cache_run import load_json
from kvsim.compute_service import DECODE, PREFILL
from kvsim.system import parse_system
from kvsim.workload import parse_workload

FORMAT = "jgpt-measured-run"
VERSION = 1
WORK_KINDS = (PREFILL, DECODE, "offload", "reload")
# A work's wall_us is its end_us - start_us (the engine writes exactly that); a writer that rounds each of the
# three from its own clock reading may be 1 us off.
WALL_TOLERANCE_US = 1


@dataclass(frozen=True)
class MeasuredRun:
    """The parts of a measured-run document that calibration and prediction read."""

    document: dict  # the whole document, as read
    sha256: str  # of the file's bytes
    works: tuple[dict, ...]
    slot_rows: int | None  # rows of the engine's slot state (residuals are reported per rows); None if not given
    retained_bytes_per_position: int  # KV bytes a finished request retains per position (0: the run retains nothing)
    slot_capacity: int
    prefill_window_buckets: tuple[int, ...]
    decode_batch_buckets: tuple[int, ...]


def load_measured_run(path: Path, field: str) -> MeasuredRun:
    data = read_bytes(path, field)
    return read_measured_run(load_json(data, field), hashlib.sha256(data).hexdigest(), field)


def read_measured_run(value: Any, sha256: str, field: str = "measured") -> MeasuredRun:
    top = validation.loose_mapping(
        value,
        field,
        {"format", "version", "execution", "machine", "system", "engine", "workload", "computations", "works",
         "requests", "totals", "kv_bytes_per_position"},
    )  # fmt: skip
    kv_bytes = validation.integer(top["kv_bytes_per_position"], f"{field}.kv_bytes_per_position")
    if top["format"] != FORMAT:
        raise ApiError(f"{field}.format", f"expected {FORMAT!r}, got {top['format']!r}")
    if top["version"] != VERSION:
        raise ApiError(f"{field}.version", f"kvsim reads version {VERSION}, got {top['version']!r}")
    execution = validation.loose_mapping(top["execution"], f"{field}.execution", {"backend"})
    validation.loose_mapping(execution["backend"], f"{field}.execution.backend", set())
    validation.loose_mapping(top["machine"], f"{field}.machine", set())
    system = parse_system(top["system"], f"{field}.system")
    engine = validation.loose_mapping(
        top["engine"], f"{field}.engine", {"slot_capacity", "prefill_window_buckets", "decode_batch_buckets"}
    )
    requests = validation.loose_mapping(top["requests"], f"{field}.requests", set())
    for request_id, outcome in requests.items():
        names = ("arrival_us", "prompt_positions", "selected_tokens")
        outcome = validation.loose_mapping(outcome, f"{field}.requests.{request_id}", set(names))
        for name in names:
            validation.integer(outcome[name], f"{field}.requests.{request_id}.{name}")
    works = tuple(
        _work(w, f"{field}.works[{i}]") for i, w in enumerate(validation.array(top["works"], f"{field}.works"))
    )
    for index, work in enumerate(works):
        if unknown := [r for r in work["request_ids"] if r not in requests]:
            raise ApiError(f"{field}.works[{index}].request_ids", f"request {unknown[0]!r} is not in {field}.requests")
    for index, arrival in enumerate(parse_workload(top["workload"], f"{field}.workload").requests):
        if arrival.request_id not in requests:
            raise ApiError(
                f"{field}.workload.requests[{index}]", f"request {arrival.request_id!r} is not in {field}.requests"
            )
    _check_totals(top["totals"], f"{field}.totals")
    return MeasuredRun(
        document=top,
        sha256=sha256,
        works=works,
        retained_bytes_per_position=kv_bytes if system.kv_cache.retention_policy == "lru" else 0,
        slot_rows=validation.integer(engine["slot_rows"], f"{field}.engine.slot_rows", 1)
        if "slot_rows" in engine
        else None,
        slot_capacity=validation.integer(engine["slot_capacity"], f"{field}.engine.slot_capacity", 1),
        prefill_window_buckets=tuple(
            validation.integers(engine["prefill_window_buckets"], f"{field}.engine.prefill_window_buckets", 1)
        ),
        decode_batch_buckets=tuple(
            validation.integers(engine["decode_batch_buckets"], f"{field}.engine.decode_batch_buckets", 1)
        ),
    )


def _check_totals(value: Any, field: str) -> None:
    """The totals a prediction is compared with: latency percentiles, hit rates, compute busy time."""
    totals = validation.loose_mapping(value, field, {"latency_us", "hit_rate_device", "hit_rate_host", "token_hit_rate",
                                                 "compute_busy_us"})  # fmt: skip
    latency = validation.loose_mapping(totals["latency_us"], f"{field}.latency_us", {"ttft", "tpot", "e2e"})
    for name in ("ttft", "tpot", "e2e"):
        percentiles = validation.loose_mapping(latency[name], f"{field}.latency_us.{name}", {"p50", "p90"})
        for p in ("p50", "p90"):
            _optional_number(percentiles[p], f"{field}.latency_us.{name}.{p}")
    for name in ("hit_rate_device", "hit_rate_host", "token_hit_rate"):
        _optional_number(totals[name], f"{field}.{name}")
    validation.integer(totals["compute_busy_us"], f"{field}.compute_busy_us")


def _optional_number(value: Any, field: str) -> None:
    if value is not None:
        validation.number(value, field)


def _work(value: Any, field: str) -> dict:
    work = validation.loose_mapping(
        value,
        field,
        {"kind", "request_ids", "rows", "executed_rows", "window", "reused_positions", "matmul_flops",
         "logical_memory_bytes", "bytes", "start_us", "end_us", "wall_us"},
    )  # fmt: skip
    validation.string(work["kind"], f"{field}.kind", WORK_KINDS)
    request_ids = validation.array(work["request_ids"], f"{field}.request_ids")
    if not request_ids:  # every work is done for some request: the fit reads when its requests arrived
        raise ApiError(f"{field}.request_ids", "must name at least one request")
    for index, request_id in enumerate(request_ids):
        validation.string(request_id, f"{field}.request_ids[{index}]")
    for name in ("rows", "executed_rows", "window", "reused_positions", "matmul_flops", "logical_memory_bytes", "bytes",
                 "start_us", "end_us", "wall_us"):  # fmt: skip
        validation.integer(work[name], f"{field}.{name}")
    # The fit reads wall_us and the idle times between works read start_us and end_us: a work whose wall
    # contradicts them would be fitted as two different works.
    start, end, wall = work["start_us"], work["end_us"], work["wall_us"]
    if end < start or abs(wall - (end - start)) > WALL_TOLERANCE_US:
        raise ApiError(
            f"{field}.wall_us",
            f"{wall} contradicts start_us {start} and end_us {end} (end - start = {end - start}; "
            f"they may differ by at most {WALL_TOLERANCE_US} us)",
        )
    return work


def host_gaps(run: MeasuredRun) -> list[int]:
    """Per work, in the order the engine's serving thread ran them: the host time it spent before the work.

    That is the time from when the thread could have started it (the end of what it ran before, or the
    arrival of the work's last request if later) to its start: scheduling and bookkeeping (admission,
    retaining a finished request's state, the read of selected ids), never idle time.
    """
    requests = run.document["requests"]
    gaps, previous = [], 0
    for work in run.works:
        ready = max(previous, *(requests[r]["arrival_us"] for r in work["request_ids"]))
        gaps.append(max(0, work["start_us"] - ready))
        previous = work["end_us"]
    return gaps


def after_other(run: MeasuredRun) -> list[int]:
    """Per work, in the serving thread's order: 1 if the thread ran another kind of work or a transfer just
    before it, else 0 (the first work, or one after a work of its own kind)."""
    kinds = [w["kind"] for w in run.works]
    return [int(index > 0 and kinds[index - 1] != kind) for index, kind in enumerate(kinds)]


def idle_us(run: MeasuredRun) -> list[int]:
    """Per work, in the serving thread's order: how long the engine had been idle when it started, from the
    end of everything the thread ran before it to the arrival of its last request (0: it was busy)."""
    requests = run.document["requests"]
    idle, previous = [], -1
    for work in run.works:
        idle.append(max(0, max(requests[r]["arrival_us"] for r in work["request_ids"]) - previous))
        previous = work["end_us"]
    return idle


def finishes(run: MeasuredRun) -> list[tuple[int, int]]:
    """Per work, in the serving thread's order: (requests that ended with it, the bytes of the states they
    retain). A request ends with the last compute work it took part in; it retains every position it
    computed (a sequence already retained, rarely, is counted too) unless the run retains nothing."""
    last = {r: index for index, w in enumerate(run.works) if w["kind"] in (PREFILL, DECODE) for r in w["request_ids"]}
    ended = [(0, 0) for _ in run.works]
    for request_id, index in last.items():
        outcome = run.document["requests"][request_id]
        computed = outcome["prompt_positions"] + max(0, outcome["selected_tokens"] - 1)
        count, size = ended[index]
        ended[index] = (count + 1, size + computed * run.retained_bytes_per_position)
    return ended
