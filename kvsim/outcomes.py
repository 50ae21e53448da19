"""The totals of a run's outcomes: one definition for kvsim's records and the engine's measured runs.

kvsim predicts the InferenceEngine field by field, so both summarize their
per-request outcomes (kvsim's outcome keys) with this one function: counts by
status, lookups by tier and hit rates, reused positions, bytes moved, compute
busy time and nearest-rank latency percentiles. kvsim's own outcomes are
RequestOutcomes; a measured run's are its document's JSON objects, read into
RequestOutcomes here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, NamedTuple

from jgpt.foundation.validation import Integer, Nullable, Number, Object


class Status(StrEnum):
    """How a request ended, in the order totals count them: completed at a turn end, stopped by its budget
    or the context, cancelled by the customer, or rejected at arrival."""

    COMPLETED = "completed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


class RequestOutcome(NamedTuple):
    """One request's outcome, fields in record order; the times are virtual microseconds."""

    status: Status
    stop_reason: str
    end_event: int | None  # the event that ended it (kvsim; a measured run keeps no event log)
    arrival_us: int
    admitted_us: int | None  # None: never admitted (rejected, or cancelled while waiting)
    first_token_us: int | None
    end_us: int
    queueing_us: int | None
    ttft_us: int | None
    tpot_us: float | None
    e2e_us: int
    prompt_positions: int
    reuse_positions: int
    reuse_tier: str | None  # "device", "host", or None for a lookup miss
    selected_tokens: int
    published_tokens: int
    unused_budget: int
    complete: bool

    @classmethod
    def read(cls, outcome: Mapping[str, Any]) -> RequestOutcome:
        """A measured run's outcome object (the same keys, without end_event)."""
        return cls._make(outcome.get(name) for name in cls._fields)

    def to_json(self) -> dict[str, Any]:
        return {**self._asdict(), "end_event": None if self.end_event is None else f"e{self.end_event}"}


LATENCIES = (("ttft", "ttft_us"), ("tpot", "tpot_us"), ("e2e", "e2e_us"), ("queueing", "queueing_us"))

# What `totals` writes (its schema: records and measured runs are checked against it in tests).
_COUNT, _FIGURE = Integer(), Nullable(Number(exact=False))
PERCENTILES = Object({"count": _COUNT, "p50": _FIGURE, "p90": _FIGURE, "p99": _FIGURE})
TOTALS = Object(
    {**dict.fromkeys(("arrived", "admitted", *(status.value for status in Status), "lookups", "hits_device", "hits_host"), _COUNT),
     **dict.fromkeys(("hit_rate_device", "hit_rate_host", "token_hit_rate"), _FIGURE),
     **dict.fromkeys(("reused_positions", "prompt_positions", "saved_matmul_flops", "bytes_device_to_host",
                      "bytes_host_to_device", "offloads", "reloads", "drops", "compute_busy_us", "end_us"), _COUNT),
     "compute_busy_fraction": _FIGURE, "latency_us": Object({name: PERCENTILES for name, _ in LATENCIES})},
    {"events": _COUNT},
    about="The run's totals: counts by status, reuse by tier, bytes moved, compute busy time, latency percentiles.",
)  # fmt: skip


def percentiles(values: Sequence[int | float]) -> dict:
    """Nearest-rank p50/p90/p99 (exact values of the sample, no interpolation)."""
    if not values:
        return {"count": 0, "p50": None, "p90": None, "p99": None}
    ordered = sorted(values)
    pick = lambda p: ordered[max(0, -(-p * len(ordered) // 100) - 1)]  # noqa: E731
    return {"count": len(ordered), "p50": pick(50), "p90": pick(90), "p99": pick(99)}


def rate(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def totals(
    outcomes: Iterable[RequestOutcome] | Iterable[Mapping[str, Any]],
    *,
    saved_matmul_flops: int,
    moved: Mapping[str, int],  # bytes per direction: device_to_host, host_to_device
    counts: Mapping[str, int],  # offload, reload, drop
    busy_us: int,
    end_us: int,
    events: int | None = None,  # kvsim's records count their events; a measured run keeps no event log
) -> dict[str, Any]:
    """The run's totals, in the key order records are written in."""
    tally = OutcomeTally()
    for outcome in outcomes:
        tally.add(outcome if isinstance(outcome, RequestOutcome) else RequestOutcome.read(outcome))
    return tally.totals(
        saved_matmul_flops=saved_matmul_flops, moved=moved, counts=counts, busy_us=busy_us, end_us=end_us, events=events
    )


class OutcomeTally:
    """What `totals` reads from the outcomes, folded one at a time, so a streamed run keeps no outcome: counts,
    sums and each admitted request's latencies (a number each, so the percentiles stay exact). It lives for
    one run."""

    def __init__(self) -> None:
        self.arrived = self.admitted = self.reused = self.prompt = 0
        self.statuses = dict.fromkeys(Status, 0)
        self.tiers = {"device": 0, "host": 0}
        self.latencies: dict[str, list[int | float]] = {key: [] for _, key in LATENCIES}

    def add(self, outcome: RequestOutcome) -> None:
        self.arrived += 1
        if outcome.status in self.statuses:
            self.statuses[outcome.status] += 1
        if outcome.admitted_us is None:
            return
        self.admitted += 1
        if outcome.reuse_tier in self.tiers:
            self.tiers[outcome.reuse_tier] += 1
        self.reused += outcome.reuse_positions
        self.prompt += outcome.prompt_positions
        for key, values in self.latencies.items():
            if (value := getattr(outcome, key)) is not None:
                values.append(value)

    def totals(
        self, *, saved_matmul_flops: int, moved: Mapping[str, int], counts: Mapping[str, int], busy_us: int,
        end_us: int, events: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """`totals`' dict (its arguments say what the outcomes do not)."""
        done, device, host = self.admitted, self.tiers["device"], self.tiers["host"]
        summary: dict[str, Any] = {
            "arrived": self.arrived,
            "admitted": done,
            **{status.value: count for status, count in self.statuses.items()},
            "lookups": done,
            "hits_device": device,
            "hits_host": host,
            "hit_rate_device": rate(device, done),
            "hit_rate_host": rate(host, done),
            "token_hit_rate": rate(self.reused, self.prompt),
            "reused_positions": self.reused,
            "prompt_positions": self.prompt,
            "saved_matmul_flops": saved_matmul_flops,
            "bytes_device_to_host": moved["device_to_host"],
            "bytes_host_to_device": moved["host_to_device"],
            "offloads": counts["offload"],
            "reloads": counts["reload"],
            "drops": counts["drop"],
            "compute_busy_us": busy_us,
            "end_us": end_us,
            "compute_busy_fraction": rate(busy_us, end_us),
        }
        if events is not None:
            summary["events"] = events
        summary["latency_us"] = {name: percentiles(self.latencies[key]) for name, key in LATENCIES}
        return summary
