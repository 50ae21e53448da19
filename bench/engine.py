"""InferenceEngine speed: steady-state decode through the engine against `generate`, and served workloads.

Decode (default): B requests with prompts the shipped chat model continues for
the whole budget (no TURN_END; picked with `generate`), all arriving at once,
served with continuous batching at max_active_requests B, for B = 1, 8, 32. The
engine's step is the interval between the ends of consecutive full-batch decode
works (its jitted call, the host read of the ids, scheduling and bookkeeping);
the bare step is the same jitted decode call on the same shapes in a tight loop,
with the same host read. Their difference is the engine's per-step overhead.
Engine and bare call alternate nine times (a fraction of a second each); the
overhead is the median of the paired relative differences, and every figure
the median over the repeats, since this machine's speed drifts over minutes.
`generate` runs the same B requests as one batch, both ways: its fused
`lax.while_loop` (loop time divided over the steps) and its step-timing mode
(one jitted call per step, median). Every figure is a median; the machine is
shared, so expect noise.

--workload: the 64-request multi-turn chat workload (bench/workloads.py, arrivals
over ~4 s) served with max_active_requests 1, 4, 8 x serialized / continuous
batching x retention lru / none, printing p50/p90 TTFT, TPOT, E2E and the hit
rate; then bursts of 32 requests, continuous batching vs serialized, in tokens/s:
the chat's first turns (short answers: mostly prefill) and prompts the model
continues for 64 tokens (mostly decode).

    .venv/bin/python bench/engine.py [--workload] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

# Run as a script, this file's folder comes first on sys.path and `kvsim` would name bench/kvsim.py.
_HERE, _ROOT = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent
sys.path[:] = [str(_ROOT), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from bench.result import BenchRun, add_results_argument  # noqa: E402
from bench.workloads import burst_workload, chat_workload, system  # noqa: E402
from inference.engine import InferenceEngine, read_served_workload  # noqa: E402
from inference.execution import ModelExecution  # noqa: E402
from inference.generation import generate, generate_stepwise  # noqa: E402
from inference.measured_run import measured_run  # noqa: E402
from inference.policy import GenerationPolicy, InferenceRequest  # noqa: E402
from inference.slot_execution import SlotExecution  # noqa: E402
from jgpt.artifacts.catalog import load_model, read_catalog  # noqa: E402
from kvsim.system import parse_system  # noqa: E402

BUDGET = 64
PROMPT = 16
REPEATS = 9
GIB = 1 << 30


def babbling(execution, count: int) -> list[InferenceRequest]:
    """`count` requests whose greedy continuation fills the budget (random printable prompts that do)."""
    rng, found = random.Random(0), []
    while len(found) < count:
        drawn = [InferenceRequest("draw", [rng.randrange(32, 127) for _ in range(PROMPT)], GenerationPolicy(BUDGET))
                 for _ in range(32)]  # fmt: skip
        found += [q for q, r in zip(drawn, generate(execution, drawn).responses) if len(r.output_ids) == BUDGET]
    return [InferenceRequest(f"r{i}", r.prompt_ids, r.generation) for i, r in enumerate(found[:count])]


def engine_step_us(execution, requests) -> tuple[float, float, object]:
    """Medians over consecutive full-batch decode works of the interval between their ends and of the part
    of it outside the work's own wall (dispatch of the jitted call to the ids on the host): the run's
    bookkeeping between works. And the run."""
    B = len(requests)
    served = InferenceEngine(execution, parse_system(system("continuous_batching", B, GIB, GIB))).serve(
        requests, as_fast_as_possible=True
    )
    works = [w for w in served.works if w["kind"] == "decode" and w["rows"] == B]
    intervals = [
        (b["end_us"] - a["end_us"], b["end_us"] - a["end_us"] - b["wall_us"]) for a, b in zip(works, works[1:])
    ]
    return statistics.median(i for i, _ in intervals), statistics.median(between for _, between in intervals), served


def bare_step_us(execution, plan, steps: int = 60) -> float:
    """The jitted batched decode call alone on the engine's shapes, with one host read of the ids per step."""
    programs = SlotExecution(execution, plan)
    slots = programs.empty_slots()
    ids, counts = np.zeros(plan.slot_rows, np.int32), np.ones(plan.slot_rows, np.int32)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        chosen, slots = programs.decode_rows(slots, ids, counts)
        ids = np.asarray(chosen)
        times.append(time.perf_counter() - started)  # every step attends over all C slots, whatever the lengths
    return statistics.median(times[5:]) * 1e6


def generate_step_us(run, execution, requests) -> float:
    run(execution, requests)  # warm
    (response, *_) = run(execution, requests).responses
    return statistics.median(c.wall_time_us for c in response.computations[1:])


def decode_bench(execution, batches) -> dict:
    """Steady-state decode at each batch size: the engine's step against the bare call and `generate`."""
    print(f"steady-state decode, prompts of {PROMPT}, {BUDGET} new tokens each (tokens/s; per-step wall in ms)")
    print(
        f"{'batch':>5}  {'engine':>16}  {'bare call':>16}  {'generate loop':>16}  {'generate step':>16}  overhead   between"
    )
    requests, rows = babbling(execution, max(batches)), {}
    for B in batches:
        chosen = requests[:B]
        alone = generate(execution, chosen).responses
        # Engine and bare call alternate, a fraction of a second each: this machine's speed drifts by 10-25%
        # over minutes, so the overhead is the median of the paired differences, not a difference of two runs.
        pairs = []
        for _ in range(REPEATS):
            engine_us, between_us, served = engine_step_us(execution, chosen)
            assert all(s.output_ids == r.output_ids for s, r in zip(served.requests, alone)), "ids differ from generate"
            pairs.append((engine_us, between_us, bare_step_us(execution, served.plan)))
        engine_us, between_us, bare_us = (statistics.median(p[i] for p in pairs) for i in range(3))
        overhead = statistics.median((e - b) / e for e, _, b in pairs)
        loop_us = generate_step_us(generate, execution, chosen)
        step_us = generate_step_us(generate_stepwise, execution, chosen)
        cell = lambda us: f"{B / us * 1e6:8.0f} ({us / 1000:5.2f})"  # noqa: E731, B023 (used in this iteration)
        between = between_us / engine_us
        print(
            f"{B:>5}  {cell(engine_us)}  {cell(bare_us)}  {cell(loop_us)}  {cell(step_us)}  {overhead:8.1%}  {between:8.1%}"
        )
        rows[f"batch {B}"] = {
            "engine_step_ms": engine_us / 1000, "bare_call_ms": bare_us / 1000, "generate_loop_step_ms": loop_us / 1000,
            "generate_step_ms": step_us / 1000, "engine_tok_per_s": B / engine_us * 1e6,
            "overhead_fraction": overhead, "between_fraction": between,
        }  # fmt: skip
    print("overhead = median over adjacent engine/bare-call pairs of (engine step - bare call) / engine step;")
    print("between = the engine's time outside its jitted call and host read, within one run;")
    print("the goal: overhead <= 10% at batch 8")
    return {f"steady-state decode, prompts of {PROMPT}, {BUDGET} new tokens each": rows}


def serve_document(execution, tokenizer, workload: dict, config: dict, as_fast_as_possible: bool = False) -> dict:
    requests, interaction = read_served_workload(workload, tokenizer, execution)
    parsed = parse_system(config)
    served = InferenceEngine(execution, parsed).serve(requests, interaction, as_fast_as_possible=as_fast_as_possible)
    return measured_run(execution, parsed, served, kind=workload["kind"], interaction=interaction)


def workload_bench(execution, tokenizer, quick: bool) -> dict:
    """The chat workload under every engine setting, then the bursts: the figures."""
    workload = chat_workload(conversations=8 if quick else 16)
    arrivals = [r["arrival_us"] for r in workload["requests"]]
    print(f"multi-turn chat: {len(arrivals)} requests over {max(arrivals) / 1e6:.1f} s "
          "(device 4 MiB, host 16 MiB of KV; ms)")  # fmt: skip
    print(f"{'active':>6} {'policy':<20} {'reuse':<5} {'TTFT p50':>9} {'p90':>7} {'TPOT p50':>9} {'p90':>7} "
          f"{'E2E p50':>8} {'p90':>7} {'hit rate':>8} {'offloads':>8}")  # fmt: skip
    ms = lambda v: "-" if v is None else f"{v / 1000:.2f}"  # noqa: E731
    chat, bursts = {}, {}
    for active in (1, 4, 8):
        for policy in ("serialized", "continuous_batching"):
            for retention in ("lru", "none"):
                config = system(policy, active, 4 << 20, 16 << 20, retention)
                document = serve_document(execution, tokenizer, workload, config)
                assert document["engine"]["compiles_during_run"] == 0, "a compile during the run"
                totals = document["totals"]
                lat = totals["latency_us"]
                hits = (totals["hits_device"] + totals["hits_host"]) / max(1, totals["lookups"])
                print(f"{active:>6} {policy:<20} {retention:<5} {ms(lat['ttft']['p50']):>9} {ms(lat['ttft']['p90']):>7} "
                      f"{ms(lat['tpot']['p50']):>9} {ms(lat['tpot']['p90']):>7} {ms(lat['e2e']['p50']):>8} "
                      f"{ms(lat['e2e']['p90']):>7} {hits:>8.2f} {totals['offloads']:>8}")  # fmt: skip
                chat[f"{active} active, {policy}, reuse {retention}"] = {
                    f"{name}_{p}_ms": None if lat[name][p] is None else lat[name][p] / 1000
                    for name in ("ttft", "tpot", "e2e") for p in ("p50", "p90")
                } | {"hit_rate_fraction": hits, "offloads_count": totals["offloads"]}  # fmt: skip
    burst = burst_workload(16 if quick else 32)
    n = len(burst["requests"])
    long = babbling(execution, n)
    print(f"bursts of {n} requests at once, max_active_requests {n}, retention none (tokens/s over the run):")
    for policy in ("serialized", "continuous_batching"):
        document = serve_document(
            execution, tokenizer, burst, system(policy, n, GIB, GIB, "none"), as_fast_as_possible=True
        )
        config = parse_system(system(policy, n, GIB, GIB, "none"))
        served = InferenceEngine(execution, config).serve(long, as_fast_as_possible=True)
        figures, rates = [], []
        for outcomes, end_us in ((document["requests"].values(), document["totals"]["end_us"]),
                                 ([s.outcome for s in served.requests], served.end_us)):  # fmt: skip
            tokens = sum(o["selected_tokens"] for o in outcomes)
            figures.append(f"{tokens} tokens in {end_us / 1e6:.3f} s: {tokens / end_us * 1e6:7.1f}")
            rates.append(tokens / end_us * 1e6)
        print(f"  {policy:<20} chat first turns {figures[0]};  {BUDGET}-token continuations {figures[1]}")
        bursts[policy] = {"chat_first_turns_tok_per_s": rates[0], f"continuations_of_{BUDGET}_tok_per_s": rates[1]}
    return {
        f"multi-turn chat, {len(arrivals)} requests over {max(arrivals) / 1e6:.1f} s (device 4 MiB, host 16 MiB)": chat,
        f"bursts of {n} requests at once, max_active_requests {n}, retention none": bursts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", action="store_true", help="serve the chat workload and the burst instead")
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    add_results_argument(parser)
    args = parser.parse_args()
    run = BenchRun.start("engine-workload" if args.workload else "engine", __doc__)
    artifact = load_model(read_catalog().default_id())
    tokenizer = artifact.tokenizer()
    execution = ModelExecution.from_artifact(artifact, tokenizer)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; the shipped chat model")
    if args.workload:
        figures = workload_bench(execution, tokenizer, args.quick)
    else:
        figures = decode_bench(execution, (1, 8) if args.quick else (1, 8, 32))
    run.write(figures, args.results)


if __name__ == "__main__":
    main()
