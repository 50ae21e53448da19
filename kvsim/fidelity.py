"""Fidelity: kvsim's prediction of a measured engine run, compared with the measurement field by field.

`predict` simulates exactly what the engine served: the measured run's system
(with a calibrated service fragment in place of its compute service and
transfer, or its own hypothetical rates), its recorded computations (the ids the
engine selected), its arrivals and its customer interaction. `compare` lines
the prediction's totals up against the measured totals, which carry kvsim's
field names.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.cache_run import CacheRun, simulate
from kvsim.calibration import MeasuredRun, merge_service
from kvsim.compute_service import CALIBRATED
from kvsim.recorded import parse_document
from kvsim.system import KVResidencySystemConfig, parse_system
from kvsim.workload import RequestArrival, Workload, parse_interaction, parse_workload

LATENCIES = tuple((name, p) for name in ("ttft", "tpot", "e2e") for p in ("p50", "p90"))
EXACT = ("hit_rate_device", "hit_rate_host", "token_hit_rate")


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
    if system["compute_service"].get("model") != CALIBRATED:
        return system
    # The executed shapes are the engine's compile plan for this run, not fitted values.
    shapes = {
        "slot_capacity": run.slot_capacity,
        "prefill_window_buckets": list(run.prefill_window_buckets),
        "decode_batch_buckets": list(run.decode_batch_buckets),
    }
    return system | {"compute_service": system["compute_service"] | shapes}


def predict(run: MeasuredRun, fragment: dict | None, system: KVResidencySystemConfig | None = None) -> CacheRun:
    """Simulate the measured run; `fragment` None keeps the system's own (hypothetical) service rates.

    `system` replaces the predicted one outright (diagnostics that feed kvsim other durations)."""
    document = run.document
    system = system or parse_system(predicted_system(run, fragment), "system")
    interaction = document.get("customer_interaction")
    interaction = None if interaction is None else parse_interaction(interaction, "measured.customer_interaction")
    declared = parse_workload(document["workload"], "measured.workload")
    served = document["requests"]
    # The arrivals the engine used (all at 0 when it served as fast as possible).
    workload = Workload(declared.kind, tuple(RequestArrival(a.request_id, served[a.request_id]["arrival_us"]) for a in declared.requests))
    submitted = interaction is not None and any(a.kind == "submit" for a in interaction.actions)
    return simulate(
        system,
        parse_document(document["computations"], "measured.computations"),
        None if submitted else workload,
        interaction,
    )


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
        lines.append(f"  {row.field:<18}{_show(row.measured):>12}{_show(row.predicted):>12}{verdict:>10}")
    return "\n".join(lines)


def _show(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.0f}"  # rates, or microseconds (TPOT)
    return str(value)
