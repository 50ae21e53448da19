"""How much slower is an engine work after the engine sat idle? (kvsim fidelity)

The shipped chat model's one-row decode and a 32-id prefill, run through
`ModelExecution.advance` (the jitted work the InferenceEngine dispatches) and
timed from dispatch to ready: back to back, then each after an idle gap of 1, 5
and 20 ms. The peer of every figure is the same work back to back in the same
process, so the ratio is what an idle gap costs on this machine.

A calibrated ComputeService prices a work by its shape alone; if the ratio is far
from 1, a work's time depends on what the engine did just before, and that is
a term the calibration cannot see.

    .venv/bin/python bench/idle_gap.py [--spin]

--spin waits by spinning on the calling thread instead of sleeping. To separate
XLA's intra-op threads from the rest, run it again under
`XLA_FLAGS=--xla_cpu_multi_thread_eigen=false` and under `taskset -c 0`.
About 30 s on a quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from result import BenchRun, add_results_argument

from inference.execution import ModelExecution
from jgpt.artifacts.catalog import load_model

GAPS_MS = (0, 1, 5, 20)
PROMPT = list(range(10, 42))


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def timed(work, gap_s: float, wait, repeats: int) -> np.ndarray:
    times = []
    for _ in range(repeats):
        if gap_s:
            wait(gap_s)
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return np.array(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spin", action="store_true", help="wait by spinning, not sleeping")
    add_results_argument(parser)
    args = parser.parse_args()
    run = BenchRun.start("idle-gap", __doc__)
    wait = spin if args.spin else time.sleep

    artifact = load_model("chat")
    execution = ModelExecution.from_artifact(artifact, artifact.tokenizer())
    _, state = execution.prefill([PROMPT], capacity=128)
    empty = execution.empty_state(1, 128)
    window = np.asarray([PROMPT], np.int32)

    def decode():
        execution.advance(state, np.array([[7]], np.int32), np.ones(1, np.int32))[0].block_until_ready()

    def prefill():
        execution.advance(empty, window, np.array([len(PROMPT)], np.int32))[0].block_until_ready()

    print(f"wait by {'spinning' if args.spin else 'sleeping'}; dispatch-to-ready microseconds, p50 / p90")
    figures = {}
    for name, work in (("one-row decode", decode), ("32-id prefill", prefill)):
        timed(work, 0, wait, 20)  # compile and warm up
        cells, back_to_back = [], 0.0
        for gap_ms in GAPS_MS:
            t = timed(work, gap_ms / 1000, wait, 150 if gap_ms < 20 else 60)
            p50 = float(np.median(t))
            back_to_back = back_to_back or p50
            cells.append(f"gap {gap_ms:2d} ms {p50:6.0f} / {np.percentile(t, 90):6.0f} ({p50 / back_to_back:4.2f}x)")
            figures.setdefault(name, {})[f"gap_{gap_ms}_ms_p50_us"] = p50
            figures[name][f"gap_{gap_ms}_ms_against_back_to_back_x"] = p50 / back_to_back
        print(f"  {name:15s} " + " | ".join(cells), flush=True)
    run.write({f"dispatch to ready, waiting by {'spinning' if args.spin else 'sleeping'}": figures}, args.results)


if __name__ == "__main__":
    main()
