"""Decode speed: jgpt's jitted loop against Hugging Face transformers `generate`, same weights, same work.

First the machine's bounds: memory read bandwidth with 1 and 2 threads (a large
sum in numpy, torch and a jitted sum, a jitted matrix-vector product) and the
f32 dense-product speed of XLA (stored and output-major weights) and torch on
the shapes of a batch-1 and a batch-16 decode step and of a prefill.

Then, for a GPT-2-sized model (layers 12, width 768, vocabulary 50257; with
--tiny also a tiny GPT, layers 4, width 128), built as a random GPT2LMHeadModel
and imported into jgpt: batch 1 greedy decode of HF and of jgpt (the backend's
default strategy; with --strategies also the stored layout and the scan); and at
batch 16, with equal-length prompts and with ragged ones, the prefill, the
decode step and the whole generation (prefill plus every decode step) of both
sides and their ratios. For the GPT-2-sized model, the floor of a step (the
bytes it must read over the measured bandwidth, and its arithmetic over the best
measured product speed) and each side's fraction of it, twice: at the best
bandwidth any probe read once, and at the sustained one (the best of the probes'
medians: single fast probes of a shared memory system make the first swing
between quiet runs; --kernel pairs each run with its own probe).

jgpt's times are its own works' wall times (dispatch to ready, compiled
beforehand): the prefill and the loop's time per decode step. HF's prefill is
generate(1), its decode step (generate(N) - generate(1)) / (N - 1), its whole
generation generate(N), at its better torch thread count (1 or all cores),
prompts left-padded. The two sides alternate in every repeat and each figure is
the best of its repeats: on a shared machine that is what each side can do, and
the ratios compare runs made minutes apart at most; batch 1 prints each side's
median too.

--kernel adds jgpt under the xla kernel plan (`--kernels xla`, the pure-JAX reference)
beside the default auto plan, which runs a batch-1 step's blocks by
`jgpt.kernels.fused_decode` and its output projection by `jgpt.kernels.blas_matvec` on
a CPU with AVX-512F (each side's label names the plan it ran): the kernels' before/after, alternating in every repeat, and at batch 1 a run
of jgpt alone (no HF between), the two alternating for 5x the repeats, with medians,
each repeat right after a read probe (the best of XLA's jitted sum and the one-row
kernel over 1 GiB): the median of each run's fraction of its own repeat's floor is
the figure the batch-1 goal (85% of the floor) is judged on, because a shared
machine's read bandwidth moves from minute to minute, by up to a factor of two.
--repeats sets the batch-1 repeats (default 3).

    .venv/bin/python bench/decode.py [--quick] [--tiny] [--strategies] [--kernel] [--repeats N]

The default run takes about 3 minutes on a quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from result import BenchRun, add_results_argument
from transformers import GPT2Config, GPT2LMHeadModel

from inference.execution import ModelExecution, window_bucket
from inference.generation import generate
from inference.policy import GenerationPolicy, InferenceRequest
from jgpt.artifacts.hf_import import convert
from jgpt.kernels import blas_matvec
from jgpt.kernels.plan import Kernels
from jgpt.model.kv_state import StateIdentity
from jgpt.model.layer_strategy import LayerStrategy
from jgpt.model.output_major import OutputMajor

SIZES = {
    "tiny (L4 C128 V512)": dict(n_layer=4, n_embd=128, n_head=4, vocab_size=512, n_positions=256),
    "GPT-2-small size (L12 C768 V50257)": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
}
NO_END = -1  # no id ends a bench run early: both sides decode exactly N tokens
BATCH = 16
EQUAL_PROMPT = 32
# (layer strategy, kernel plan name): the default first, then the xla plan in its place (--kernel), then the stored
# layout and the scan (--strategies).
STRATEGIES = (
    (LayerStrategy.for_backend(), "auto"),
    (LayerStrategy.for_backend(), "xla"),
    (LayerStrategy.unrolled_layers(), "auto"),
    (LayerStrategy.scan(), "auto"),
)
# Dense products of GPT-2 small: (inputs, outputs) of a query/key/value, feed-forward and output projection.
PRODUCT_SHAPES = ((768, 768), (768, 3072), (3072, 768), (768, 50257))


def hf_model(config: dict, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(
        GPT2Config(**config, activation_function="gelu_new", attn_pdrop=0, resid_pdrop=0, embd_pdrop=0)
    )
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def jgpt_execution(model: GPT2LMHeadModel, strategy: LayerStrategy, kernels: str = "auto") -> ModelExecution:
    """The same weights in jgpt, through its own Hugging Face import, under the kernel plan `kernels` names."""
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        architecture, weights, _ = convert(directory)
    weights = jax.tree.map(jnp.asarray, weights)
    identity = StateIdentity("bench", "bench", "float32")
    return ModelExecution(weights, architecture, identity, NO_END, strategy, Kernels.named(kernels))


def prompts(batch: int, vocabulary: int, equal: bool = False) -> list[list[int]]:
    """`batch` random prompts: EQUAL_PROMPT ids each, or ragged (8, 11, ... ids)."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocabulary, size=EQUAL_PROMPT if equal else 8 + 3 * b).tolist() for b in range(batch)]


def jgpt_run(execution: ModelExecution, batch_prompts, new_tokens: int) -> tuple[float, float, tuple]:
    """One greedy generation: (prefill seconds, seconds per decode step, the first row's ids)."""
    requests = [InferenceRequest(f"r{b}", p, GenerationPolicy(new_tokens)) for b, p in enumerate(batch_prompts)]
    (first, *_) = responses = generate(execution, requests).responses
    assert all(r.outcome.selected_tokens == new_tokens for r in responses)
    return first.computations[0].wall_time_us * 1e-6, first.computations[1].wall_time_us * 1e-6, first.output_ids


class HF:
    """HF `generate` on left-padded prompts; each run at 1 and at all torch threads, the better one kept."""

    def __init__(self, model, batch_prompts):
        width = max(map(len, batch_prompts))
        self.model, self.width = model, width
        self.ids = torch.zeros((len(batch_prompts), width), dtype=torch.long)
        self.mask = torch.zeros_like(self.ids)
        for b, p in enumerate(batch_prompts):
            self.ids[b, width - len(p) :], self.mask[b, width - len(p) :] = torch.tensor(p), 1
        self._generate(2)  # warm-up

    def _generate(self, n: int) -> tuple[float, torch.Tensor]:
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                self.ids, attention_mask=self.mask, max_new_tokens=n, do_sample=False, use_cache=True
            )
        return time.perf_counter() - started, out

    def run(self, new_tokens: int) -> tuple[float, float, tuple]:
        """(prefill seconds, seconds per decode step, the first row's ids) at the better thread count."""
        results = []
        for threads in sorted({1, os.cpu_count() or 1}):
            torch.set_num_threads(threads)
            full, out = self._generate(new_tokens)
            prefill, _ = self._generate(1)
            results.append((prefill, (full - prefill) / (new_tokens - 1), tuple(out[0, self.width :].tolist())))
        return min(results, key=lambda r: r[0] + r[1] * (new_tokens - 1))


def best_of(runs: list[tuple[float, float, tuple]]) -> tuple[float, float, tuple]:
    return min(r[0] for r in runs), min(r[1] for r in runs), runs[0][2]


def median_step(runs: list[tuple[float, float, tuple]]) -> float:
    return float(np.median([r[1] for r in runs]))


def _timed(fn, *args) -> float:
    started = time.perf_counter()
    result = fn(*args)
    if isinstance(result, jax.Array):
        result.block_until_ready()
    return time.perf_counter() - started


def _seconds(repeats: int, fn, *args) -> list[float]:
    """The times of `repeats` calls fn(*args), after one untimed call (compilation, first touch)."""
    _timed(fn, *args)
    return [_timed(fn, *args) for _ in range(repeats)]


def _best_seconds(repeats: int, fn, *args) -> float:
    return min(_seconds(repeats, fn, *args))


def bandwidths(repeats: int) -> dict[str, tuple[float, float]]:
    """Bytes/s of large reads, (best, median) of `repeats` probes: sums over 1 GiB (numpy: 1 thread; torch at 1
    and 2 threads; XLA's own pool) and a jitted matrix-vector product over a 256 MiB matrix (what a batch-1
    decode step does)."""
    a = np.ones(1 << 28, np.float32)
    t = torch.from_numpy(a)
    rate = lambda nbytes, seconds: (nbytes / min(seconds), nbytes / float(np.median(seconds)))
    found = {"numpy sum, 1 thread": rate(a.nbytes, _seconds(repeats, a.sum))}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        found[f"torch sum, {threads} threads"] = rate(a.nbytes, _seconds(repeats, t.sum))
    found["jitted sum (XLA threads)"] = rate(a.nbytes, _seconds(repeats, jax.jit(jnp.sum), jnp.asarray(a)))
    w, x = jnp.ones((8192, 8192), jnp.float32), jnp.ones((8192,), jnp.float32)
    found["jitted matrix-vector"] = rate(w.nbytes, _seconds(repeats, jax.jit(jnp.matmul), w, x))
    return found


def product_speeds(rows: int, repeats: int) -> list[tuple[tuple[int, int], float, float, float]]:
    """FLOP/s of [rows, I] @ [I, O] for each PRODUCT_SHAPES: XLA stored [I, O], XLA OutputMajor, torch linear."""
    highest = jax.lax.Precision.HIGHEST
    stored = jax.jit(lambda x, w: jnp.dot(x, w, precision=highest))
    transposed = jax.jit(lambda x, w: w.product(x, highest))
    torch.set_num_threads(os.cpu_count() or 1)
    speeds = []
    for inputs, outputs in PRODUCT_SHAPES:
        x, w = jnp.ones((rows, inputs), jnp.float32), jnp.ones((inputs, outputs), jnp.float32)
        flops = 2 * rows * inputs * outputs
        seconds = (
            _best_seconds(repeats, stored, x, w),
            _best_seconds(repeats, transposed, x, OutputMajor.of(w)),
            _best_seconds(repeats, torch.nn.functional.linear, torch.ones(rows, inputs), torch.ones(outputs, inputs)),
        )
        speeds.append(((inputs, outputs), *(flops / s for s in seconds)))
    return speeds


def print_bounds(repeats: int) -> tuple[tuple[float, float, float], dict]:
    """Print the machine's measured bounds; return (best read bandwidth B/s, sustained read bandwidth B/s: the
    best probe's median, best product FLOP/s) and the figures."""
    found = bandwidths(repeats)
    print(f"\nmemory read bandwidth, best and median of {repeats} runs:")
    for name, (best, median) in found.items():
        print(f"  {name:<26} {best / 1e9:6.1f} GB/s {median / 1e9:6.1f} GB/s")
    figures = {f"memory read bandwidth, best and median of {repeats} probes": {
        name: {"best_gb_per_s": best / 1e9, "median_gb_per_s": median / 1e9} for name, (best, median) in found.items()
    }}  # fmt: skip
    peak = 0.0
    for rows in (1, BATCH, BATCH * EQUAL_PROMPT):
        print(f"\nf32 dense products, {rows} rows, GFLOP/s:  XLA x@W  XLA output-major  torch linear")
        table = figures.setdefault(f"f32 dense products, {rows} rows", {})
        for (inputs, outputs), *speeds in product_speeds(rows, repeats):
            peak = max(peak, *speeds)
            print(
                f"  [{rows}, {inputs}] @ [{inputs}, {outputs}]".ljust(34) + "".join(f"{s / 1e9:14.1f}" for s in speeds)
            )
            table[f"[{rows}, {inputs}] @ [{inputs}, {outputs}]"] = dict(
                zip(("xla_stored_gflop_per_s", "xla_output_major_gflop_per_s", "torch_linear_gflop_per_s"),
                    (s / 1e9 for s in speeds), strict=True))  # fmt: skip
    return (max(best for best, _ in found.values()), max(median for _, median in found.values()), peak), figures


def compare(model, executions: list[tuple[ModelExecution, str]], batch_prompts, new_tokens: int, repeats: int):
    """Every run's (prefill s, step s, ids) of HF ("hf") and of each labelled execution on one batch, alternating."""
    hf = HF(model, batch_prompts)
    for execution, _ in executions:
        jgpt_run(execution, batch_prompts, new_tokens)  # compile
    runs: dict[str, list] = {"hf": [], **{label: [] for _, label in executions}}
    for repeat in range(repeats):
        runs["hf"].append(hf.run(new_tokens))
        # jgpt's executions in turn, in the reverse order every other repeat: the one right after HF shares the
        # cores with torch's threads still spinning down.
        for execution, label in executions[:: -1 if repeat % 2 else 1]:
            runs[label].append(jgpt_run(execution, batch_prompts, new_tokens))
    return runs


def read_probe(repeats: int):
    """A function that returns the best bytes/s of `repeats` reads each, of 1 GiB, by XLA's jitted sum and, where it
    runs, by the one-row kernel over a [349525, 768] matrix (the loop a batch-1 step's products run): the fastest
    this machine reads memory right then. The arrays are made once, here."""
    a = jnp.ones(1 << 28, jnp.float32)
    reads = [(a.nbytes, jax.jit(jnp.sum), (a,))]
    if blas_matvec.available():
        w, x = jnp.ones(((1 << 28) // 768, 768), jnp.float32), jnp.ones((1, 768), jnp.float32)
        reads.append((w.nbytes, jax.jit(blas_matvec.matvec), (x, w)))
    return lambda: max(nbytes / min(_seconds(repeats, fn, *args)) for nbytes, fn, args in reads)


def print_kernel_ab(executions, batch_prompts, new_tokens: int, repeats: int, data: float, floor_ms: float) -> dict:
    """jgpt alone, the kernel on (the default, first) and off, `repeats` runs each alternating, in turn reversed
    every other repeat, each repeat right after a read probe (`read_probe`): each side's median step, its fraction
    of `floor_ms`, and the median of its runs' fractions of their own repeat's floor (`data` bytes at the probe's
    bandwidth); returns the figures."""
    runs: dict[str, list] = {label: [] for _, label in executions}
    floors, probe = [], read_probe(3)
    for repeat in range(repeats):
        floors.append(data / probe())
        for execution, label in executions[:: -1 if repeat % 2 else 1]:
            runs[label].append(jgpt_run(execution, batch_prompts, new_tokens))
    print(f"  kernel on/off, jgpt alone, {repeats} alternating runs each, each repeat after a read probe (median "
          f"step, its share of the sustained floor; median of each run's share of its repeat's floor):")  # fmt: skip
    print("    repeats' floors (ms): " + " ".join(f"{f * 1e3:.2f}" for f in floors) +
          f"; read {data / np.median(floors) / 1e9:.1f} GB/s median, {data / min(floors) / 1e9:.1f} best")  # fmt: skip
    rows: dict[str, dict] = {"read probes": {"median_gb_per_s": data / np.median(floors) / 1e9,
                                             "best_gb_per_s": data / min(floors) / 1e9}}  # fmt: skip
    for label, r in runs.items():
        median = median_step(r) * 1e3
        paired = float(np.median([floor / run[1] for floor, run in zip(floors, r)]))
        each = " ".join(f"{run[1] * 1e3:.2f}" for run in r)
        same = "same ids" if r[0][2] == runs[executions[0][1]][0][2] else "ids DIFFER"
        print(f"    {label}: median {median:.2f} ms ({floor_ms / median:.0%}), best {best_of(r)[1] * 1e3:.2f}; "
              f"{paired:.0%} of its repeat's floor (median); each run {each}  [{same}]")  # fmt: skip
        rows[label] = {"median_step_ms": median, "best_step_ms": best_of(r)[1] * 1e3,
                       "of_sustained_floor_fraction": floor_ms / median, "of_own_repeat_floor_fraction": paired,
                       "same_ids": same == "same ids"}  # fmt: skip
    return rows


def print_batch_table(name: str, results: dict[str, tuple], new_tokens: int) -> dict:
    """HF against jgpt's default execution (the first after "hf"), then any other execution's prefill and step;
    returns the figures."""
    (_, (hp, hs, hids)), (default, (jp, js, jids)), *others = results.items()
    he, je = hp + hs * (new_tokens - 1), jp + js * (new_tokens - 1)
    print(f"  {name}\n    {'':<20} {'HF':>10} {'jgpt':>10} {'jgpt vs HF':>11}   (jgpt: {default})")
    rows = {}
    for label, h, j in (("prefill ms", hp, jp), ("decode step ms", hs, js), ("end to end ms", he, je)):
        print(f"    {label:<20} {h * 1e3:10.1f} {j * 1e3:10.1f} {h / j:10.2f}x")
        rows[label.removesuffix(" ms")] = {"hf_ms": h * 1e3, "jgpt_ms": j * 1e3, "jgpt_against_hf_x": h / j}
    print(f"    {'first row ids':<20} {'same' if hids == jids else 'DIFFER'}")
    rows["first row ids"] = {"same_as_hf": hids == jids}
    figures, other_rows = {f"{name} (jgpt: {default})": rows}, {}
    for label, (prefill, step, ids) in others:
        print(f"    jgpt, {label}: prefill {prefill * 1e3:.1f} ms ({hp / prefill:.2f}x HF), "
              f"decode step {step * 1e3:.1f} ms ({hs / step:.2f}x HF), ids {'same' if ids == hids else 'DIFFER'}")  # fmt: skip
        other_rows[f"jgpt, {label}"] = {"prefill_ms": prefill * 1e3, "prefill_against_hf_x": hp / prefill,
                                        "decode_step_ms": step * 1e3, "decode_step_against_hf_x": hs / step,
                                        "same_as_hf": ids == hids}  # fmt: skip
    return figures | ({f"{name}: the other jgpt executions": other_rows} if other_rows else {})


def step_work(execution: ModelExecution, rows: int, position: int) -> tuple[float, float]:
    """(bytes, FLOP) a decode step of `rows` rows at `position` must read and compute."""
    costs = execution.costs
    data = costs.fixed_memory_bytes + rows * costs.position_memory_bytes(position)
    return data, rows * costs.position_matmul_flops(position)


def print_floor(execution: ModelExecution, rows: int, position: int, step: dict[str, float], bounds) -> dict:
    """The step's floor from its bytes and its arithmetic, at the best and at the sustained bandwidth, and each
    side's fraction of it; returns the figures."""
    best, sustained, peak = bounds
    data, arithmetic = step_work(execution, rows, position)
    figures: dict[str, dict] = {}
    for name, bandwidth in (("best", best), ("sustained", sustained)):
        floor = max(data / bandwidth, arithmetic / peak)
        sides = ", ".join(f"{side} {floor / seconds:.0%} of it" for side, seconds in step.items())
        figures[f"the floor at the {name} bandwidth"] = {
            "read_mb": data / 1e6, "read_gb_per_s": bandwidth / 1e9, "arithmetic_gflop": arithmetic / 1e9,
            "step_ms": floor * 1e3,
        }  # fmt: skip
        for side, seconds in step.items():
            figures.setdefault(side, {})[f"of_{name}_floor_fraction"] = floor / seconds
        print(f"    floor at batch {rows}, {name} bandwidth: {data / 1e6:.0f} MB at {bandwidth / 1e9:.1f} GB/s = "
              f"{data / bandwidth * 1e3:.1f} ms, {arithmetic / 1e9:.2f} GFLOP at {peak / 1e9:.0f} GFLOP/s = "
              f"{arithmetic / peak * 1e3:.1f} ms; {sides}")  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats (a smoke run)")
    parser.add_argument("--tiny", action="store_true", help="also the tiny model")
    parser.add_argument(
        "--strategies", action="store_true", help="jgpt under every layer strategy, not the default only"
    )
    parser.add_argument("--kernel", action="store_true", help="also jgpt under the xla kernel plan (kernels off)")
    parser.add_argument("--repeats", type=int, help="batch-1 repeats (default 3, --quick 2)")
    add_results_argument(parser)
    args = parser.parse_args()
    run = BenchRun.start("decode", __doc__)
    repeats = args.repeats or (2 if args.quick else 3)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    bounds, figures = print_bounds(repeats + 2)
    for name, config in SIZES.items():
        small = config["n_layer"] == 4
        if small and not args.tiny:
            continue
        new_tokens = (32 if args.quick else 128) if small else (8 if args.quick else 32)
        model = hf_model(config)
        strategies = STRATEGIES if args.strategies else STRATEGIES[: 2 if args.kernel else 1]
        executions = [(jgpt_execution(model, strategy, kernels), f"{strategy}, --kernels {kernels}")
                      for strategy, kernels in strategies]  # fmt: skip
        default = executions[0][0]
        print(f"\n{name}: {new_tokens} new tokens, greedy, KV cache on")
        single = prompts(1, config["vocab_size"])
        runs = compare(model, executions, single, new_tokens, repeats)
        results = {side: best_of(r) for side, r in runs.items()}
        _, hf_step, hf_ids = results["hf"]
        print(f"  batch 1: HF generate {1 / hf_step:9.1f} tok/s ({hf_step * 1e3:.2f} ms/token); "
              f"median of {repeats} runs {median_step(runs['hf']) * 1e3:.2f} ms")  # fmt: skip
        single_rows = figures.setdefault(f"{name}, batch 1, {new_tokens} new tokens, best and median of {repeats}", {})
        single_rows["HF generate"] = {"best_step_ms": hf_step * 1e3, "median_step_ms": median_step(runs["hf"]) * 1e3,
                                      "tok_per_s": 1 / hf_step}  # fmt: skip
        for _, label in executions:
            _, step, ids = results[label]
            same = "same ids as HF" if ids == hf_ids else "ids differ from HF"
            each = " ".join(f"{r[1] * 1e3:.2f}" for r in runs[label])
            print(f"  jgpt, {label}: {1 / step:9.1f} tok/s ({step * 1e3:.2f} ms/token; median "
                  f"{median_step(runs[label]) * 1e3:.2f}; each run {each})  ratio {hf_step / step:5.2f}x  [{same}]")  # fmt: skip
            single_rows[f"jgpt, {label}"] = {
                "best_step_ms": step * 1e3, "median_step_ms": median_step(runs[label]) * 1e3, "tok_per_s": 1 / step,
                "against_hf_x": hf_step / step, "same_ids_as_hf": ids == hf_ids,
            }  # fmt: skip
        if not small:
            position = len(single[0]) + new_tokens // 2
            steps = {"HF": hf_step} | {
                f"jgpt {label} {kind}": seconds
                for _, label in executions
                for kind, seconds in (("best", results[label][1]), ("median", median_step(runs[label])))
            }
            figures[f"{name}, batch 1: the step's floor, and each side's share of it"] = print_floor(
                default, 1, position, steps, bounds
            )
            if args.kernel:
                data, arithmetic = step_work(default, 1, position)
                floor_ms = max(data / bounds[1], arithmetic / bounds[2]) * 1e3
                title = f"{name}, batch 1, kernels on and off alone, {5 * repeats} runs each, each after a read probe"
                figures[title] = print_kernel_ab(executions[:2], single, new_tokens, 5 * repeats, data, floor_ms)
        for equal in (True, False):
            batch = prompts(BATCH, config["vocab_size"], equal)
            both = {side: best_of(r) for side, r in compare(model, executions, batch, new_tokens, 2).items()}
            longest = max(map(len, batch))
            padded = f"jgpt's window {window_bucket(longest, config['n_positions'])}, HF's {longest}"
            shape = f"{EQUAL_PROMPT} ids" if equal else f"{min(map(len, batch))}..{longest} ids; {padded}"
            figures |= print_batch_table(f"{name}, batch {BATCH}, prompts of {shape}", both, new_tokens)
            if not small:
                position = max(map(len, batch)) + new_tokens // 2
                steps = {"HF": both["hf"][1], "jgpt": both[executions[0][1]][1]}
                title = f"{name}, batch {BATCH}, prompts of {shape}: the step's floor, and each side's share of it"
                figures[title] = print_floor(default, BATCH, position, steps, bounds)
    run.write(figures, args.results)


if __name__ == "__main__":
    main()
