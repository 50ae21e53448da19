"""kvsim fidelity: calibrate on a profiling sweep served by the real InferenceEngine, predict three other workloads.

Every workload (`bench.workloads.fidelity_workloads`) is served for real (`inference.engine.InferenceEngine`,
wall clock, the shipped chat model, Python's garbage collector paused while the clock runs) under serialized
service and under continuous batching, `--repeats` times each, the workloads interleaved (ABCABC...: a change
in the machine's speed hits them all alike), each repeat starting one workload later than the one before
(ABC, BCA, CAB: no workload always runs first or last). `jgpt kvsim calibrate`'s fit runs on the calibration
workloads' runs of this bench run only; kvsim then predicts each other workload's runs from their systems,
arrivals and recorded computations (`kvsim.fidelity.simulated_totals`), with the calibrated service (its
spread: the median over simulated repeats of every measured repeat), with the same service fitted without
its spread (every work its mean time), without its finish term, without its after_other term, and with the
hypothetical default rates of docs/experiments.md. Printed per workload, policy and field: the measured
median over repeats with the repeats' minimum and maximum and its noise band (`kvsim.fidelity.noise_band`:
how far a median of that many runs strays by their own noise), each prediction and its error; then how many
latencies each model predicts within 10% and the worst, and how many misses lie beyond the noise band; the
noise band of the median of 1 to 45 repeats per field (`noise_table`); and per repeat the stalled works
(`stall_table`) with what the machine did meanwhile (`machine_counters`).

    .venv/bin/python bench/fidelity.py [--repeats 15] [--scale 4] [--out-dir runs/fidelity] [--gc-compare]
    .venv/bin/python bench/fidelity.py --from-dir runs/fidelity

The result (bench/result.py: the fit, the predictions, the summary and the noise table) goes to
bench/results/ or `--results DIR`, with the measured-vs-predicted plot beside it. --from-dir DIR serves
nothing: it reads the measured-run documents an earlier bench run left in DIR (WORKLOAD-POLICY-REPEAT.json),
refits on its calibration runs, predicts its other runs and prints the same tables (for trying a change of
the fit or the duration model on runs measured on a quiet machine); its result is `fidelity-refit`.
--gc-compare also serves each predicted workload with the collector left on, interleaved, and compares the
measured tails. The measured-run documents and the service fragment are written to --out-dir, so `jgpt kvsim
calibrate` and `jgpt kvsim predict` can be run on them by hand. The machine is shared: run it on a quiet one
for figures worth quoting.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import io
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

_HERE, _ROOT = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent
sys.path[:] = [str(_ROOT), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

import inference.engine  # noqa: E402
from bench.result import BenchRun, add_results_argument  # noqa: E402
from bench.workloads import CALIBRATION, SCALE, fidelity_workloads  # noqa: E402
from inference.engine import InferenceEngine, read_served_workload  # noqa: E402
from inference.execution import ModelExecution  # noqa: E402
from inference.measured_run import measured_run  # noqa: E402
from jgpt.artifacts.catalog import load_model, read_catalog  # noqa: E402
from kvsim.calibration import (
    AFTER_OTHER,
    FINISH,
    OPTIONAL_TERMS,
    SPREAD,
    fit,
    fit_table,
)  # noqa: E402
from kvsim.fidelity import (  # noqa: E402
    NOISE_LEVEL,
    SPREAD_REPEATS,
    compare,
    median_totals,
    noise_band,
    replay,
    simulated_totals,
)
from kvsim.measured_run import load_measured_run, read_measured_run  # noqa: E402
from kvsim.system import parse_system  # noqa: E402

POLICIES = ("serialized", "continuous_batching")
GOAL = 0.10
# A measured median's noise band at most this wide makes GOAL a test of the model: a perfect model then
# misses GOAL on a field about once in a thousand (noise_table says how many repeats each field needs).
QUIET_BAND = GOAL / 2
NOISE_REPEATS = (1, 3, 5, 9, 15, 25, 45)  # the repeats noise_table shows the band of the median for
STALL = 2.5  # a work over this many times its shape's median time is counted as stalled (stall_table)
# The models compared: the calibrated service as `jgpt kvsim calibrate` fits it (with its spread: the median
# over simulated repeats), and fitted without one of its optional terms each: the spread (every work its mean
# time), the finish, after_other.
MODELS = {
    "calibrated": OPTIONAL_TERMS,
    "deterministic": (FINISH, AFTER_OTHER),
    "without finish": (SPREAD, AFTER_OTHER),
    "without after_other": (FINISH, SPREAD),
}
SHOWN = (*MODELS, "hypothetical")  # the predictions each row shows


def serve(execution, tokenizer, document: dict, system_json: dict) -> dict:
    config = parse_system(system_json)
    requests, interaction = read_served_workload(document, tokenizer, execution)
    served = InferenceEngine(execution, config).serve(requests, interaction)
    return measured_run(execution, config, served, kind=document["kind"], interaction=interaction, tokenizer=tokenizer)


@contextlib.contextmanager
def collector_left_on(collections: list[float]):
    """Serve with Python's garbage collector running as usual (the engine pauses it while its clock runs),
    appending the seconds of every collection inside a run's clock to `collections`."""
    started: list[float] = []

    def timer(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            collections.append(time.perf_counter() - started.pop())

    @contextlib.contextmanager
    def timed():
        gc.callbacks.append(timer)
        try:
            yield
        finally:
            gc.callbacks.remove(timer)

    paused = inference.engine.collector_paused
    inference.engine.collector_paused = timed
    try:
        yield
    finally:
        inference.engine.collector_paused = paused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 15: the most that keeps the bench near 15 minutes on the quiet 2-core machine; fewer leave the measured
    # medians' noise bands wider than the goal (docs/kvsim-calibration.md, "Fidelity").
    parser.add_argument("--repeats", type=int, default=15, help="engine runs per workload and policy (noise band)")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/fidelity"))
    parser.add_argument("--gc-compare", action="store_true", help="also serve the predicted workloads with the GC on")
    parser.add_argument("--from-dir", type=Path, help="refit and predict the runs saved there; serve nothing")
    parser.add_argument(
        "--scale", type=int, default=SCALE, help=f"predicted workloads this many times as long (default {SCALE})"
    )
    add_results_argument(parser)
    args = parser.parse_args()
    if args.from_dir is not None:
        if args.gc_compare:
            parser.error("--from-dir serves nothing: it takes no --gc-compare")
        bench = BenchRun.start("fidelity-refit", __doc__)
        runs = saved_runs(args.from_dir)
        print(f"read {sum(map(len, runs.values()))} measured runs from {args.from_dir}")
        table, _, fits = evaluate(runs)
        print("\n" + summarize(table))
        bench.write(figures(table, fits), args.results, note=f"Refitted on the measured runs in {args.from_dir}.",
                    plots={"fidelity.png": plot(table)})  # fmt: skip
        return
    bench = BenchRun.start("fidelity", __doc__)
    started = time.monotonic()
    artifact = load_model(read_catalog().default_id())
    tokenizer = artifact.tokenizer()
    execution = ModelExecution.from_artifact(artifact, tokenizer)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[str, str], list] = {}
    machine: dict[tuple[str, str], list] = {}  # per run: what the machine did meanwhile (machine_counters)
    collected: dict[tuple[str, str], list] = {}  # with the collector left on (--gc-compare)
    collections: dict[tuple[str, str], list] = {}  # the seconds of each collection in those runs, per run
    served = list(fidelity_workloads(execution.costs.kv_bytes_per_position, args.scale).items())
    for repeat in range(args.repeats):  # interleaved: every workload once per repeat, each repeat starting one later
        start = repeat % len(served)
        for name, (document, make_system) in served[start:] + served[:start]:
            for policy in POLICIES:
                before = machine_counters()
                runs.setdefault((name, policy), []).append(_served(args.out_dir, name, policy, repeat, execution,
                                                                   tokenizer, document, make_system(policy)))  # fmt: skip
                machine.setdefault((name, policy), []).append([b - a for a, b in zip(before, machine_counters())])
                if args.gc_compare and not name.startswith(CALIBRATION):
                    seconds: list[float] = []
                    with collector_left_on(seconds):
                        collected.setdefault((name, policy), []).append(_served(
                            args.out_dir, f"{name} gc on", policy, repeat, execution, tokenizer, document,
                            make_system(policy)))  # fmt: skip
                    collections.setdefault((name, policy), []).append(seconds)
        print(f"repeat {repeat + 1} of {args.repeats} served ({time.monotonic() - started:.0f} s)", flush=True)
    table, fragments, fits = evaluate(runs, machine)
    (args.out_dir / "service.json").write_text(json.dumps(fragments["calibrated"], indent=1) + "\n")
    (args.out_dir / "fidelity.json").write_text(json.dumps(table, indent=1) + "\n")
    if collected:
        print(gc_comparison(runs, collected, collections))
    took = time.monotonic() - started
    print(f"\n{summarize(table)}\nbench took {took:.0f} s")
    calibration = sum(len(measured) for (name, _), measured in runs.items() if name.startswith(CALIBRATION))
    note = f"Fitted on the {calibration} calibration runs; the bench took {took:.0f} s."
    bench.write(figures(table, fits), args.results, note=note, plots={"fidelity.png": plot(table)})


def evaluate(runs: dict, machine: dict | None = None) -> tuple[list[dict], dict[str, dict], list]:
    """Fit each model on the calibration workloads' runs and predict the others; print the fits, the table,
    the replay check and the stalled works (with `machine`, what the machine did during each run).
    (the table, the fragments, the calibrated fit's KindFits)"""
    calibration = [run for (name, _), measured in runs.items() if name.startswith(CALIBRATION) for run in measured]
    fragments, fits = {}, {}
    for model, optional in MODELS.items():
        fragments[model], fits[model], notes = fit(calibration, optional)
        print(f"\n{model}: fitted on {len(calibration)} runs of the calibration workloads "
              f"({fragments[model]['calibration']['works']} works):\n{fit_table(fits[model], notes)}")  # fmt: skip
    table = fidelity(runs, fragments)
    print(render(table))
    print(noise_table(table))
    print(
        "\nkvsim fed every work's and transfer's measured time (its rules alone), largest latency error over repeats:"
    )
    for (name, policy), measured in runs.items():
        print(f"  {name:<26}{policy:<21}{100 * max(replayed_error(r) for r in measured):.2f}%")
    print(stall_table(runs, machine))
    return table, fragments, fits["calibrated"]


def machine_counters() -> tuple[int, int, int]:
    """(the machine's steal time in ms: a virtual machine's CPU time its host gave to others; this process's
    involuntary context switches: its threads preempted; its minor page faults), counted since boot or start."""
    with open("/proc/stat") as stat:
        steal = int(stat.readline().split()[8])  # cpu user nice system idle iowait irq softirq steal ...
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return steal * 1000 // os.sysconf("SC_CLK_TCK"), usage.ru_nivcsw, usage.ru_minflt


def stall_table(runs: dict, machine: dict | None = None) -> str:
    """Per workload, policy and repeat: the works that took over STALL times the median of their shape in the
    whole bench run, and the time they took beyond that median; with `machine` (not kept in saved runs), the
    machine_counters during the run. Stalled works come in bursts that span neighbouring runs, not from the
    workload: a repeat with many measures the machine, which no duration model of the engine predicts."""
    shape = lambda run, w: (w["kind"], w["window"], w["executed_rows"], run.slot_capacity)  # noqa: E731
    walls: dict = {}
    for run in (r for measured in runs.values() for r in measured):
        for w in run.works:
            walls.setdefault(shape(run, w), []).append(w["wall_us"])
    medians = {key: statistics.median(values) for key, values in walls.items()}
    lines = [
        f"\nstalled works (over {STALL}x their shape's median in this bench run) per repeat: count, ms beyond the median"
        + ("; then steal ms, involuntary context switches, minor page faults during the run" if machine else "")
    ]
    for (name, policy), measured in runs.items():
        cells = []
        for n, run in enumerate(measured):
            excess = [
                w["wall_us"] - medians[shape(run, w)]
                for w in run.works
                if w["wall_us"] > STALL * medians[shape(run, w)]
            ]
            counters = "" if not machine else " ({} {} {})".format(*machine[name, policy][n])
            cells.append(f"{len(excess):>3} {sum(excess) / 1000:>6.1f}{counters}")
        lines.append(f"  {name:<26}{policy:<21}" + "  ".join(cells))
    return "\n".join(lines)


def saved_runs(directory: Path) -> dict[tuple[str, str], list]:
    """The measured runs `_served` wrote to `directory`, per (workload, policy) in repeat order, in the order
    the bench serves them (the workloads' names from `workloads`; their systems are not needed here)."""
    runs = {}
    for name in fidelity_workloads(kv_bytes=1):
        for policy in POLICIES:
            prefix = f"{_slug(name)}-{policy}-"
            paths = [p for p in directory.glob(f"{prefix}*.json") if p.stem.removeprefix(prefix).isdigit()]
            for path in sorted(paths, key=lambda p: int(p.stem.removeprefix(prefix))):
                runs.setdefault((name, policy), []).append(load_measured_run(path, str(path)))
    calibrated = [name.startswith(CALIBRATION) for name, _ in runs]
    if not any(calibrated) or all(calibrated):
        raise SystemExit(f"{directory}: expected measured runs of the calibration and the predicted workloads")
    return runs


def _served(out_dir: Path, name: str, policy: str, repeat: int, execution, tokenizer, document, system_json):
    measured = serve(execution, tokenizer, document, system_json)
    data = (json.dumps(measured) + "\n").encode()
    (out_dir / f"{_slug(name)}-{policy}-{repeat}.json").write_bytes(data)
    return read_measured_run(measured, hashlib.sha256(data).hexdigest())


def fidelity(runs: dict, fragments: dict[str, dict]) -> list[dict]:
    """One row per predicted workload, policy and field: the measured median and range, each prediction."""
    rows = []
    for (name, policy), measured in runs.items():
        if name.startswith(CALIBRATION):
            continue
        simulated = {model: [simulated_totals(r, fragment, SPREAD_REPEATS, n * SPREAD_REPEATS) for n, r in enumerate(measured)]
                     for model, fragment in [*fragments.items(), ("hypothetical", None)]}  # fmt: skip
        per_repeat = [{model: compare(r.document["totals"], median_totals(sims[n])) for model, sims in simulated.items()}
                      for n, r in enumerate(measured)]  # fmt: skip
        # A latency's prediction: the median over every simulated run of every measured repeat (one each
        # without a spread), as the measured figure is the median over the repeats.
        pooled = {model: compare(measured[0].document["totals"], median_totals([t for s in sims for t in s]))
                  for model, sims in simulated.items()}  # fmt: skip
        for index, first in enumerate(per_repeat[0]["calibrated"]):
            values = [repeat["calibrated"][index].measured for repeat in per_repeat]
            head = {"workload": name, "policy": policy, "field": first.field.removesuffix("_us")}
            if first.exact:
                predicted = [repeat["calibrated"][index].predicted for repeat in per_repeat]
                rows.append(head | {"kind": "hit", "measured": values, "predicted": predicted,
                                    "exact": all(m == p for m, p in zip(values, predicted, strict=True))})  # fmt: skip
                continue
            if any(v is None for v in values):
                continue
            median = statistics.median(values)
            row = head | {"kind": "busy" if first.field == "compute_busy_us" else "latency", "measured": median,
                          "low": min(values), "high": max(values), "values": values, "noise": noise_band(values)}  # fmt: skip
            for model in per_repeat[0]:
                value = pooled[model][index].predicted
                row |= {model: value, f"{model} error": (value - median) / median}
            rows.append(row)
    return rows


def noise_table(table: list[dict]) -> str:
    """Per predicted field: the noise band of the median of n engine runs for each n of NOISE_REPEATS,
    resampled from this bench run's repeats (beyond their number an extrapolation from them), and the
    fewest of those n whose band is within QUIET_BAND; then per n the fields within it."""
    rows = [row for row in table if row["kind"] != "hit"]
    bands = {id(row): [noise_band(row["values"], n) for n in NOISE_REPEATS] for row in rows}
    lines = [f"\nnoise band ({NOISE_LEVEL:.0%}) of the median of n repeats, resampled from this run's "
             f"{len(rows[0]['values'])}; the fewest n with a band within {QUIET_BAND:.0%}:",
             f"  {'workload':<24}{'policy':<21}{'field':<14}" + "".join(f"{'n=' + str(n):>8}" for n in NOISE_REPEATS)
             + f"{'needs':>8}"]  # fmt: skip
    for row in rows:
        needed = next(
            (str(n) for n, b in zip(NOISE_REPEATS, bands[id(row)]) if b <= QUIET_BAND), f">{NOISE_REPEATS[-1]}"
        )
        lines.append(f"  {row['workload']:<24}{row['policy']:<21}{row['field']:<14}"
                     + "".join(f"{100 * b:>7.1f}%" for b in bands[id(row)]) + f"{needed:>8}")  # fmt: skip
    latency = [bands[id(row)] for row in rows if row["kind"] == "latency"]
    lines.append(f"  latencies within {QUIET_BAND:.0%}:{'':<44}"
                 + "".join(f"{sum(b[i] <= QUIET_BAND for b in latency):>5}/{len(latency)}" for i in range(len(NOISE_REPEATS))))  # fmt: skip
    return "\n".join(lines)


def replayed_error(run) -> float:
    """The largest latency error of kvsim fed every work's and transfer's measured time (`kvsim.fidelity.replay`)."""
    rows = compare(run.document["totals"], replay(run))
    return max(abs(r.error) for r in rows if r.error is not None)


def summarize(table: list[dict]) -> str:
    """Per model: latencies within the goal, the mean absolute error and the worst row; hit rates exact."""
    latency = [row for row in table if row["kind"] == "latency"]
    hits = [row for row in table if row["kind"] == "hit"]
    lines = []
    for model in SHOWN:
        errors = [abs(row[f"{model} error"]) for row in latency]
        worst = max(latency, key=lambda row: abs(row[f"{model} error"]))
        lines.append(
            f"{model}: {sum(e <= GOAL for e in errors)} of {len(errors)} latencies within {GOAL:.0%}, "
            f"{sum(e <= 2 * GOAL for e in errors)} within {2 * GOAL:.0%}, mean |error| {100 * statistics.mean(errors):.1f}%, "
            f"worst {100 * worst[f'{model} error']:+.1f}% ({worst['workload']}, {worst['policy']}, {worst['field']})"
        )  # fmt: skip
    misses = [row for row in latency if abs(row["calibrated error"]) > GOAL]
    beyond = sum(abs(row["calibrated error"]) > row["noise"] for row in misses)
    lines.append(f"calibrated misses of {GOAL:.0%} beyond the measured median's {NOISE_LEVEL:.0%} noise band: {beyond} of "
                 f"{len(misses)}; noise bands within {QUIET_BAND:.0%}: {sum(r['noise'] <= QUIET_BAND for r in latency)} "
                 f"of {len(latency)}")  # fmt: skip
    inside = sum(row["low"] <= row["calibrated"] <= row["high"] for row in latency)
    lines.append(f"calibrated predictions inside the measured range: {inside} of {len(latency)}; "
                 f"hit rates exact in every repeat: {sum(row['exact'] for row in hits)} of {len(hits)}")  # fmt: skip
    return "\n".join(lines)


def render(table: list[dict]) -> str:
    lines = [
        "",
        f"{'workload':<24}{'policy':<21}{'field':<16}{'measured [range]':>24}{'noise':>8}"
        + "".join(f"{model[:14]:>15}{'error':>9}" for model in SHOWN),
    ]
    for row in table:
        head = f"{row['workload']:<24}{row['policy']:<21}{row['field']:<16}"
        if row["kind"] == "hit":
            measured = "/".join(_num(v) for v in sorted(set(row["measured"]), key=str))
            predicted = "/".join(_num(v) for v in sorted(set(row["predicted"]), key=str))
            lines.append(f"{head}{measured:>24}{'':>8}{predicted:>15}{'exact' if row['exact'] else 'DIFFERS':>9}")
            continue
        mark = "" if abs(row["calibrated error"]) <= GOAL else " *"
        measured = f"{row['measured'] / 1000:.2f} [{row['low'] / 1000:.2f}-{row['high'] / 1000:.2f}]"
        predictions = "".join(f"{row[m] / 1000:>15.2f}{100 * row[f'{m} error']:>+8.1f}%" for m in SHOWN)
        lines.append(f"{head}{measured:>24}{100 * row['noise']:>7.1f}%{predictions}{mark}")
    lines.append(f"(ms; measured: median over repeats [min-max]; noise: its {NOISE_LEVEL:.0%} band, noise_band; "
                 f"* calibrated misses {GOAL:.0%})")  # fmt: skip
    return "\n".join(lines)


def figures(table: list[dict], fits: list) -> dict:
    """The result's tables: each model's summary, the calibrated fit, every prediction, the noise bands."""
    latency = [row for row in table if row["kind"] == "latency"]
    summary = {}
    for model in SHOWN:
        errors = [abs(row[f"{model} error"]) for row in latency]
        worst = max(latency, key=lambda row: abs(row[f"{model} error"]))
        summary[model] = {
            "latencies_count": len(errors), "within_10_percent_count": sum(e <= GOAL for e in errors),
            "within_20_percent_count": sum(e <= 2 * GOAL for e in errors),
            "mean_abs_error_percent": 100 * statistics.mean(errors), "worst_error_percent": 100 * worst[f"{model} error"],
            "worst": f"{worst['workload']}, {worst['policy']}, {worst['field']}",
        }  # fmt: skip
    misses = [row for row in latency if abs(row["calibrated error"]) > GOAL]
    checks = {}
    checks["calibrated"] = {
        "misses_count": len(misses), "misses_beyond_noise_band_count": sum(abs(r["calibrated error"]) > r["noise"] for r in misses),
        "noise_bands_within_5_percent_count": sum(r["noise"] <= QUIET_BAND for r in latency),
        "inside_measured_range_count": sum(r["low"] <= r["calibrated"] <= r["high"] for r in latency),
    }  # fmt: skip
    hits = [row for row in table if row["kind"] == "hit"]
    checks["hit rates"] = {"exact_in_every_repeat_count": sum(row["exact"] for row in hits), "rows_count": len(hits)}
    fitted = {f.kind: {"works_count": f.count, "mean_wall_us": f.mean_wall_us, "mean_error_us": f.mean_error_us,
                       "p90_relative_error_fraction": f.p90_relative_error}
                      | {name.replace("_us", "").replace(".", "_") + "_us": value for name, value in f.terms.items()}
              for f in fits}  # fmt: skip
    predictions = {
        f"{row['workload']}, {row['policy']}, {row['field']}": {
            "measured_ms": row["measured"] / 1000, "lowest_ms": row["low"] / 1000, "highest_ms": row["high"] / 1000,
            "noise_band_percent": 100 * row["noise"], "calibrated_ms": row["calibrated"] / 1000,
        } | {f"{_column(model)}_error_percent": 100 * row[f"{model} error"] for model in SHOWN}
        for row in latency + [row for row in table if row["kind"] == "busy"]
    }  # fmt: skip
    bands = {}
    for row in (row for row in table if row["kind"] != "hit"):
        band = [noise_band(row["values"], n) for n in NOISE_REPEATS]
        needed = next((str(n) for n, b in zip(NOISE_REPEATS, band) if b <= QUIET_BAND), f">{NOISE_REPEATS[-1]}")
        bands[f"{row['workload']}, {row['policy']}, {row['field']}"] = {
            f"median_of_{n}_percent": 100 * b for n, b in zip(NOISE_REPEATS, band)
        } | {"repeats_for_a_5_percent_band": needed}
    return {
        f"latencies within {GOAL:.0%} of the measured median (summary)": summary,
        "the calibrated service's misses against the noise; hit rates": checks,
        "the calibrated fit, per kind of work (terms in us)": fitted,
        "predictions: measured median over repeats and each model's error": predictions,
        f"noise band ({NOISE_LEVEL:.0%}) of the median of n repeats": bands,
    }


def _column(name: str) -> str:
    return "_".join(name.replace("_", " ").split())


def gc_comparison(runs: dict, collected: dict, collections: dict) -> str:
    """Per predicted workload and policy: the collections inside a run with the collector left on, and the
    median over repeats of each p90 latency, the collector paused (as the engine serves) against left on,
    with the largest of each over the repeats."""
    lines = ["", "garbage collector left on: collections inside a run's clock (per run: count, ms in all; "
             "median over repeats)", "and paused vs left on (ms; p90 latencies, median over repeats [max]):"]  # fmt: skip
    for key, on in collected.items():
        per_run = collections[key]
        cells = [f"{statistics.median(map(len, per_run)):.0f} collections, "
                 f"{statistics.median(1000 * sum(s) for s in per_run):.2f} ms"]  # fmt: skip
        for name in ("ttft", "tpot", "e2e"):
            paused, left = ([r.document["totals"]["latency_us"][name]["p90"] for r in rs] for rs in (runs[key], on))
            cells.append(f"{name} {statistics.median(paused) / 1000:.2f} [{max(paused) / 1000:.2f}] vs "
                         f"{statistics.median(left) / 1000:.2f} [{max(left) / 1000:.2f}]")  # fmt: skip
        lines.append(f"  {key[0]:<24}{key[1]:<21}" + "   ".join(cells))
    return "\n".join(lines)


def plot(table: list[dict]) -> bytes:
    """The measured-vs-predicted plot of every latency, as PNG."""
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
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=110)
    plt.close(figure)
    return image.getvalue()


def _num(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


if __name__ == "__main__":
    main()
