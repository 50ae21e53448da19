"""Calibration: fit the calibrated ComputeService and StateTransfer to an InferenceEngine's measured works.

`jgpt kvsim calibrate MEASURED.json [...] --out SERVICE.json` reads measured-run
documents (docs/measured-run.md), fits each kind of work's latency terms by
non-negative least squares (numpy only; kvsim stays jax-free), and writes a
system fragment: `{"compute_service", "transfer", "calibration"}`, whose keys
replace the same keys of a system (`merge_service`). The terms and what they
stand for are in docs/kvsim.md ("Calibrated service"). The fragment's `spread`
holds, per kind of compute work, quantiles of the works' measured / fitted
times, which a simulation draws each work's multiplier from.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jgpt.foundation import validation
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes
from kvsim.cache_run import load_json
from kvsim.compute_service import (
    AFTER_OTHER_US,
    CALIBRATED,
    DECODE,
    DEVICE_TO_HOST,
    HOST_TO_DEVICE,
    PREFILL,
    SIZE_TERMS,
    term_names,
)
from kvsim.system import parse_system
from kvsim.workload import parse_workload

FORMAT = "jgpt-measured-run"
VERSION = 1
WORK_KINDS = (PREFILL, DECODE, "offload", "reload")
DIRECTIONS = {"offload": DEVICE_TO_HOST, "reload": HOST_TO_DEVICE}
HOST = "host"  # the fit of the host time before compute works (step overhead) and after a finish
FINISH, SPREAD, AFTER_OTHER = "finish", "spread", "after_other"
FINISH_TERMS = ("fixed_us", "per_byte_us", "per_slot_us")  # a finish's terms, as the fragment writes them
# The terms a fit may leave out (bench/fidelity.py compares the model with and without each).
OPTIONAL_TERMS = (FINISH, SPREAD, AFTER_OTHER)
# A spread's quantiles: at this many evenly spaced probabilities from SPREAD_TAIL to 1 - SPREAD_TAIL (the
# most extreme works, single stalls, are left out; the distribution's mean is then scaled back to 1).
SPREAD_POINTS, SPREAD_TAIL = 41, 0.005
POSITION_BIN = 32  # decode residuals are reported per this many context positions a row held
SIGNIFICANT_DIGITS = 6  # fitted parameters are written with this many, and read back as those exact decimals
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


@dataclass(frozen=True)
class KindFit:
    """One kind of work's fitted terms and how well they reproduce the measured walls."""

    kind: str
    terms: dict[str, float]
    count: int
    mean_wall_us: float
    mean_error_us: float  # mean |predicted - measured|
    mean_relative_error: float
    p90_relative_error: float
    spread: tuple[float, ...]  # quantiles of measured / fitted per work, of mean 1 (see `spread_quantiles`)
    # per shape (prefill window; decode rows, and the context positions a row held; the engine's slot capacity
    # and slot rows; finishes before a work): (count, (fitted - measured) / measured of the works' total time)
    residuals: dict[str, tuple[int, float]]


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


# -- the fit -----------------------------------------------------------------------------------------------------


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0, exactly, for a handful of columns.

    The optimum is the unconstrained least-squares solution on its own support, so
    trying every support and keeping the best non-negative solution finds it (2^n
    small solves; calibration fits at most nine columns).
    """
    n = a.shape[1]
    scale = np.where(np.abs(a).max(axis=0) > 0, np.abs(a).max(axis=0), 1.0)  # conditioning: columns of unit size
    scaled = a / scale
    best, best_residual = np.zeros(n), float(np.sum(b * b))
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            columns = list(support)
            solution = np.linalg.lstsq(scaled[:, columns], b, rcond=None)[0]
            if np.any(solution < 0):
                continue
            residual = float(np.sum((scaled[:, columns] @ solution - b) ** 2))
            if residual < best_residual:
                best, best_residual = np.zeros(n), residual
                best[columns] = solution
    return best / scale


def fit(runs: list[MeasuredRun], optional: tuple[str, ...] = OPTIONAL_TERMS) -> tuple[dict, list[KindFit], list[str]]:
    """The system fragment fitted to every work of the runs, the fit's error per kind, and notes.

    `optional` names the optional terms to fit (OPTIONAL_TERMS); the others are left out of the fragment, which
    then behaves as a fragment written before they existed."""
    windows = tuple(sorted({b for run in runs for b in run.prefill_window_buckets}))
    batches = tuple(sorted({b for run in runs for b in run.decode_batch_buckets}))
    fits: list[KindFit] = []
    notes: list[str] = []
    # The fragment is JSON: each key holds its own kind of value (a model name, terms, bucket lists).
    compute: dict[str, Any] = {"model": CALIBRATED}
    spread: dict[str, Any] = {"seed": 0}
    compute_works = {kind: [(w, run.slot_capacity, idle, other) for run in runs
                            for w, idle, other in zip(run.works, idle_us(run), after_other(run), strict=True)
                            if w["kind"] == kind]
                     for kind in (PREFILL, DECODE)}  # fmt: skip
    with_other = AFTER_OTHER in optional
    shapes = {kind: [_shapes(w) + _engine_shapes(run) for run in runs for w in run.works if w["kind"] == kind]
              for kind in (PREFILL, DECODE)}  # fmt: skip
    if missing := [kind for kind, kind_works in compute_works.items() if not kind_works]:
        raise ApiError("MEASURED", f"no {missing[0]} works to fit")
    # With one slot capacity the per-slot terms cannot be told from the fixed ones: they are fit as 0.
    vary = len({run.slot_capacity for run in runs}) > 1
    minimum = idle_minimum(compute_works, vary, with_other)
    for kind, kind_works in compute_works.items():
        columns = _columns(kind, kind_works, vary, minimum, with_other)
        works = [w for w, _, _, _ in kind_works]
        kind_fit = _fit_kind(kind, _column_names(kind, kind_works, with_other), columns, works, shapes[kind])
        fits.append(kind_fit)
        compute[kind] = _nested(kind, kind_fit.terms)
        spread[kind] = list(kind_fit.spread)
    finish = host = None
    if FINISH in optional:
        host = host_fit(runs, vary)
        compute["step_overhead_us"] = host.terms["step_overhead_us"]
        finish = {name: host.terms[f"finish.{name}"] for name in FINISH_TERMS if f"finish.{name}" in host.terms}
    else:
        compute["step_overhead_us"] = _round(step_overhead_us(runs))
    compute["after_idle_min_us"] = minimum
    compute["slot_capacity"] = max(run.slot_capacity for run in runs)
    compute["prefill_window_buckets"], compute["decode_batch_buckets"] = list(windows), list(batches)
    if finish is not None:
        compute[FINISH] = finish
    if SPREAD in optional:
        compute[SPREAD] = spread
    fragment: dict[str, Any] = {"compute_service": compute}
    transfer: dict[str, dict[str, float]] = {}
    for kind, direction in DIRECTIONS.items():
        # A transfer's time includes the host time before it, as the serving thread spent it, less the host
        # time after a finish that kvsim charges before it.
        works = [w | {"wall_us": gap + w["wall_us"]} for run in runs
                 for gap, w in zip(transfer_gaps(run, finish), run.works, strict=True) if w["kind"] == kind]  # fmt: skip
        if works:
            columns = [[1] * len(works), [w["bytes"] for w in works]]
            kind_fit = _fit_kind(kind, ("latency_us", "per_byte_us"), columns, works, [()] * len(works))
            fits.append(kind_fit)
            transfer[direction] = kind_fit.terms
    if host is not None:
        fits.append(host)
    if len(transfer) == 1:
        (measured,) = transfer
        other = DEVICE_TO_HOST if measured == HOST_TO_DEVICE else HOST_TO_DEVICE
        transfer[other] = transfer[measured]
        notes.append(f"no {other} transfers were measured: they take the {measured} terms")
    if transfer:
        # An engine that says its transfers are synchronous runs them on its serving thread.
        blocks = any(run.document["engine"].get("transfers") == "synchronous" for run in runs)
        fragment["transfer"] = (
            {"model": CALIBRATED}
            | {d: transfer[d] for d in (DEVICE_TO_HOST, HOST_TO_DEVICE)}
            | {"blocks_compute": blocks}
        )
    else:
        notes.append("no transfers were measured: the fragment leaves the system's transfer as it is")
    first = runs[0].document
    fragment["calibration"] = {
        "backend": first["execution"]["backend"],
        "machine": first["machine"],
        "sources": [run.sha256 for run in runs],
        "works": sum(len(run.works) for run in runs),
    }
    if any(run.document["machine"] != first["machine"] for run in runs[1:]):
        notes.append("the measured runs come from different machines; the calibration names the first")
    if not vary:
        notes.append(f"every run had {runs[0].slot_capacity} slots, so per_slot_us is 0 and the fixed times hold the "
                     "slots' share: calibrate on runs of two slot capacities to predict others")  # fmt: skip
    return fragment, fits, notes


def fitted_terms(fragment: Any) -> tuple[str, ...]:
    """The optional terms a fragment holds: fitting the same runs with them gives the fragment back, so a
    replay of a record calibrated before a term existed refits without it (`fit(runs, ())` is the fit of then)."""
    compute = fragment.get("compute_service") if isinstance(fragment, dict) else None
    if not isinstance(compute, dict):
        return ()
    prefill = compute.get(PREFILL)
    held = {*compute} | ({AFTER_OTHER} if isinstance(prefill, dict) and AFTER_OTHER_US in prefill else set())
    return tuple(term for term in OPTIONAL_TERMS if term in held)


def _shapes(work: dict) -> tuple[str, ...]:
    """The shapes a work's residual is reported under: its executed window; or its executed rows and the
    context positions its rows held (a decode step's FLOPs and bytes grow with them: attention over the
    context), in bins of POSITION_BIN."""
    if work["kind"] == PREFILL:
        return (f"window {work['window']}",)
    position = work["reused_positions"] // max(1, work["rows"]) // POSITION_BIN * POSITION_BIN
    return f"rows {work['executed_rows']}", f"position {position}"


def _engine_shapes(run: MeasuredRun) -> tuple[str, ...]:
    """The engine's shapes a work's residual is also reported under: its slot capacity and slot rows."""
    return (f"capacity {run.slot_capacity}",) + (() if run.slot_rows is None else (f"slot rows {run.slot_rows}",))


def idle_minimum(compute_works: dict[str, list[tuple[dict, int, int, int]]], vary: bool, other: bool) -> int:
    """The least idle time after which a work runs cold: of 0 (any idle time) and every idle time measured
    before a work, the one with which least squares fits both kinds of work best (the earliest on a tie)."""

    # Only the last column (woke the engine) depends on the minimum: the others are built and scaled once
    # (conditioning, as in nnls; the last column's scale is 1), which keeps a fit of many runs fast.
    fixed = {}
    for kind, works in compute_works.items():
        a = np.asarray(_columns(kind, works, vary, 0, other)[:-1], dtype=np.float64).T
        a /= np.where(np.abs(a).max(axis=0) > 0, np.abs(a).max(axis=0), 1.0)
        idle = np.asarray([idle for _, _, idle, _ in works], dtype=np.float64)
        fixed[kind] = (a, idle, np.asarray([w["wall_us"] for w, _, _, _ in works], dtype=np.float64))

    def residual(minimum: int) -> float:
        total = 0.0
        for a, idle, wall in fixed.values():
            woke = ((idle > 0) & (idle >= minimum)).astype(np.float64)[:, None]
            columns = np.hstack([a, woke])
            total += float(np.sum((columns @ np.linalg.lstsq(columns, wall, rcond=None)[0] - wall) ** 2))
        return total

    return min(sorted({0, *(idle for works in compute_works.values() for _, _, idle, _ in works)}), key=residual)


def _batch_sizes(works: list[tuple[dict, int, int, int]]) -> list[int]:
    """The decode batch sizes above one row that the works executed (each gets its own time)."""
    return sorted({w["executed_rows"] for w, _, _, _ in works} - {1})


def _columns(
    kind: str, works: list[tuple[dict, int, int, int]], vary: bool, idle_minimum: int, other: bool
) -> list[list[int]]:
    """The fit's columns in `_column_names` order (waking the engine last); a work counts as waking the engine
    when idle >= `idle_minimum`; with `other`, a column for the works that followed another kind of work."""
    if kind == PREFILL:
        sizes = [[w["window"] for w, _, _, _ in works]]
    else:  # one column per executed batch size: what it adds to a one-row step
        sizes = [[int(w["executed_rows"] == rows) for w, _, _, _ in works] for rows in _batch_sizes(works)]
    return [
        [1] * len(works),
        *sizes,
        [slots if vary else 0 for _, slots, _, _ in works],
        [w["matmul_flops"] for w, _, _, _ in works],
        [w["logical_memory_bytes"] for w, _, _, _ in works],
        *([[after for _, _, _, after in works]] if other else []),
        [int(idle > 0 and idle >= idle_minimum) for _, _, idle, _ in works],
    ]


def _column_names(kind: str, works: list[tuple[dict, int, int, int]], other: bool) -> list[str]:
    """The names of `_columns`, a decode step's batch sizes as "per_batch_us.ROWS"."""
    first, size, *rest, idle = term_names(kind)
    sizes = [size] if kind == PREFILL else [f"{size}.{rows}" for rows in _batch_sizes(works)]
    return [first, *sizes, *rest, *([AFTER_OTHER_US] if other else []), idle]


def _nested(kind: str, terms: dict) -> dict:
    """The fitted terms as the service JSON has them (the required terms in order, then the optional one); a
    decode step's batch sizes gathered in one object."""
    size = SIZE_TERMS[kind]
    times = {name.split(".")[1]: value for name, value in terms.items() if name.startswith(f"{size}.")}
    names = (*term_names(kind), *([AFTER_OTHER_US] if AFTER_OTHER_US in terms else []))
    return {name: times if kind == DECODE and name == size else terms[name] for name in names}


def _fit_kind(
    kind: str,
    names: list[str] | tuple[str, ...],
    columns: list[list[int]],
    works: list[dict],
    shapes: list[tuple[str, ...]],
) -> KindFit:
    """Non-negative least squares of the works' walls on the columns; residuals per shape a work has."""
    a = np.asarray(columns, dtype=np.float64).T
    wall = np.asarray([w["wall_us"] for w in works], dtype=np.float64)
    terms = {name: _round(value) for name, value in zip(names, nnls(a, wall), strict=True)}
    predicted = a @ np.asarray([terms[name] for name in names])
    relative = np.abs(predicted - wall) / np.maximum(wall, 1.0)
    # Of totals, not a mean of ratios: a work's noise is skewed (stalls), and a mean of ratios reads it as a bias.
    residuals = {
        shape: (int(np.sum(mask)), float((predicted[mask].sum() - wall[mask].sum()) / max(wall[mask].sum(), 1.0)))
        for shape in sorted({s for labels in shapes for s in labels}, key=_shape_order)
        if (mask := np.asarray([shape in labels for labels in shapes])).any()
    }
    return KindFit(
        kind=kind,
        terms=terms,
        count=len(works),
        mean_wall_us=float(wall.mean()),
        mean_error_us=float(np.abs(predicted - wall).mean()),
        mean_relative_error=float(relative.mean()),
        p90_relative_error=float(np.percentile(relative, 90)),
        spread=spread_quantiles(wall / np.maximum(predicted, 1.0)),
        residuals=residuals,
    )


def spread_quantiles(ratios: np.ndarray) -> tuple[float, ...]:
    """The quantiles a spread draws a work's multiplier from: of the measured / fitted ratios, at SPREAD_POINTS
    evenly spaced probabilities from SPREAD_TAIL to 1 - SPREAD_TAIL, scaled so the piecewise-linear
    distribution they give has mean 1 (a spread adds no time on average: the fit's terms are the means)."""
    quantiles = np.percentile(ratios, 100 * np.linspace(SPREAD_TAIL, 1 - SPREAD_TAIL, SPREAD_POINTS))
    mean = float(np.mean((quantiles[:-1] + quantiles[1:]) / 2))
    if mean <= 0:  # every work measured 0 us: nothing to spread
        return (1, 1)
    return tuple(_round(q / mean) for q in quantiles)


def _shape_order(shape: str) -> tuple[str, int]:
    name, _, number = shape.rpartition(" ")
    return name, int(number.rstrip("+"))


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


def step_overhead_us(runs: list[MeasuredRun]) -> float:
    """Mean host time before a compute work (the host time before a transfer is the transfer's): the step
    overhead of a fit without the `finish` term."""
    gaps = [g for run in runs for g, w in zip(host_gaps(run), run.works, strict=True) if w["kind"] in (PREFILL, DECODE)]
    return float(np.mean(gaps)) if gaps else 0.0


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


def _finish_samples(run: MeasuredRun) -> list[tuple[int, int, int]]:
    """(finishes before, their retained bytes, host time) of each compute work whose host time tells the
    finish time apart: after a compute work with nothing on the thread between (a transfer there may have
    run amid the finishes), and, when the engine was idle before it (the finish time may overlap the
    idle stretch), only after a work in which nothing ended."""
    samples, requests = [], run.document["requests"]
    ended = finishes(run)
    for index, (work, gap) in enumerate(zip(run.works, host_gaps(run), strict=True)):
        if index == 0 or work["kind"] not in (PREFILL, DECODE) or run.works[index - 1]["kind"] not in (PREFILL, DECODE):
            continue
        count, size = ended[index - 1]
        busy = max(requests[r]["arrival_us"] for r in work["request_ids"]) <= run.works[index - 1]["end_us"]
        if busy or count == 0:
            samples.append((count, size, gap))
    return samples


def host_fit(runs: list[MeasuredRun], vary: bool = False) -> KindFit:
    """The host time before a compute work: step_overhead_us, plus, for each request that ended with the work
    before, finish.fixed_us + finish.per_byte_us * its retained bytes and, when the runs have more than one slot
    capacity (`vary`), finish.per_slot_us * the capacity (the engine copies the request's whole slot row out).
    Non-negative least squares."""
    samples = [(n, b, gap, run.slot_capacity if vary else 0) for run in runs for n, b, gap in _finish_samples(run)]
    if not samples:
        raise ApiError("MEASURED", "no compute work follows another: nothing to fit the host time to")
    columns = [[1] * len(samples), [n for n, _, _, _ in samples], [b for _, b, _, _ in samples]]
    names = ["step_overhead_us", "finish.fixed_us", "finish.per_byte_us"]
    if vary:
        columns.append([n * slots for n, _, _, slots in samples])
        names.append("finish.per_slot_us")
    works = [{"wall_us": gap} for _, _, gap, _ in samples]
    shapes: list[tuple[str, ...]] = [(f"finishes {n}" if n < 3 else "finishes 3+",) for n, _, _, _ in samples]
    return _fit_kind(HOST, names, columns, works, shapes)


def transfer_gaps(run: MeasuredRun, finish: dict | None) -> list[int]:
    """`host_gaps`, less the host time kvsim charges for finishes before a transfer that directly follows the
    compute work they ended with (at least 0; with no finish term, the host gaps themselves)."""
    gaps = host_gaps(run)
    if finish is None:
        return gaps
    ended = finishes(run)
    each = finish["fixed_us"] + finish.get("per_slot_us", 0) * run.slot_capacity  # one finish's time beside its bytes
    return [
        max(0, round(gap - ended[index - 1][0] * each - ended[index - 1][1] * finish["per_byte_us"]))
        if index > 0 and work["kind"] in DIRECTIONS else gap
        for index, (work, gap) in enumerate(zip(run.works, gaps, strict=True))
    ]  # fmt: skip


def _round(value: float) -> float | int:
    """Six significant digits, written as the JSON number kvsim reads back exactly; zero stays an integer."""
    rounded = float(f"{max(0.0, value):.{SIGNIFICANT_DIGITS}g}")
    return int(rounded) if rounded == int(rounded) and abs(rounded) < 2**53 else rounded


def read_service(value: Any, field: str = "--service") -> dict:
    """A system fragment as calibrate writes it; its parts are checked in full when merged into a system."""
    fragment = validation.mapping(value, field, set(), {"compute_service", "transfer", "calibration"})
    for name, part in fragment.items():
        validation.loose_mapping(part, f"{field}.{name}", set())
    return fragment


def merge_service(system: dict, fragment: dict) -> dict:
    """A system JSON with the fragment's compute_service, transfer and calibration in place of its own."""
    return {**system, **{k: fragment[k] for k in ("compute_service", "transfer", "calibration") if k in fragment}}


def fit_table(fits: list[KindFit], notes: list[str]) -> str:
    lines = [
        f"  {'work':<9}{'count':>7}{'mean wall us':>14}{'mean err us':>13}{'mean rel':>10}{'p90 rel':>10}  terms",
    ]
    for f in fits:
        terms = "  ".join(f"{name}={value:g}" for name, value in f.terms.items())
        lines.append(
            f"  {f.kind:<9}{f.count:>7}{f.mean_wall_us:>14.1f}{f.mean_error_us:>13.1f}"
            f"{100 * f.mean_relative_error:>9.1f}%{100 * f.p90_relative_error:>9.1f}%  {terms}"
        )
    lines.append("  spread, measured / fitted per work (p5 p25 p50 p75 p95 of the quantiles a spread draws from):")
    for f in (f for f in fits if f.kind in (PREFILL, DECODE)):
        lines.append(f"  {f.kind:<9}" + "  ".join(f"{np.interp(p, np.linspace(0, 1, len(f.spread)), f.spread):.3f}"
                                                  for p in (0.05, 0.25, 0.5, 0.75, 0.95)))  # fmt: skip
    lines.append("  residuals per shape, (fitted - measured) / measured of the works' total time:")
    for f in (f for f in fits if f.residuals):
        shapes = "  ".join(f"{shape}: {100 * mean:+.1f}% (n={count})" for shape, (count, mean) in f.residuals.items())
        lines.append(f"  {f.kind:<9}{shapes}")
    return "\n".join(lines + [f"  note: {note}" for note in notes])
