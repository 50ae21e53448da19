"""The summary table a person reads after a run: latency percentiles, hit rates, bytes moved.

Times and sizes are in human units (ms, MiB: `jgpt.foundation.units`); the record and `--json` keep the exact numbers.
"""

from __future__ import annotations

from jgpt.foundation.units import byte_size, count, duration_us


def summary_table(record: dict) -> str:
    """Plain text from a record's totals (works on a CacheRun record value or a read record)."""
    totals = record["outcomes"]["totals"]
    latency = totals["latency_us"]
    lines = [
        f"run {record['id']}: {totals['arrived']} requests, {totals['events']} events, "
        f"virtual end {duration_us(totals['end_us'])}",
        f"  completed {totals['completed']}  stopped {totals['stopped']}  "
        f"cancelled {totals['cancelled']}  rejected {totals['rejected']}",
        "",
        f"  {'latency':<14}{'count':>8}{'p50':>12}{'p90':>12}{'p99':>12}",
    ]
    for name, label in (("ttft", "TTFT"), ("tpot", "per token"), ("e2e", "end to end"), ("queueing", "queueing")):
        row = latency[name]
        lines.append(
            f"  {label:<14}{row['count']:>8}" + "".join(f"{duration_us(row[p]):>12}" for p in ("p50", "p90", "p99"))
        )
    lines += [
        "",
        f"  hit rate     device {_rate(totals['hit_rate_device'])}  host {_rate(totals['hit_rate_host'])}  "
        f"tokens {_rate(totals['token_hit_rate'])} ({totals['reused_positions']} of {totals['prompt_positions']} positions)",
        f"  bytes moved  device->host {byte_size(totals['bytes_device_to_host'])}  "
        f"host->device {byte_size(totals['bytes_host_to_device'])}  "
        f"({totals['offloads']} offloads, {totals['reloads']} reloads, {totals['drops']} drops)",
        f"  compute      busy {_rate(totals['compute_busy_fraction'])}  saved matmul FLOPs {count(totals['saved_matmul_flops'])}",
    ]
    return "\n".join(lines)


def _rate(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
