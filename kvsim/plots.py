"""PNGs of a CacheRun: KV occupancy over virtual time, per-request timeline, latency CDF.

matplotlib is imported here and only here, when a plot is asked for.
"""

from __future__ import annotations

from pathlib import Path

TIMELINE_LIMIT = 200  # requests drawn in the timeline; more is unreadable


def write_plots(record: dict, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    events, system = record["events"], record["declaration"]["system"]["kv_cache"]
    paths = []

    figure, axis = plt.subplots(figsize=(10, 4))
    times = [e["time_us"] for e in events]
    axis.step(times, [e["device_reserved_bytes"] for e in events], where="post", label="device (reserved + retained)")
    axis.step(times, [e["host_retained_bytes"] for e in events], where="post", label="host (retained)")
    axis.axhline(system["device_kv_bytes"], linestyle="--", color="C0", linewidth=0.8, label="device budget")
    axis.axhline(system["host_kv_bytes"], linestyle="--", color="C1", linewidth=0.8, label="host budget")
    axis.set(xlabel="virtual time (us)", ylabel="KV bytes", title="KV occupancy")
    axis.legend(loc="upper right", fontsize="small")
    paths.append(_save(figure, directory / "occupancy.png", plt))

    outcomes = sorted(record["outcomes"]["requests"].items(), key=lambda item: item[1]["arrival_us"])[:TIMELINE_LIMIT]
    figure, axis = plt.subplots(figsize=(10, max(3, 0.12 * len(outcomes))))
    for row, (_, o) in enumerate(outcomes):
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
    paths.append(_save(figure, directory / "timeline.png", plt))

    figure, axis = plt.subplots(figsize=(6, 4))
    for name in ("ttft_us", "e2e_us"):
        values = sorted(
            o[name]
            for _, o in record["outcomes"]["requests"].items()
            if o[name] is not None and o["admitted_us"] is not None
        )
        if values:
            axis.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=name)
    axis.set(xlabel="latency (virtual us)", ylabel="fraction of requests", title="latency CDF")
    axis.legend()
    paths.append(_save(figure, directory / "latency_cdf.png", plt))
    return paths


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
