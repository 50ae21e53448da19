"""The totals of a run's outcomes: one definition for kvsim's records and the engine's measured runs.

kvsim predicts the InferenceEngine field by field, so both summarize their
per-request outcomes (kvsim's outcome keys) with this one function: counts by
status, lookups by tier and hit rates, reused positions, bytes moved, compute
busy time and nearest-rank latency percentiles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jgpt.validation import Integer, Nullable, Number, Object

STATUSES = ("completed", "stopped", "cancelled", "rejected")
LATENCIES = (("ttft", "ttft_us"), ("tpot", "tpot_us"), ("e2e", "e2e_us"), ("queueing", "queueing_us"))

# What `totals` writes (its schema: records and measured runs are checked against it in tests).
_COUNT, _FIGURE = Integer(), Nullable(Number(exact=False))
PERCENTILES = Object({"count": _COUNT, "p50": _FIGURE, "p90": _FIGURE, "p99": _FIGURE})
TOTALS = Object(
    {**dict.fromkeys(("arrived", "admitted", *STATUSES, "lookups", "hits_device", "hits_host"), _COUNT),
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
    outcomes: Sequence[Mapping[str, Any]],
    *,
    saved_matmul_flops: int,
    moved: Mapping[str, int],  # bytes per direction: device_to_host, host_to_device
    counts: Mapping[str, int],  # offload, reload, drop
    busy_us: int,
    end_us: int,
    events: int | None = None,  # kvsim's records count their events; a measured run keeps no event log
) -> dict[str, Any]:
    """The run's totals, in the key order records are written in."""
    done = [o for o in outcomes if o["admitted_us"] is not None]
    tiers = [o["reuse_tier"] for o in done]
    reused, prompt = sum(o["reuse_positions"] for o in done), sum(o["prompt_positions"] for o in done)
    summary = {
        "arrived": len(outcomes),
        "admitted": len(done),
        **{status: sum(o["status"] == status for o in outcomes) for status in STATUSES},
        "lookups": len(done),
        "hits_device": tiers.count("device"),
        "hits_host": tiers.count("host"),
        "hit_rate_device": rate(tiers.count("device"), len(done)),
        "hit_rate_host": rate(tiers.count("host"), len(done)),
        "token_hit_rate": rate(reused, prompt),
        "reused_positions": reused,
        "prompt_positions": prompt,
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
    summary["latency_us"] = {name: percentiles([o[key] for o in done if o[key] is not None]) for name, key in LATENCIES}
    return summary
