"""How steady is this machine's speed from one second to the next? (kvsim fidelity)

The InferenceEngine's serialized decode step (the shipped chat model, one row,
`SlotExecution.decode_row`) runs on K slot states allocated afresh, the steps
interleaved over the K states (state 1, 2, ..., K, 1, 2, ...), about 2,000 steps
in a trial; trials follow one another a second or so apart. Within a trial
every state meets the same moments, so a spread between the states' medians is
the buffers' own (where they lie in memory); a spread between the trials'
medians is the machine's speed moving with time, which no model of the engine's
works can know of: a workload served in a slow second is slower than the
calibration served in a fast one, however exactly the model prices each work.

    .venv/bin/python bench/speed_drift.py [--trials 6] [--states 6]

About 20 s on a quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

# Run as a script, this file's folder comes first on sys.path and `kvsim` would name bench/kvsim.py.
_HERE, _ROOT = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent
sys.path[:] = [str(_ROOT), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from bench.result import BenchRun, add_results_argument  # noqa: E402
from inference.execution import ModelExecution  # noqa: E402
from inference.slot_execution import EnginePlan, SlotExecution  # noqa: E402
from jgpt.artifacts.catalog import load_model  # noqa: E402

PROMPT = list(range(10, 40))  # 30 ids: prefilled into row 0, then decoded until the row would reach 64 slots
SHAPES = ((8, 64), (4, 128))  # (slot rows, slot capacity) of the fidelity bench's burst and chats


def trial(programs: SlotExecution, states: int, rounds: int) -> np.ndarray:
    """Microseconds of each decode step [states, steps], the states' steps interleaved."""
    window = np.asarray([PROMPT + [0, 0]], np.int32)
    slots, tokens = [], []
    for _ in range(states):
        first, state = programs.prefill_into(programs.empty_slots(), programs.empty_start(), window, len(PROMPT), 0)
        slots.append(state)
        tokens.append(int(first[0]))
    times: list[list[float]] = [[] for _ in range(states)]
    for step in range(rounds * 29):
        restart = (step + 1) % 29 == 0  # the row holds 30 + 28 positions: start it again within 64 slots
        for k in range(states):
            if restart:
                first, slots[k] = programs.prefill_into(slots[k], programs.empty_start(), window, len(PROMPT), 0)
                tokens[k] = int(first[0])
                continue
            started = time.perf_counter()
            ids, slots[k] = programs.decode_row(slots[k], 0, tokens[k])
            tokens[k] = int(np.asarray(ids)[0])
            times[k].append(time.perf_counter() - started)
    return np.asarray(times)[:, 10:] * 1e6  # the first steps after allocation left out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="trials per shape, one after another")
    parser.add_argument("--states", type=int, default=6, help="slot states interleaved within a trial")
    add_results_argument(parser)
    args = parser.parse_args()
    run = BenchRun.start("speed-drift", __doc__)
    artifact = load_model("chat")
    execution = ModelExecution.from_artifact(artifact, artifact.tokenizer())
    print("one-row decode step, dispatch to ready, median us: per slot state within a trial | the trial's")
    figures = {}
    for rows, capacity in SHAPES:
        programs = SlotExecution(execution, EnginePlan(rows, capacity, (16, 32, 64), (1,), False))
        trial(programs, 1, 1)  # compile and warm up
        medians, spreads = [], []
        for index in range(args.trials):
            times = trial(programs, args.states, 12)
            per_state = np.median(times, axis=1)
            medians.append(float(np.median(times)))
            spreads.append(float(per_state.max() / per_state.min()))
            print(f"  {rows} rows x {capacity} slots, trial {index + 1}: "
                  + " ".join(f"{m:4.0f}" for m in per_state)
                  + f"  (states max/min {per_state.max() / per_state.min():.3f}) | {medians[-1]:4.0f}", flush=True)  # fmt: skip
        print(f"  {rows} rows x {capacity} slots: trials' medians {min(medians):.0f}-{max(medians):.0f} us, "
              f"max/min {max(medians) / min(medians):.3f}\n", flush=True)  # fmt: skip
        figures[f"{rows} rows x {capacity} slots"] = {
            "fastest_trial_us": min(medians), "slowest_trial_us": max(medians),
            "trials_slowest_over_fastest_x": max(medians) / min(medians),
            "states_in_a_trial_widest_x": max(spreads),
        } | {f"trial_{index + 1}_us": median for index, median in enumerate(medians)}  # fmt: skip
    run.write({"one-row decode step, median per trial": figures}, args.results)


if __name__ == "__main__":
    main()
