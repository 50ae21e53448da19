"""PNGs of one CacheRun record: KV occupancy over virtual time, per-request timeline, latency CDF.

The record is read once, in order (`kvsim.record_lines` views either format), and only what the
pictures draw is kept. Every view says on its figure, and in the line `kvsim plot` prints for it,
what it draws of the run: the occupancy draws every event's step, merged pairwise past POINTS (each
merged step keeps the pair's peak, so no budget crossing is hidden); the timeline draws every
request up to a limit (`--requests`; past it, the earliest arrivals); the latency CDF covers every
request that has the latency. matplotlib is imported here and only here, when a plot is asked for.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jgpt.foundation.units import byte_size, duration_us

# Requests the timeline draws unless told otherwise: every request of a run kvsim holds in memory
# (`kvsim synthesize` makes at most 100,000); drawing that many takes some seconds a hundred thousand.
TIMELINE_LIMIT = 100_000
POINTS = 20_000  # steps drawn per curve
LATENCIES = {"ttft_us": "time to first token", "e2e_us": "end to end"}


@dataclass(frozen=True)
class Plot:
    path: Path
    note: str  # what the figure draws of the run, as it says on the figure


@dataclass
class _Kept:
    """What the pictures draw, gathered in one pass over the record."""

    budgets: dict = field(default_factory=dict)
    steps: tuple[list[int], list[int], list[int]] = ([], [], [])  # times, device bytes, host bytes
    events: int = 0
    merged: int = 1  # recorded steps each drawn step stands for, at most
    requests: int = 0
    admitted: int = 0
    earliest: list[tuple[int, int, tuple]] = field(default_factory=list)  # a heap of the earliest arrivals
    latencies: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in LATENCIES})


def write_plots(entries: Iterable[tuple[str, Any]], directory: Path, limit: int | None = TIMELINE_LIMIT) -> list[Plot]:
    """The three PNGs in `directory`; `limit` caps the timeline's requests (None: every one)."""
    drawn = figures(entries, limit)
    directory.mkdir(parents=True, exist_ok=True)
    return [_save(figure, directory / name, _pyplot(), note) for name, figure, note in drawn]


def figures(entries: Iterable[tuple[str, Any]], limit: int | None = TIMELINE_LIMIT) -> list[tuple[str, Any, str]]:
    """(file name, matplotlib Figure, note) of each view of the record's entries."""
    kept, plt = _kept(entries, limit), _pyplot()
    return [
        ("occupancy.png", *_occupancy(plt, kept)),
        ("timeline.png", *_timeline(plt, kept)),
        ("latency_cdf.png", *_latency_cdf(plt, kept)),
    ]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _kept(entries: Iterable[tuple[str, Any]], limit: int | None) -> _Kept:
    kept = _Kept(steps=([], [], []))
    for index, (section, value) in enumerate(entries):
        if section == "head":
            kept.budgets = value["declaration"]["system"]["kv_cache"]
        elif section == "event":
            kept.events += 1
            _step(kept, value.time_us, value.device_reserved_bytes, value.host_retained_bytes)
        elif section == "outcome":
            kept.requests += 1
            times = (value["arrival_us"], value["admitted_us"], value["first_token_us"], value["end_us"])
            item = (
                -value["arrival_us"],
                -index,
                (*times, value["status"]),
            )  # the latest arrival goes first; ties in order
            if limit is None or len(kept.earliest) < limit:
                heapq.heappush(kept.earliest, item)
            else:
                heapq.heappushpop(kept.earliest, item)
            if value["admitted_us"] is not None:
                kept.admitted += 1
                for name, values in kept.latencies.items():
                    if value[name] is not None:
                        values.append(value[name])
    return kept


def _step(kept: _Kept, time: int, device: int, host: int) -> None:
    times, devices, hosts = kept.steps
    if times and devices[-1] == device and hosts[-1] == host:
        return
    times.append(time)
    devices.append(device)
    hosts.append(host)
    if len(times) > 2 * POINTS:  # merge pairs: each keeps its first time and the pair's peaks
        for values in (devices, hosts):
            values[:] = [max(values[i : i + 2]) for i in range(0, len(values), 2)]
        times[:] = times[::2]
        kept.merged *= 2


def _occupancy(plt, kept: _Kept) -> tuple[Any, str]:
    times, devices, hosts = kept.steps
    figure, axis = plt.subplots(figsize=(10, 4))
    axis.step(times, devices, where="post", label="device (reserved + retained)")
    axis.step(times, hosts, where="post", label="host (retained)")
    axis.axhline(kept.budgets["device_kv_bytes"], linestyle="--", color="C0", linewidth=0.8, label="device budget")
    axis.axhline(kept.budgets["host_kv_bytes"], linestyle="--", color="C1", linewidth=0.8, label="host budget")
    note = f"every one of {kept.events:,} events" + (
        f"; drawn as {len(times):,} steps, each the peak of up to {kept.merged} recorded steps"
        if kept.merged > 1
        else ""
    )
    axis.set(xlabel="virtual time", ylabel="KV bytes", title=f"KV occupancy ({note})")
    _in_units(axis.xaxis, duration_us)
    _in_units(axis.yaxis, byte_size)
    axis.title.set_fontsize("small")
    axis.legend(loc="upper right", fontsize="small")
    return figure, note


def _timeline(plt, kept: _Kept) -> tuple[Any, str]:
    from matplotlib.collections import LineCollection

    outcomes = [o for _, _, o in sorted(kept.earliest, reverse=True)]
    rows = len(outcomes)
    height = min(8.0, max(3.0, 0.12 * rows))
    figure, axis = plt.subplots(figsize=(10, height))
    phases: tuple[list, list, list] = ([], [], [])  # queued, to first token, decoding
    colors: list[str] = []
    for row, (arrival, admitted, first, end, status) in enumerate(outcomes):
        admitted = end if admitted is None else admitted
        first = end if first is None else first
        for phase, (start, stop) in zip(phases, ((arrival, admitted), (admitted, first), (first, end)), strict=True):
            phase.append(((start, row), (stop, row)))
        colors.append("C0" if status == "completed" else "C3")
    # Rows as thick as the axis allows (points per row), so that thousands of requests still fill it.
    width = max(0.1, min(6.0, 0.8 * 72 * (height - 1) / max(rows, 1)))
    for segments, color in zip(phases, ("0.8", "C1", colors), strict=True):
        axis.add_collection(LineCollection(segments, colors=color, linewidths=width))
    # A mark where each request ends: one far shorter than a pixel of the run (a rejection takes no time) is
    # still seen.
    ends = [segment[1] for segment in phases[2]]
    axis.scatter([x for x, _ in ends], [y for _, y in ends], s=max(1.0, width) ** 2, c=colors, marker="|")
    axis.autoscale_view()
    axis.invert_yaxis()
    if rows == kept.requests:
        note = f"every one of {rows:,} requests, by arrival"
    else:
        note = (
            f"showing {rows:,} of {kept.requests:,} requests: the first {rows:,} by arrival; "
            "--requests all to draw every one"
        )
    axis.set(
        xlabel="virtual time",
        ylabel="request (by arrival)",
        title=f"queued (grey), to first token (orange), decoding (blue; red if not completed)\n{note}",
    )
    axis.title.set_fontsize("small")
    _in_units(axis.xaxis, duration_us)
    return figure, note


def _latency_cdf(plt, kept: _Kept) -> tuple[Any, str]:
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name, values in kept.latencies.items():
        if values:
            values.sort()
            every = max(1, len(values) // POINTS)  # quantiles enough to draw; the last one always
            picked = [*range(0, len(values) - 1, every), len(values) - 1]
            axis.step(
                [values[i] for i in picked],
                [(i + 1) / len(values) for i in picked],
                where="post",
                label=f"{LATENCIES[name]} ({len(values):,})",
            )
    unmeasured = kept.requests - kept.admitted
    note = f"every admitted request, {kept.admitted:,} of {kept.requests:,}" + (
        f" ({unmeasured:,} rejected or cancelled while waiting have no latency)" if unmeasured else ""
    )
    axis.set(xlabel="latency (virtual time)", ylabel="fraction of requests", title=f"latency CDF\n{note}")
    _in_units(axis.xaxis, duration_us)
    axis.title.set_fontsize("small")
    if any(kept.latencies.values()):
        axis.legend()
    return figure, note


def _save(figure, path: Path, plt, note: str) -> Plot:
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
    return Plot(path, note)


def _in_units(axis, text) -> None:
    """Tick labels in human units (3.5 ms, 1.2 GiB) rather than raw microseconds or bytes."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: text(value)))
