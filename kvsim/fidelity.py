"""Fidelity: kvsim's prediction of a measured engine run, compared with the measurement field by field.

`predict` simulates exactly what the engine served: the measured run's system
(with a calibrated service fragment in place of its compute service and
transfer, or its own hypothetical rates), its recorded computations (the ids the
engine selected), its arrivals and its customer interaction; `predicted_totals`
takes, for a service with a spread, each field's median over simulated repeats
with different seeds, as the measured figure is the median over repeated
engine runs. `compare` lines
the prediction's totals up against the measured totals, which carry kvsim's
field names. `replay` is the check of kvsim's rules alone: every work and
transfer takes the time the engine measured for it, so if kvsim takes the
engine's decisions in the engine's order, every outcome agrees exactly.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from jgpt.foundation.units import duration_us, percent
from kvsim import engine
from kvsim.cache_run import CacheRun, record_outcomes, simulate
from kvsim.calibration import merge_service
from kvsim.compute_service import (
    DECODE,
    DEVICE_TO_HOST,
    HOST_TO_DEVICE,
    PREFILL,
    SPREAD_REPEATS,
    CalibratedComputeService,
    CalibratedTransfer,
)
from kvsim.measured_run import MeasuredRun, host_gaps
from kvsim.recorded import parse_document
from kvsim.system import parse_system
from kvsim.workload import RequestArrival, Workload, parse_interaction, parse_workload, resolve_workload

LATENCIES = tuple((name, p) for name in ("ttft", "tpot", "e2e") for p in ("p50", "p90"))
EXACT = ("hit_rate_device", "hit_rate_host", "token_hit_rate")
NOISE_DRAWS, NOISE_LEVEL = 4000, 0.9  # resamples of a noise band, and the share of them it holds


@dataclass(frozen=True)
class Comparison:
    field: str  # e.g. "ttft.p50", "hit_rate_device"
    measured: float | None
    predicted: float | None
    exact: bool  # compared for equality (hit rates), not within a tolerance

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None when there is nothing to divide by."""
        if self.exact or not self.measured or self.predicted is None:
            return None
        return (self.predicted - self.measured) / self.measured

    def to_json(self) -> dict:
        error = self.error
        return {
            "field": self.field,
            "measured": self.measured,
            "predicted": self.predicted,
            "exact": self.exact,
            "error": None if error is None else round(error, 6),
        }


def predicted_system(run: MeasuredRun, fragment: dict | None) -> dict:
    """The run's system JSON with the fragment's service (None: its own rates) and the run's executed shapes."""
    system = run.document["system"] if fragment is None else merge_service(run.document["system"], fragment)
    if not isinstance(parse_system(system, "system").compute_service, CalibratedComputeService):
        return system
    # The executed shapes are the engine's compile plan for this run, not fitted values.
    shapes = {
        "slot_capacity": run.slot_capacity,
        "prefill_window_buckets": list(run.prefill_window_buckets),
        "decode_batch_buckets": list(run.decode_batch_buckets),
    }
    return system | {"compute_service": system["compute_service"] | shapes}


def predicted_inputs(run: MeasuredRun, fragment: dict | None) -> dict:
    """`simulate`'s arguments for the measured run (`kvsim.record_lines.write_lines` takes the same)."""
    computations, workload, interaction = _served(run)
    system = parse_system(predicted_system(run, fragment), "system")
    return {"system": system, "computations": computations, "workload": workload, "interaction": interaction}


def predict(run: MeasuredRun, fragment: dict | None) -> CacheRun:
    """Simulate the measured run once (a spread draws with its own seed); `fragment` None keeps the system's
    own (hypothetical) service rates."""
    return simulate(**predicted_inputs(run, fragment))


def spread_seeds(
    run: MeasuredRun, fragment: dict | None, repeats: int = SPREAD_REPEATS, first: int = 0
) -> tuple[int, ...]:
    """The seeds of the simulated runs a prediction takes the median of: `repeats` counting up from the
    spread's own plus `first`; none for a service without a spread (one simulation)."""
    spread = predicted_system(run, fragment)["compute_service"].get("spread")
    return () if spread is None else tuple(range(spread["seed"] + first, spread["seed"] + first + repeats))


def predicted_totals(run: MeasuredRun, fragment: dict | None, repeats: int = SPREAD_REPEATS) -> dict:
    """The totals `compare` reads, as kvsim predicts them for the measured run: one simulation's, or for a service
    with a spread, each field's median over `repeats` simulations, the spread's seed counting up."""
    return median_totals(simulated_totals(run, fragment, repeats))


def simulated_totals(
    run: MeasuredRun, fragment: dict | None, repeats: int = SPREAD_REPEATS, first: int = 0
) -> list[dict]:
    """The totals of kvsim's simulations of the measured run: one, or `repeats` for a service with a spread
    (seeds counting up from the spread's plus `first`: runs of the same workload simulate alike under the
    same seeds, so repeats of one are given seeds of their own)."""
    seeds = spread_seeds(run, fragment, repeats, first)
    if not seeds:
        return [predict(run, fragment).outcomes["totals"]]
    system = predicted_system(run, fragment)
    service = system["compute_service"]
    seeded = [service | {"spread": service["spread"] | {"seed": seed}} for seed in seeds]
    return [
        simulate(parse_system(system | {"compute_service": s}, "system"), *_served(run)).outcomes["totals"]
        for s in seeded
    ]


def median_totals(runs: list[dict]) -> dict:
    """Each field `compare` reads, the median over the runs' totals (None if a run has none)."""
    median = lambda values: None if None in values else statistics.median(values)  # noqa: E731
    totals: dict = {"latency_us": {}} | {name: median([t[name] for t in runs]) for name in (*EXACT, "compute_busy_us")}
    for name, p in LATENCIES:
        totals["latency_us"].setdefault(name, {})[p] = median([t["latency_us"][name][p] for t in runs])
    return totals


def noise_band(values: Sequence[float], repeats: int | None = None, draws: int = NOISE_DRAWS, seed: int = 0) -> float:
    """How far the median of `repeats` engine runs (default: as many as `values`) strays from the median of
    `values` by the runs' own noise: NOISE_LEVEL of the medians of `repeats` runs drawn with replacement from
    `values` (a bootstrap; seeded, so a table is reproducible) lie within this fraction of it. A prediction
    off by less cannot be told from a perfect one by these measurements."""
    measured = np.asarray(values, dtype=np.float64)
    median = float(np.median(measured))
    if median <= 0:
        return 0.0
    drawn = np.random.default_rng(seed).choice(measured, size=(draws, repeats or len(measured)))
    return float(np.quantile(np.abs(np.median(drawn, axis=1) / median - 1), NOISE_LEVEL))


def replay(run: MeasuredRun) -> dict:
    """The outcomes' totals of kvsim with every work and transfer taking the engine's measured time for it."""
    durations = _MeasuredDurations(run)
    # kvsim's engine only calls work_us, finish_us and transfer_us (and reads blocks_compute), which the
    # replay's durations answer in place of a calibrated service and transfer; the config's types name those.
    system = replace(
        parse_system(run.document["system"], "system"),
        compute_service=cast(CalibratedComputeService, durations),
        transfer=cast(CalibratedTransfer, durations),
    )
    computations, workload, interaction = _served(run)
    workload = resolve_workload(computations, workload, interaction)
    return record_outcomes(engine.run(system, computations, workload, interaction), computations, workload)["totals"]


class _MeasuredDurations:
    """A compute service and a transfer in one, for one replay: kvsim's n-th work takes the engine's n-th
    measured wall time after the host time the engine's serving thread spent before it (its step overhead);
    the n-th transfer each way likewise, the host time before it included."""

    def __init__(self, run: MeasuredRun):
        self.blocks_compute = run.document["engine"].get("transfers") == "synchronous"
        self.works: list[tuple[int, int]] = []
        self.transfers: dict[str, list[int]] = {DEVICE_TO_HOST: [], HOST_TO_DEVICE: []}
        for gap, work in zip(host_gaps(run), run.works, strict=True):
            if work["kind"] in (PREFILL, DECODE):
                self.works.append((gap, work["wall_us"]))
            else:
                self.transfers[DEVICE_TO_HOST if work["kind"] == "offload" else HOST_TO_DEVICE].append(
                    gap + work["wall_us"]
                )
        self.works.reverse()
        for times in self.transfers.values():
            times.reverse()

    def work_us(
        self,
        phase: str,
        positions: int,
        rows: int,
        flops: int,
        memory: int,
        idle_us: int,
        work: int = 0,
        previous: str | None = None,
    ) -> tuple[int, int]:
        return self.works.pop() if self.works else (0, 0)  # more works than the engine ran: the outcomes will say

    def finish_us(self, retained_bytes: int) -> int:
        return 0  # the host time after a finish is in the measured time before the next work or transfer

    def transfer_us(self, direction: str, size: int) -> int:
        times = self.transfers[direction]
        return times.pop() if times else 0


def _served(run: MeasuredRun) -> tuple:
    """(computations, workload, interaction) of what the engine served, as `simulate` takes them."""
    document = run.document
    interaction = document.get("customer_interaction")
    interaction = None if interaction is None else parse_interaction(interaction, "measured.customer_interaction")
    declared = parse_workload(document["workload"], "measured.workload")
    served = document["requests"]
    # The arrivals the engine used (all at 0 when it served as fast as possible).
    arrivals = tuple(RequestArrival(a.request_id, served[a.request_id]["arrival_us"]) for a in declared.requests)
    submitted = interaction is not None and any(a.kind == "submit" for a in interaction.actions)
    computations = parse_document(document["computations"], "measured.computations")
    return computations, None if submitted else Workload(declared.kind, arrivals), interaction


def compare(measured: dict, predicted: dict) -> list[Comparison]:
    """Latency percentiles, hit rates and compute busy time of two `totals` objects."""
    rows = [
        Comparison(f"{name}.{p}", measured["latency_us"][name][p], predicted["latency_us"][name][p], False)
        for name, p in LATENCIES
    ]
    rows += [Comparison(name, measured[name], predicted[name], True) for name in EXACT]
    rows.append(Comparison("compute_busy_us", measured["compute_busy_us"], predicted["compute_busy_us"], False))
    return rows


def comparison_table(rows: list[Comparison]) -> str:
    lines = [f"  {'field':<18}{'measured':>12}{'predicted':>12}{'error':>10}"]
    for row in rows:
        if row.exact:
            verdict = "exact" if row.measured == row.predicted else "DIFFERS"
        else:
            verdict = "-" if row.error is None else f"{100 * row.error:+.1f}%"
        lines.append(
            f"  {row.field:<18}{_show(row.field, row.measured):>12}{_show(row.field, row.predicted):>12}{verdict:>10}"
        )
    return "\n".join(lines)


def _show(field: str, value) -> str:
    """A figure in its unit: hit rates in percent, latencies and busy time in us/ms/s (--json keeps them exact)."""
    if value is None:
        return "-"
    return percent(value) if "hit_rate" in field else duration_us(value)
