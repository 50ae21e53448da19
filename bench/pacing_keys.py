"""Would a history term let a calibrated service price the engine's works? (kvsim fidelity, issue 12)

Reads the measured runs an earlier `bench/fidelity.py` left in DIR and serves
nothing. Every prefill and decode work gets a shape (kind, rows, window and the
power-of-two capacity its positions fill) and a key that says what the engine
did just before it. The reference time of a (shape, key) is the median over the
calibration workloads' works only. Then, per predicted workload, it prints
the total measured compute time over the total reference time: by shape alone,
and by shape and key. 1.00 means the key leaves no bias; a workload beyond
0.90-1.10 cannot be predicted within 10% by any service that prices a work by
its shape and that key.

The keys:
- warmth, tau T: an exponentially decaying busy state, which rises toward 1
  while a work or transfer runs and falls toward 0 while the engine idles,
  with time constant T, in 5 bins;
- same shape: whether the work before it had the same shape (so the same
  executable), and whether it followed that work within G microseconds.

    .venv/bin/python bench/pacing_keys.py runs/fidelity
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and `kvsim` would name bench/kvsim.py.
_HERE, _ROOT = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent
sys.path[:] = [str(_ROOT), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from kvsim.calibration import load_measured_run  # noqa: E402

CALIBRATION = "calibration"
TAUS_US = (2_000, 10_000, 50_000, 200_000, 1_000_000)
GAPS_US = (300, 1_000, 3_000)
BINS = 5

Shape = tuple
Work = tuple[Shape, tuple, int]  # (shape, key, measured wall us)


def shape(work: dict) -> Shape:
    positions = max(16, work["reused_positions"] + work["processed_positions"])
    return work["kind"], work["rows"], work["window"], 1 << (positions - 1).bit_length()


def warmth_keys(works: Sequence[dict], tau_us: int) -> list[Work]:
    out, warm, last = [], 0.0, None
    for work in works:
        start, end = work["start_us"], work["end_us"]
        if last is not None:
            warm *= math.exp(-max(0, start - last) / tau_us)
        if work["kind"] in ("prefill", "decode"):
            out.append((shape(work), (min(int(warm * BINS), BINS - 1),), work["wall_us"]))
        busy = end - start if last is None else max(0, end - max(start, last))
        warm = 1 - (1 - warm) * math.exp(-busy / tau_us)
        last = end if last is None else max(last, end)
    return out


def same_shape_keys(works: Sequence[dict], gap_us: int) -> list[Work]:
    out, previous, last = [], None, None
    for work in works:
        if work["kind"] in ("prefill", "decode"):
            near = last is not None and work["start_us"] - last < gap_us
            out.append((shape(work), (shape(work) == previous, near), work["wall_us"]))
            previous = shape(work)
        last = work["end_us"] if last is None else max(last, work["end_us"])
    return out


def biases(runs: dict[str, list[list[dict]]], keyed: Callable[[Sequence[dict]], list[Work]]) -> dict[str, tuple]:
    """Per predicted workload: measured over reference compute time, by shape and by shape and key."""
    works = {name: [w for run in group for w in keyed(run)] for name, group in runs.items()}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="measured runs of bench/fidelity.py (WORKLOAD-POLICY-N.json)")
    args = parser.parse_args()
    runs: dict[str, list[list[dict]]] = defaultdict(list)
    for path in sorted(args.directory.glob("*-[0-9]*.json")):
        run = load_measured_run(path, str(path))
        runs[path.stem.rsplit("-", 1)[0]].append(sorted(run.works, key=lambda w: w["start_us"]))
    if not any(n.startswith(CALIBRATION) for n in runs) or all(n.startswith(CALIBRATION) for n in runs):
        raise SystemExit(f"{args.directory}: expected measured runs of the calibration and the predicted workloads")
    keys = [(f"warmth, tau {t / 1000:g} ms", lambda r, t=t: warmth_keys(r, t)) for t in TAUS_US]
    keys += [(f"same shape, within {g} us", lambda r, g=g: same_shape_keys(r, g)) for g in GAPS_US]
    print("measured / reference compute time per predicted workload: by shape | by shape and key")
    for label, keyed in keys:
        print(f"  {label}")
        for name, (alone, with_key) in biases(runs, keyed).items():
            print(f"    {name:45s} {alone:6.3f} | {with_key:6.3f}")


if __name__ == "__main__":
    main()
