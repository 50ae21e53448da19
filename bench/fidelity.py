"""kvsim fidelity: calibrate on one workload served by the real InferenceEngine, predict three others.

Every workload is served for real (`inference.engine.InferenceEngine`, wall
clock, the shipped chat model) under serialized service and under continuous
batching, `--repeats` times each for the noise band. `jgpt kvsim calibrate`'s
fit runs on the calibration workload's measured runs only; kvsim then predicts
each other workload's run from its system, arrivals and recorded computations
(`kvsim.fidelity.predict`), once with the calibrated service and once with the
hypothetical default rates of docs/experiments.md, and the bench prints, field
by field: measured (median over repeats), the repeats' spread, predicted, error.

    .venv/bin/python bench/fidelity.py [--repeats 3] [--out-dir runs/fidelity] [--plot docs/kvsim-fidelity.png]

The measured-run documents and the service fragment are written to --out-dir,
so `jgpt kvsim calibrate` and `jgpt kvsim predict` can be run on them by hand.
The machine is shared: run it on a quiet one for figures worth quoting.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

_HERE, _ROOT = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent
sys.path[:] = [str(_ROOT), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from bench.workloads import burst_workload, chat_workload, system  # noqa: E402
from inference.engine import InferenceEngine, read_served_workload  # noqa: E402
from inference.execution import ModelExecution  # noqa: E402
from inference.measured_run import measured_run  # noqa: E402
from jgpt.catalog import load_model, read_catalog  # noqa: E402
from kvsim.calibration import fit, fit_table, read_measured_run  # noqa: E402
from kvsim.fidelity import compare, predict, replay  # noqa: E402
from kvsim.system import parse_system  # noqa: E402

POLICIES = ("serialized", "continuous_batching")
GOAL = 0.10


def workloads(kv_bytes: int) -> dict[str, tuple[dict, object]]:
    """name -> (Workload document, system for a policy). Names starting with "calibration" are fitted."""
    ample = 1 << 40  # bytes: nothing is ever evicted
    calibration = chat_workload(conversations=12, turns=4, spread_us=600_000, seed=11)
    return {
        # The calibration workload, served whole with a host tier under a tight device budget (every kind of
        # work occurs; the engine's slots hold the context), and its first turns only, arriving fifty times
        # as fast (decode batches of up to 8 rows, half the slots).
        "calibration": (calibration, lambda p: system(p, 8, 512 * kv_bytes, 4096 * kv_bytes)),
        "calibration, first turns": (_first_turns(calibration, 50), lambda p: system(p, 8, ample, 0)),
        # And whole, four times slower (2.4 s): idle stretches of tens of milliseconds, after which works run cold.
        "calibration, spread out": (_stretched(calibration, 4), lambda p: system(p, 8, ample, 0)),
        "multi-turn chat": (
            chat_workload(conversations=12, turns=4, spread_us=2_000_000, seed=0),
            lambda p: system(p, 4, ample, 0),
        ),
        "burst": (burst_workload(requests=32, seed=1), lambda p: system(p, 8, ample, 0)),
        "long prompts, host tier": (
            _longest_turns(chat_workload(conversations=16, turns=4, spread_us=1_500_000, seed=5)),
            lambda p: system(p, 4, 512 * kv_bytes, 4096 * kv_bytes),
        ),
    }


def _first_turns(document: dict, faster: int) -> dict:
    first = [r | {"arrival_us": r["arrival_us"] // faster} for r in document["requests"] if r["request_id"].endswith("t0")]
    return document | {"requests": first}


def _stretched(document: dict, slower: int) -> dict:
    return document | {"requests": [r | {"arrival_us": r["arrival_us"] * slower} for r in document["requests"]]}


def _longest_turns(document: dict) -> dict:
    """Only the later turns of each chat, the longest prompts (a chat's first one served finds nothing to reuse)."""
    requests = [r for r in document["requests"] if not r["request_id"].endswith("t0")]
    return document | {"kind": "long_prompts", "requests": requests}


def serve(execution, tokenizer, document: dict, system_json: dict) -> dict:
    config = parse_system(system_json)
    requests, interaction = read_served_workload(document, tokenizer, execution)
    served = InferenceEngine(execution, config).serve(requests, interaction)
    return measured_run(execution, config, served, kind=document["kind"], interaction=interaction, tokenizer=tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="engine runs per workload and policy (noise band)")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/fidelity"))
    parser.add_argument("--plot", type=Path, help="also write the measured-vs-predicted plot here (PNG)")
    args = parser.parse_args()
    started = time.monotonic()
    artifact = load_model(read_catalog().default_id())
    tokenizer = artifact.tokenizer()
    execution = ModelExecution.from_artifact(artifact, tokenizer)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[str, str], list] = {}
    # Repeats go round all workloads in turn, so that a change in the machine's load spreads over all of them.
    for repeat in range(args.repeats):
        for name, (document, make_system) in workloads(execution.costs.kv_bytes_per_position).items():
            for policy in POLICIES:
                measured = serve(execution, tokenizer, document, make_system(policy))
                data = (json.dumps(measured) + "\n").encode()
                (args.out_dir / f"{_slug(name)}-{policy}-{repeat}.json").write_bytes(data)
                runs.setdefault((name, policy), []).append(read_measured_run(measured, hashlib.sha256(data).hexdigest()))
        print(f"repeat {repeat + 1} of {args.repeats} served ({time.monotonic() - started:.0f} s)", flush=True)
    calibration = [run for (name, _), measured in runs.items() if name.startswith("calibration") for run in measured]
    fragment, fits, notes = fit(calibration)
    (args.out_dir / "service.json").write_text(json.dumps(fragment, indent=1) + "\n")
    print(f"\ncalibrated on {len(calibration)} runs of the calibration workload ({fragment['calibration']['works']} works):")
    print(fit_table(fits, notes))
    table = fidelity(runs, fragment)
    print(render(table))
    print("\nkvsim fed every work's and transfer's measured time (its rules alone), largest latency error over repeats:")
    for (name, policy), measured in runs.items():
        print(f"  {name:<26}{policy:<21}{100 * max(replayed_error(r) for r in measured):.2f}%")
    print(f"\nworst latency error: calibrated {_worst(table, 'calibrated')}, hypothetical {_worst(table, 'hypothetical')}; "
          f"hit rates exact in {sum(r['exact'] for r in table if r['kind'] == 'hit')} of "
          f"{sum(r['kind'] == 'hit' for r in table)}; bench took {time.monotonic() - started:.0f} s")  # fmt: skip
    (args.out_dir / "fidelity.json").write_text(json.dumps(table, indent=1) + "\n")
    (args.out_dir / "fidelity.md").write_text(markdown(table))
    if args.plot:
        plot(table, args.plot)
        print(f"plot: {args.plot}")


def fidelity(runs: dict, fragment: dict) -> list[dict]:
    """One row per workload, policy and field: the measured median and spread, and both predictions."""
    rows = []
    for (name, policy), measured in runs.items():
        if name.startswith("calibration"):
            continue
        per_repeat = [
            (compare(r.document["totals"], predict(r, fragment).outcomes["totals"]),
             compare(r.document["totals"], predict(r, None).outcomes["totals"]))
            for r in measured
        ]  # fmt: skip
        for index, first in enumerate(per_repeat[0][0]):
            values = [calibrated[index].measured for calibrated, _ in per_repeat]
            if first.exact:
                exact = all(c[index].measured == c[index].predicted for c, _ in per_repeat)
                rows.append({"workload": name, "policy": policy, "field": first.field, "kind": "hit",
                             "measured": values, "predicted": [c[index].predicted for c, _ in per_repeat],
                             "exact": exact})  # fmt: skip
                continue
            if any(v is None for v in values):
                continue
            median = statistics.median(values)
            calibrated = statistics.median(c[index].predicted for c, _ in per_repeat)
            hypothetical = statistics.median(h[index].predicted for _, h in per_repeat)
            rows.append({
                "workload": name, "policy": policy, "field": first.field.removesuffix("_us"), "measured": median,
                "kind": "busy" if first.field == "compute_busy_us" else "latency",
                "low": min(values), "high": max(values), "spread": (max(values) - min(values)) / median if median else 0.0, "calibrated": calibrated,
                "calibrated_error": (calibrated - median) / median, "hypothetical": hypothetical,
                "hypothetical_error": (hypothetical - median) / median,
            })  # fmt: skip
    return rows


def replayed_error(run) -> float:
    """The largest latency error of kvsim fed every work's and transfer's measured time (`kvsim.fidelity.replay`)."""
    rows = compare(run.document["totals"], replay(run))
    return max(abs(r.error) for r in rows if r.error is not None)


def render(table: list[dict]) -> str:
    lines = [
        "",
        f"{'workload':<24}{'policy':<21}{'field':<16}{'measured':>10}{'spread':>8}"
        f"{'calibrated':>12}{'error':>8}{'hypoth.':>10}{'error':>9}",
    ]
    for row in table:
        head = f"{row['workload']:<24}{row['policy']:<21}{row['field']:<16}"
        if row["kind"] == "hit":
            measured = "/".join(_num(v) for v in sorted(set(row["measured"]), key=str))
            predicted = "/".join(_num(v) for v in sorted(set(row["predicted"]), key=str))
            lines.append(f"{head}{measured:>10}{'':>8}{predicted:>12}{'exact' if row['exact'] else 'DIFFERS':>8}")
            continue
        mark = "" if abs(row["calibrated_error"]) <= GOAL else " *"
        lines.append(
            f"{head}{row['measured']:>10.0f}{100 * row['spread']:>7.0f}%{row['calibrated']:>12.0f}"
            f"{100 * row['calibrated_error']:>+7.1f}%{row['hypothetical']:>10.0f}{100 * row['hypothetical_error']:>+8.1f}%{mark}"
        )
    lines.append(f"(latencies in us; measured = median over repeats, spread = (max - min) / median; * misses {GOAL:.0%})")
    return "\n".join(lines)


def markdown(table: list[dict]) -> str:
    """The tables docs/kvsim.md shows: latencies in ms, then hit rates."""
    lines = [
        "| workload | policy | field | measured ms | spread | calibrated ms | error | hypothetical ms | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in table if r["kind"] != "hit"):
        lines.append(
            f"| {r['workload']} | {r['policy']} | {r['field']} | {r['measured'] / 1000:.2f} | {100 * r['spread']:.0f}% | "
            f"{r['calibrated'] / 1000:.2f} | {100 * r['calibrated_error']:+.1f}% | {r['hypothetical'] / 1000:.2f} | "
            f"{100 * r['hypothetical_error']:+.1f}% |"
        )
    lines += ["", "| workload | policy | field | measured (each repeat) | predicted | |", "|---|---|---|---|---|---|"]
    for r in (r for r in table if r["kind"] == "hit"):
        measured = ", ".join(_num(v) for v in r["measured"])
        predicted = ", ".join(sorted({_num(v) for v in r["predicted"]}))
        lines.append(f"| {r['workload']} | {r['policy']} | {r['field']} | {measured} | {predicted} | "
                     f"{'exact' if r['exact'] else 'differs'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latency = [row for row in table if row["kind"] == "latency"]
    figure, axes = plt.subplots(figsize=(6, 5.5))
    measured = [r["measured"] / 1000 for r in latency]
    band = [[(r["measured"] - r["low"]) / 1000 for r in latency], [(r["high"] - r["measured"]) / 1000 for r in latency]]
    for key, marker, label in (("calibrated", "o", "calibrated service"), ("hypothetical", "x", "hypothetical rates")):
        axes.errorbar(measured, [r[key] / 1000 for r in latency], xerr=band, fmt=marker, elinewidth=0.6, label=label)
    low = min(min(r["low"], r["calibrated"], r["hypothetical"]) for r in latency) / 1000 / 1.5
    high = max(max(r["high"], r["calibrated"], r["hypothetical"]) for r in latency) / 1000 * 1.5
    line = [low, high]
    axes.plot(line, line, color="black", linewidth=0.8, label="predicted = measured")
    axes.fill_between(line, [v * (1 - GOAL) for v in line], [v * (1 + GOAL) for v in line], color="grey", alpha=0.2,
                      label=f"within {GOAL:.0%}")  # fmt: skip
    axes.set(xscale="log", yscale="log", xlim=line, ylim=line, xlabel="measured on the engine (ms)",
             ylabel="predicted by kvsim (ms)", title="kvsim vs InferenceEngine: TTFT, TPOT, E2E p50/p90\n"
             "(measured: median of the repeats, bars: their range)")  # fmt: skip
    axes.legend(loc="upper left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def _worst(table: list[dict], key: str) -> str:
    worst = max((r for r in table if r["kind"] == "latency"), key=lambda r: abs(r[f"{key}_error"]))
    return f"{100 * worst[f'{key}_error']:+.1f}% ({worst['workload']}, {worst['policy']}, {worst['field']})"


def _num(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


if __name__ == "__main__":
    main()
