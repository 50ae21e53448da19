"""Calibration: fit the calibrated ComputeService and StateTransfer to an InferenceEngine's measured works.

`jgpt kvsim calibrate MEASURED.json [...] --out SERVICE.json` reads measured-run
documents (docs/measured-run.md; kvsim.measured_run), fits each kind of work's latency terms by
non-negative least squares (numpy only; kvsim stays jax-free), and writes a
system fragment: `{"compute_service", "transfer", "calibration"}`, whose keys
replace the same keys of a system (`merge_service`). The terms and what they
stand for are in docs/kvsim-calibration.md. The fragment's `spread`
holds, per kind of compute work, quantiles of the works' measured / fitted
times, which a simulation draws each work's multiplier from.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from jgpt.foundation import validation
from jgpt.foundation.errors import ApiError
from jgpt.foundation.units import duration_us
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
from kvsim.measured_run import MeasuredRun, after_other, finishes, host_gaps, idle_us

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
    # With one slot capacity the per-slot terms cannot be told from the fixed ones: they are fit as 0.
    vary = len({run.slot_capacity for run in runs}) > 1
    compute_fits, minimum = _compute_fits(runs, vary, AFTER_OTHER in optional)
    host = host_fit(runs, vary) if FINISH in optional else None
    finish = None if host is None else _finish_terms(host)
    compute = _compute_service(runs, compute_fits, minimum, host, finish, SPREAD in optional)
    transfer_fits = _transfer_fits(runs, finish)
    transfer, transfer_notes = _transfer(runs, transfer_fits)
    fragment: dict[str, Any] = {"compute_service": compute}
    if transfer is not None:
        fragment["transfer"] = transfer
    fragment["calibration"] = _calibration(runs)
    fits = [*compute_fits, *transfer_fits, *([] if host is None else [host])]
    return fragment, fits, transfer_notes + _source_notes(runs, vary)


def _compute_fits(runs: list[MeasuredRun], vary: bool, with_other: bool) -> tuple[list[KindFit], int]:
    """The fit of each kind of compute work, and the least idle time after which a work runs cold (both kinds
    share it: `idle_minimum`)."""
    compute_works = {kind: [(w, run.slot_capacity, idle, other) for run in runs
                            for w, idle, other in zip(run.works, idle_us(run), after_other(run), strict=True)
                            if w["kind"] == kind]
                     for kind in (PREFILL, DECODE)}  # fmt: skip
    shapes = {kind: [_shapes(w) + _engine_shapes(run) for run in runs for w in run.works if w["kind"] == kind]
              for kind in (PREFILL, DECODE)}  # fmt: skip
    if missing := [kind for kind, kind_works in compute_works.items() if not kind_works]:
        raise ApiError("MEASURED", f"no {missing[0]} works to fit")
    minimum = idle_minimum(compute_works, vary, with_other)
    fits = [
        _fit_kind(kind, _column_names(kind, kind_works, with_other), _columns(kind, kind_works, vary, minimum, with_other),
                  [w for w, _, _, _ in kind_works], shapes[kind])
        for kind, kind_works in compute_works.items()
    ]  # fmt: skip
    return fits, minimum


def _finish_terms(host: KindFit) -> dict[str, float]:
    """A finish's terms of the host fit, as the fragment's `finish` holds them."""
    return {name: host.terms[f"finish.{name}"] for name in FINISH_TERMS if f"finish.{name}" in host.terms}


def _compute_service(
    runs: list[MeasuredRun],
    compute_fits: list[KindFit],
    minimum: int,
    host: KindFit | None,
    finish: dict[str, float] | None,
    with_spread: bool,
) -> dict[str, Any]:
    """The fragment's compute_service: the fitted terms, the engine's buckets and, if fitted, the finish and
    the spread."""
    # The fragment is JSON: each key holds its own kind of value (a model name, terms, bucket lists).
    compute: dict[str, Any] = {"model": CALIBRATED}
    compute |= {kind_fit.kind: _nested(kind_fit.kind, kind_fit.terms) for kind_fit in compute_fits}
    compute["step_overhead_us"] = _round(step_overhead_us(runs)) if host is None else host.terms["step_overhead_us"]
    compute["after_idle_min_us"] = minimum
    compute["slot_capacity"] = max(run.slot_capacity for run in runs)
    compute["prefill_window_buckets"] = sorted({b for run in runs for b in run.prefill_window_buckets})
    compute["decode_batch_buckets"] = sorted({b for run in runs for b in run.decode_batch_buckets})
    if finish is not None:
        compute[FINISH] = finish
    if with_spread:
        compute[SPREAD] = {"seed": 0} | {kind_fit.kind: list(kind_fit.spread) for kind_fit in compute_fits}
    return compute


def _transfer_fits(runs: list[MeasuredRun], finish: dict | None) -> list[KindFit]:
    """The fit of each kind of transfer the runs measured (offload, then reload)."""
    fits = []
    for kind in DIRECTIONS:
        # A transfer's time includes the host time before it, as the serving thread spent it, less the host
        # time after a finish that kvsim charges before it.
        works = [w | {"wall_us": gap + w["wall_us"]} for run in runs
                 for gap, w in zip(transfer_gaps(run, finish), run.works, strict=True) if w["kind"] == kind]  # fmt: skip
        if works:
            columns = [[1] * len(works), [w["bytes"] for w in works]]
            fits.append(_fit_kind(kind, ("latency_us", "per_byte_us"), columns, works, [()] * len(works)))
    return fits


def _transfer(runs: list[MeasuredRun], transfer_fits: list[KindFit]) -> tuple[dict | None, list[str]]:
    """The fragment's transfer (None when no transfer was measured: the system's own stays), and notes."""
    if not transfer_fits:
        return None, ["no transfers were measured: the fragment leaves the system's transfer as it is"]
    transfer = {DIRECTIONS[kind_fit.kind]: kind_fit.terms for kind_fit in transfer_fits}
    notes = []
    if len(transfer) == 1:
        (measured,) = transfer
        other = DEVICE_TO_HOST if measured == HOST_TO_DEVICE else HOST_TO_DEVICE
        transfer[other] = transfer[measured]
        notes.append(f"no {other} transfers were measured: they take the {measured} terms")
    # An engine that says its transfers are synchronous runs them on its serving thread.
    blocks = any(run.document["engine"].get("transfers") == "synchronous" for run in runs)
    directions = {d: transfer[d] for d in (DEVICE_TO_HOST, HOST_TO_DEVICE)}
    return {"model": CALIBRATED} | directions | {"blocks_compute": blocks}, notes


def _calibration(runs: list[MeasuredRun]) -> dict[str, Any]:
    """The fragment's calibration: what it was fitted to (the first run's backend and machine)."""
    first = runs[0].document
    return {
        "backend": first["execution"]["backend"],
        "machine": first["machine"],
        "sources": [run.sha256 for run in runs],
        "works": sum(len(run.works) for run in runs),
    }


def _source_notes(runs: list[MeasuredRun], vary: bool) -> list[str]:
    """What the runs' machines and slot capacities leave the fit unable to tell."""
    notes = []
    if any(run.document["machine"] != runs[0].document["machine"] for run in runs[1:]):
        notes.append("the measured runs come from different machines; the calibration names the first")
    if not vary:
        notes.append(f"every run had {runs[0].slot_capacity} slots, so per_slot_us is 0 and the fixed times hold the "
                     "slots' share: calibrate on runs of two slot capacities to predict others")  # fmt: skip
    return notes


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


def step_overhead_us(runs: list[MeasuredRun]) -> float:
    """Mean host time before a compute work (the host time before a transfer is the transfer's): the step
    overhead of a fit without the `finish` term."""
    gaps = [g for run in runs for g, w in zip(host_gaps(run), run.works, strict=True) if w["kind"] in (PREFILL, DECODE)]
    return float(np.mean(gaps)) if gaps else 0.0


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
        f"  {'work':<9}{'count':>7}{'mean wall':>14}{'mean error':>13}{'mean rel':>10}{'p90 rel':>10}  terms",
    ]
    for f in fits:
        terms = "  ".join(_term(name, value) for name, value in f.terms.items())
        lines.append(
            f"  {f.kind:<9}{f.count:>7}{duration_us(f.mean_wall_us):>14}{duration_us(f.mean_error_us):>13}"
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


def _term(name: str, value: float) -> str:
    """A fitted term as printed: a time (`fixed_us`) in us/ms/s (`fixed=12.3 ms`), a cost per unit (`per_byte_us`)
    as it is; the fragment (--json) keeps every term's name and exact value."""
    if name.endswith("_us") and "per_" not in name:
        return f"{name.removesuffix('_us')}={duration_us(value)}"
    return f"{name}={value:g}"
