"""Would a history term let a calibrated service price the engine's works? (kvsim fidelity)

Reads the measured runs earlier `bench/fidelity.py` runs left in DIR [DIR ...]
and serves nothing. Every prefill and decode work gets a shape (kind, rows,
window, the power-of-two capacity its positions fill and the engine's slot
capacity: the same shape is the same compiled program on the same data sizes)
and a key that says what the engine did just before it. The reference time of a
(shape, key) is the median over the calibration workloads' works of the same
bench run only. Then, per predicted workload, it prints the total measured
compute time over the total reference time: by shape alone, and by shape and
key, one column per DIR. 1.00 means the key leaves no bias; a workload beyond
0.90-1.10 cannot be predicted within 10% by any service that prices a work by
its shape and that key, and one that moves by more than 0.2 from one bench run
to another cannot be predicted within 10% in both by any such service.

The keys:
- warmth, tau T: an exponentially decaying busy state, which rises toward 1
  while a work or transfer runs and falls toward 0 while the engine idles,
  with time constant T, in 5 bins;
- same shape: whether the work before it had the same shape (so the same
  executable), and whether it followed that work within G microseconds;
- previous: what the serving thread ran just before it (prefill, decode or a
  transfer: the calibrated service's after_other_us) and whether the engine
  idled at least 1 ms since (its after_idle_us).

    .venv/bin/python bench/pacing_keys.py runs/fidelity [runs/fidelity-2 ...]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and `kvsim` would name bench/kvsim.py.
_HERE, _ROOT = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent
sys.path[:] = [str(_ROOT), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from bench.result import BenchRun, add_results_argument  # noqa: E402
from kvsim.measured_run import load_measured_run  # noqa: E402

CALIBRATION = "calibration"
TAUS_US = (2_000, 10_000, 50_000, 200_000, 1_000_000)
GAPS_US = (300, 1_000, 3_000)
BINS = 5

IDLE_US = 1_000
DRAWS = 100  # bootstrap draws of a ratio's band
Shape = tuple
Work = tuple[Shape, tuple, int]  # (shape, key, measured wall us)
Run = tuple[int, list[dict]]  # (the engine's slot capacity, its works in the serving thread's order)


def shape(work: dict, slots: int) -> Shape:
    positions = max(16, work["reused_positions"] + work["processed_positions"])
    return work["kind"], work["rows"], work["window"], 1 << (positions - 1).bit_length(), slots


def warmth_keys(run: Run, tau_us: int) -> list[Work]:
    slots, works = run
    out, warm, last = [], 0.0, None
    for work in works:
        start, end = work["start_us"], work["end_us"]
        if last is not None:
            warm *= math.exp(-max(0, start - last) / tau_us)
        if work["kind"] in ("prefill", "decode"):
            out.append((shape(work, slots), (min(int(warm * BINS), BINS - 1),), work["wall_us"]))
        busy = end - start if last is None else max(0, end - max(start, last))
        warm = 1 - (1 - warm) * math.exp(-busy / tau_us)
        last = end if last is None else max(last, end)
    return out


def same_shape_keys(run: Run, gap_us: int) -> list[Work]:
    slots, works = run
    out, previous, last = [], None, None
    for work in works:
        if work["kind"] in ("prefill", "decode"):
            near = last is not None and work["start_us"] - last < gap_us
            out.append((shape(work, slots), (shape(work, slots) == previous, near), work["wall_us"]))
            previous = shape(work, slots)
        last = work["end_us"] if last is None else max(last, work["end_us"])
    return out


def previous_keys(run: Run) -> list[Work]:
    slots, works = run
    out, previous, last = [], None, None
    for work in works:
        kind = work["kind"] if work["kind"] in ("prefill", "decode") else "transfer"
        if kind != "transfer":
            idle = last is not None and work["start_us"] - last >= IDLE_US
            out.append((shape(work, slots), (previous, idle), work["wall_us"]))
        previous = kind
        last = work["end_us"] if last is None else max(last, work["end_us"])
    return out


def biases(keyed: dict[str, list[list[Work]]]) -> dict[str, tuple]:
    """Per predicted workload: measured over reference compute time, by shape and by shape and key."""
    works = {name: [w for run in group for w in run] for name, group in keyed.items()}
    by_shape, by_key = defaultdict(list), defaultdict(list)
    for name, group in works.items():
        if name.startswith(CALIBRATION):
            for s, k, t in group:
                by_shape[s].append(t)
                by_key[s, k].append(t)
    shape_ref = {s: statistics.median(v) for s, v in by_shape.items()}
    key_ref = {sk: statistics.median(v) for sk, v in by_key.items() if len(v) >= 5}
    result = {}
    for name, group in sorted(works.items()):
        if name.startswith(CALIBRATION):
            continue
        known = [(s, k, t) for s, k, t in group if s in shape_ref]
        measured = sum(t for _, _, t in known)
        result[name] = (
            measured / sum(shape_ref[s] for s, _, _ in known),
            measured / sum(key_ref.get((s, k), shape_ref[s]) for s, k, _ in known),
        )
    return result


def band(keyed: dict[str, list[list[Work]]], draws: int = DRAWS) -> dict[str, tuple[float, float]]:
    """Per predicted workload: the 5th and 95th percentiles of its by-key ratio over bench runs made of as many
    repeats, drawn with replacement from each workload's repeats (a bootstrap): how far the ratio moves by
    the repeats' own noise."""
    rng = random.Random(0)
    ratios = defaultdict(list)
    for _ in range(draws):
        drawn = {name: [rng.choice(group) for _ in group] for name, group in keyed.items()}
        for name, (_, with_key) in biases(drawn).items():
            ratios[name].append(with_key)
    return {name: (percentile(values, 0.05), percentile(values, 0.95)) for name, values in ratios.items()}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def read_runs(directory: Path) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = defaultdict(list)
    for path in sorted(directory.glob("*-[0-9]*.json")):
        run = load_measured_run(path, str(path))
        runs[path.stem.rsplit("-", 1)[0]].append((run.slot_capacity, sorted(run.works, key=lambda w: w["start_us"])))
    if not any(n.startswith(CALIBRATION) for n in runs) or all(n.startswith(CALIBRATION) for n in runs):
        raise SystemExit(f"{directory}: expected measured runs of the calibration and the predicted workloads")
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "directories", type=Path, nargs="+", help="measured runs of bench/fidelity.py (WORKLOAD-POLICY-N.json)"
    )
    add_results_argument(parser)
    args = parser.parse_args()
    run = BenchRun.start("pacing-keys", __doc__)
    benches = [read_runs(directory) for directory in args.directories]
    keys = [(f"warmth, tau {t / 1000:g} ms", lambda r, t=t: warmth_keys(r, t)) for t in TAUS_US]
    keys += [(f"same shape, within {g} us", lambda r, g=g: same_shape_keys(r, g)) for g in GAPS_US]
    keys += [(f"previous on the thread, idle {IDLE_US} us or more", previous_keys)]
    print("measured / reference compute time per predicted workload: by shape | by shape and key; per directory:")
    for index, directory in enumerate(args.directories):
        print(f"  {index + 1}: {directory}")
    figures: dict[str, dict] = {}
    columns = [f"directory_{index + 1}" for index in range(len(args.directories))]
    for label, key in keys:
        print(f"  {label}")
        results = [biases({name: [key(run) for run in group] for name, group in runs.items()}) for runs in benches]
        for name in results[0]:
            cells = "".join(f"   {r[name][0]:6.3f} | {r[name][1]:6.3f}" if name in r else "   -" for r in results)
            print(f"    {name:45s}{cells}")
            by_shape = figures.setdefault("measured over reference compute time, by shape alone", {})
            by_shape[name] = {f"{c}_x": r[name][0] for c, r in zip(columns, results, strict=True) if name in r}
            figures.setdefault(f"measured over reference, by shape and {label}", {})[name] = {
                f"{c}_x": r[name][1] for c, r in zip(columns, results, strict=True) if name in r
            }
    print(f"\n90% band of the ratio by shape and previous work ({DRAWS} bench runs of each directory's repeats, "
          "drawn with replacement):")  # fmt: skip
    bands = [band({name: [previous_keys(run) for run in group] for name, group in runs.items()}) for runs in benches]
    for name in bands[0]:
        print(f"    {name:45s}" + "".join(f"   {b[name][0]:6.3f}-{b[name][1]:6.3f}" for b in bands if name in b))
        figures.setdefault("90% band of the ratio by shape and previous work", {})[name] = {
            f"{c}_{end}_x": b[name][i]
            for c, b in zip(columns, bands, strict=True)
            if name in b
            for i, end in enumerate(("low", "high"))
        }
    note = "Directories: " + "; ".join(f"{index + 1}: {d}" for index, d in enumerate(args.directories))
    run.write(figures, args.results, note=note)


if __name__ == "__main__":
    main()
