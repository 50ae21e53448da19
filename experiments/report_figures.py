"""Pictures of a lab record: arms compared, and per simulated arm a kvsim timeline with KV occupancy."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from experiments.figure_text import metric_text  # noqa: E402
from experiments.inference_map import default_inference_map, draw  # noqa: E402
from experiments.lab_answer import arm_captions  # noqa: E402
from experiments.record_files import verified_file  # noqa: E402
from experiments.record_summary import summary  # noqa: E402
from jgpt.foundation.json_input import parse_json  # noqa: E402

PHASE_COLORS = {"prefill": "#2563eb", "decode": "#16a34a"}
COMPARED = (
    ("ttft_p50_us", "time to first token p50"),
    ("e2e_p90_us", "end-to-end p90"),
    ("tpot_p50_us", "time per output token p50"),
    ("token_hit_rate", "reused / prompt positions"),
    ("bytes_host_to_device", "bytes restored from host"),
    ("compute_busy_us", "compute busy"),
)
DECODED = (  # a generate arm's row (experiments/decoding_arms.py)
    ("acceptance_rate", "accepted / drafted ids"),
    ("ids_per_round", "ids selected per target forward"),
    ("decode_tokens_per_s", "decode tokens/s"),
    ("vs_greedy", "decode tokens/s / greedy's"),
)


def draw_plots(record: Mapping[str, Any], out: Path) -> list[Path]:
    plots = Path(out) / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    arms = arms_figure(summary(record), arm_captions(record))
    written = [_save(arms, plots / "arms.png"), draw(default_inference_map(), plots / "inference-map.png")]
    for i, arm in simulated_arms(record):
        run = parse_json(verified_file(Path(out), arm["cache_run"], "cache_run"), "cache_run")
        written.append(_save(timeline_figure(run, arm["label"]), plots / f"arm-{i}-timeline.png"))
    return written


def simulated_arms(record: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """(index, arm) of the arms kvsim simulated: an engine arm has a measured run, no kvsim timeline."""
    return [(i, arm) for i, arm in enumerate(record["arms"]) if "cache_run" in arm]


def arms_figure(summary: Mapping[str, Any], captions: list[str]) -> Figure:
    """One horizontal bar chart per compared figure, every arm a bar named by its caption (on the left column
    only: the rows are shared), values on the axis in their units. Bars lie horizontally so that any number of
    arms with long names gets one line each, never overlapping."""
    rows = summary["arms"]
    compared = DECODED if all("decode_tokens_per_s" in row for row in rows) else COMPARED
    columns = 2 if len(compared) == 4 else 3
    panel_height = max(1.6, 0.22 * len(rows) + 0.9)
    fig, axes = plt.subplots(
        len(compared) // columns, columns, figsize=(13, panel_height * len(compared) // columns + 0.5), sharey=True
    )
    positions = range(len(rows))
    for ax, (key, title) in zip(axes.flat, compared):
        values = [row.get(key) or 0 for row in rows]
        ax.barh(positions, values, color="#6366f1")
        ax.set_title(title, fontsize=9)
        ax.set_yticks(positions, captions, fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(3))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _, key=key: metric_text(key, v)))
        ax.tick_params(axis="x", labelsize=7)
    axes.flat[0].invert_yaxis()  # shared: the first arm on top, as in the table
    fig.suptitle(f"{summary['lab']}: arms compared", fontsize=11)
    fig.tight_layout(w_pad=3)
    return fig


def overlapping_labels(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of drawn, non-empty text artists of `fig` (titles, tick and axis labels, legends) whose boxes
    overlap; empty when every label can be read. A tick outside its axis's view is not drawn, so not judged."""
    renderer = cast(FigureCanvasAgg, fig.canvas).get_renderer()  # every figure here is drawn by Agg
    fig.draw(renderer)
    drawn_ticks, all_ticks = [], set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            slack = 1e-9 * max(abs(low), abs(high), 1)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                all_ticks |= {id(tick.label1), id(tick.label2)}
                if low - slack <= tick.get_loc() <= high + slack:
                    drawn_ticks += [tick.label1, tick.label2]
    texts = [t for t in fig.findobj(Text) if id(t) not in all_ticks] + drawn_ticks
    boxes = [
        (text.get_text(), text.get_window_extent(renderer))
        for text in texts
        if text.get_visible() and text.get_text().strip() and text.figure is not None
    ]
    return [
        (a, b)
        for i, (a, box) in enumerate(boxes)
        for b, other in boxes[i + 1 :]
        if box.x0 < other.x1 - 0.5 and other.x0 < box.x1 - 0.5 and box.y0 < other.y1 - 0.5 and other.y0 < box.y1 - 0.5
    ]


def timeline_figure(run: Mapping[str, Any], label: str) -> Figure:
    """Top: each request's compute works (prefill blue, decode green) and transfers; bottom: KV bytes held."""
    events = run["events"]
    requests = list(run["outcomes"]["requests"])
    row = {request_id: i for i, request_id in enumerate(requests)}
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(12, 2.2 + 0.28 * len(requests) + 2.4),
        sharex=True,
        gridspec_kw={"height_ratios": [max(2, 0.28 * len(requests)), 2.4]},
    )
    starts: dict[str, Mapping[str, Any]] = {}
    bars: dict[tuple[int, str, float], list[tuple[float, float]]] = defaultdict(list)  # one artist per group
    for event in events:
        if event["kind"] in ("compute_start", "transfer_start"):
            starts[event["event_id"]] = event
        elif event["kind"] in ("compute_end", "transfer_end"):
            start = starts[event["causes"][0]]
            if event["kind"] == "compute_end":
                color, height = PHASE_COLORS.get(event["phase"], "#6b7280"), 0.7
            else:
                color, height = "#dc2626", 0.3
            span = (start["time_us"], max(event["time_us"] - start["time_us"], 0.5))
            bars[row[event["request_id"]], color, height].append(span)
    for (y, color, height), spans in bars.items():
        top.broken_barh(spans, (y - height / 2, height), color=color)
    for request_id, outcome in run["outcomes"]["requests"].items():
        top.plot([outcome["arrival_us"]], [row[request_id]], marker="|", color="black", markersize=8)
        if outcome["status"] == "cancelled":
            top.plot([outcome["end_us"]], [row[request_id]], marker="x", color="#b91c1c")
    top.set_yticks(range(len(requests)), requests, fontsize=7)
    top.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (*PHASE_COLORS.values(), "#dc2626")]
    top.legend(handles, [*PHASE_COLORS, "transfer"], fontsize=7, loc="upper right")
    top.set_title(f"kvsim timeline: {label}", fontsize=10)
    times = [e["time_us"] for e in events]
    bottom.step(times, [e["device_reserved_bytes"] for e in events], where="post", label="device reserved")
    bottom.step(times, [e["host_retained_bytes"] for e in events], where="post", label="host retained")
    device_budget = run["declaration"]["system"]["kv_cache"]["device_kv_bytes"]
    bottom.axhline(device_budget, color="#9ca3af", ls="--", lw=0.8, label="device budget")
    bottom.set_ylabel("KV held", fontsize=8)
    bottom.set_xlabel("virtual time", fontsize=8)
    bottom.legend(fontsize=7, loc="upper right")
    bottom.tick_params(labelsize=7)
    bottom.yaxis.set_major_formatter(FuncFormatter(lambda v, _: metric_text("bytes_host_to_device", v)))
    bottom.xaxis.set_major_formatter(FuncFormatter(lambda v, _: metric_text("end_us", v)))
    fig.tight_layout()
    return fig


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
