"""PNGs of one CacheRun record: KV occupancy over virtual time, per-request timeline, latency CDF.

The record is read once, in order (`kvsim.record_lines` views either format), and only what the
pictures draw is kept: occupancy steps merged pairwise past POINTS (each merged step keeps the
pair's peak, so no budget crossing is hidden), the TIMELINE_LIMIT earliest arrivals, and the
latencies. matplotlib is imported here and only here, when a plot is asked for.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TIMELINE_LIMIT = 200  # requests drawn in the timeline; more is unreadable
POINTS = 20_000  # steps drawn per curve


def write_plots(entries: Iterable[tuple[str, Any]], directory: Path) -> list[Path]:
    budgets: dict[str, int] = {}
    steps: tuple[list[int], list[int], list[int]] = ([], [], [])  # times, device bytes, host bytes
    earliest: list[tuple[int, int, dict]] = []  # a heap of the earliest arrivals' outcomes
    latencies: dict[str, list[float]] = {"ttft_us": [], "e2e_us": []}
    for index, (section, value) in enumerate(entries):
        if section == "head":
            budgets = value["declaration"]["system"]["kv_cache"]
        elif section == "event":
            _step(steps, value.time_us, value.device_reserved_bytes, value.host_retained_bytes)
        elif section == "outcome":
            item = (-value["arrival_us"], -index, value)  # the latest arrival is dropped first; ties keep order
            heapq.heappush(earliest, item) if len(earliest) < TIMELINE_LIMIT else heapq.heappushpop(earliest, item)
            if value["admitted_us"] is not None:
                for name, values in latencies.items():
                    if value[name] is not None:
                        values.append(value[name])
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    timeline = [o for _, _, o in sorted(earliest, reverse=True)]
    return [
        _occupancy(plt, steps, budgets, directory / "occupancy.png"),
        _timeline(plt, timeline, directory / "timeline.png"),
        _latency_cdf(plt, latencies, directory / "latency_cdf.png"),
    ]


def _step(steps: tuple[list, list, list], time: int, device: int, host: int) -> None:
    times, devices, hosts = steps
    if times and devices[-1] == device and hosts[-1] == host:
        return
    times.append(time)
    devices.append(device)
    hosts.append(host)
    if len(times) > 2 * POINTS:  # merge pairs: each keeps its first time and the pair's peaks
        for values in (devices, hosts):
            values[:] = [max(values[i : i + 2]) for i in range(0, len(values), 2)]
        times[:] = times[::2]


def _occupancy(plt, steps: tuple[list, list, list], budgets: dict, path: Path) -> Path:
    times, devices, hosts = steps
    figure, axis = plt.subplots(figsize=(10, 4))
    axis.step(times, devices, where="post", label="device (reserved + retained)")
    axis.step(times, hosts, where="post", label="host (retained)")
    axis.axhline(budgets["device_kv_bytes"], linestyle="--", color="C0", linewidth=0.8, label="device budget")
    axis.axhline(budgets["host_kv_bytes"], linestyle="--", color="C1", linewidth=0.8, label="host budget")
    axis.set(xlabel="virtual time (us)", ylabel="KV bytes", title="KV occupancy")
    axis.legend(loc="upper right", fontsize="small")
    return _save(figure, path, plt)


def _timeline(plt, outcomes: list[dict], path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(10, max(3, 0.12 * len(outcomes))))
    for row, o in enumerate(outcomes):
        admitted = o["admitted_us"] if o["admitted_us"] is not None else o["end_us"]
        first = o["first_token_us"] if o["first_token_us"] is not None else o["end_us"]
        axis.broken_barh([(o["arrival_us"], admitted - o["arrival_us"])], (row, 0.8), color="0.8")
        axis.broken_barh([(admitted, first - admitted)], (row, 0.8), color="C1")
        axis.broken_barh([(first, o["end_us"] - first)], (row, 0.8), color="C0" if o["status"] == "completed" else "C3")
    axis.set(
        xlabel="virtual time (us)",
        ylabel="request (by arrival)",
        title="queued (grey), to first token (orange), decoding (blue; red if not completed)",
    )
    return _save(figure, path, plt)


def _latency_cdf(plt, latencies: dict[str, list], path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(6, 4))
    for name, values in latencies.items():
        if values:
            values.sort()
            every = max(1, len(values) // POINTS)  # quantiles enough to draw; the last one always
            picked = [*range(0, len(values) - 1, every), len(values) - 1]
            axis.step([values[i] for i in picked], [(i + 1) / len(values) for i in picked], where="post", label=name)
    axis.set(xlabel="latency (virtual us)", ylabel="fraction of requests", title="latency CDF")
    axis.legend()
    return _save(figure, path, plt)


def _save(figure, path: Path, plt) -> Path:
    figure.tight_layout()
    temporary = path.with_suffix(".tmp.png")
    try:
        figure.savefig(temporary, dpi=110)
        temporary.replace(path)
    except BaseException:  # SIGTERM included: leave no half-drawn file
        temporary.unlink(missing_ok=True)
        raise
    finally:
        plt.close(figure)
    return path
