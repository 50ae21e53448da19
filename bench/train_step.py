"""Training throughput of jgpt's train step against a PyTorch peer, measured in one run.

Both sides run the same GPT (learned positions, LayerNorm, exact GELU, biases,
untied head), the same AdamW (weight decay off for biases, norms and
embeddings) with global-norm clipping, on the same batch shape of random byte
tokens. jgpt runs in every combination of its dense products (`jgpt train --products`:
`xla`, XLA's own dot, the pure-JAX reference and the default; `blas`, the
`jgpt.kernels.blas_matmul` kernel on a CPU) and its attention (`--attention`: `full`,
the default, which computes every score and masks the later keys;
`causal_blocks`, which skips the key blocks after each block of queries, as
torch's causal flash attention skips them; `causal_blas`, those blocks by the
`jgpt.kernels.blas_attention` kernel, which never stores the [T, T] weights). Each
side runs warm-up steps, then the sides take turns, a few timed steps each,
until each has run `--steps`; the figure is the median step time (tokens per second over it).

It also prints the step's floor: the matrix-multiply FLOPs of one step (forward
and backward, attention scores as computed) divided by the fastest f32 matmul
rate jax, the BLAS kernel or torch reaches on this machine for the step's own
shapes. No train step can beat its floor, so `torch time / floor` bounds the
ratio any implementation could show against the PyTorch peer here.

`--products` first prints each dense product of the step (forward `x @ W`, input
gradient `g @ W^T`, weight gradient `x^T @ g`) in GFLOP/s: XLA's dot in the
operand forms it offers (the layout as stored, a transposed copy of the weights,
a transposed result behind an optimization barrier), the BLAS kernel and torch,
taking turns in one run.

    python bench/train_step.py [--steps 20] [--only small|large] [--products] [--scan] [--torch-compile]

`make bench` runs it with the malloc tunables `jgpt train` runs with (`jgpt.runtime.process_settings.MALLOC_TUNABLES`: huge
pages, one arena, no mmap'd or trimmed blocks; docs/process-settings.md); both sides get the same allocator.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import torch
from result import BenchRun, add_results_argument
from torch import nn

from jgpt.kernels import blas_attention, blas_matmul
from jgpt.kernels.plan import XLA, Kernels
from jgpt.model.architecture import ModelArchitecture
from jgpt.model.weights import initialize
from training import sharding
from training.batches import TokenStream
from training.config import ATTENTIONS, PRODUCTS, TrainingConfig
from training.optimizer import adamw
from training.step import make_train_step, start

VOCABULARY = 260


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    heads: int
    width: int
    context: int
    batch: int

    @property
    def architecture(self) -> ModelArchitecture:
        return ModelArchitecture(
            vocabulary=VOCABULARY, width=self.width, ffn=4 * self.width, context=self.context,
            layers=self.layers, heads=self.heads,
        )  # fmt: skip


SHAPES = {
    "small": Shape("small", layers=4, heads=4, width=128, context=64, batch=12),
    "large": Shape("large", layers=6, heads=6, width=384, context=256, batch=12),
}
CONFIG = TrainingConfig(steps=10_000, warmup_steps=100)


def dense_shapes(shape: Shape) -> list[tuple[int, int, int]]:
    """(M, K, N) of one layer's projections: queries/keys/values, attention output, MLP up, MLP down."""
    n, c = shape.batch * shape.context, shape.width
    return [(n, c, 3 * c), (n, c, c), (n, c, 4 * c), (n, 4 * c, c)]


def matmul_shapes(shape: Shape) -> list[tuple[int, int, int, int]]:
    """(count, M, K, N) of every f32 matmul in one forward pass, attention per (row, head)."""
    t, d, rows = shape.context, shape.width // shape.heads, shape.batch * shape.heads
    per_layer = [(1, *dims) for dims in dense_shapes(shape)] + [(rows, t, d, t), (rows, t, t, d)]
    head = (1, shape.batch * shape.context, shape.width, VOCABULARY)
    return [(count * shape.layers, m, k, n) for count, m, k, n in per_layer] + [head]


def step_flops(shape: Shape) -> float:
    """Matmul FLOPs of one train step: each forward product has two backward products of equal size."""
    return 3 * sum(2 * count * m * k * n for count, m, k, n in matmul_shapes(shape))


def product_forms(m: int, k: int, n: int) -> dict[str, dict[str, tuple]]:
    """Each dense product of a train step, x [m, k] @ W [k, n] with output gradient g [m, n], in the forms
    timed: XLA's dot as stored, from a transposed copy (Wt = W^T, xT = x^T as separate arrays) and with a
    transposed result behind a barrier (the OutputMajor form, jgpt/model/output_major.py), the BLAS kernel, torch.
    Each form is (library, function, operands as NumPy arrays)."""
    rng = np.random.default_rng(0)
    x, w, g = (rng.standard_normal(dims, dtype=np.float32) for dims in ((m, k), (k, n), (m, n)))
    wt = np.ascontiguousarray(w.T)
    over = lambda a, b, ca, cb: jax.lax.dot_general(a, b, (((ca,), (cb,)), ((), ())))
    barrier = jax.lax.optimization_barrier
    forms = {
        "forward x@W": {
            "xla x@W": ("jax", lambda x, w: x @ w, x, w),
            "xla x@Wt^T": ("jax", lambda x, wt: over(x, wt, 1, 1), x, wt),
            "xla |Wt x^T|^T": ("jax", lambda x, wt: barrier(over(wt, x, 1, 1)).T, x, wt),
            "blas": ("blas", lambda x, w: blas_matmul.product(x, w), x, w),
            "torch": ("torch", lambda x, w: x @ w, x, w),
        },
        "input grad g@W^T": {
            "xla g@W^T": ("jax", lambda g, w: over(g, w, 1, 1), g, w),
            "xla g@Wt": ("jax", lambda g, wt: g @ wt, g, wt),
            "xla |W g^T|^T": ("jax", lambda g, w: barrier(over(w, g, 1, 1)).T, g, w),
            "blas": ("blas", lambda g, w: blas_matmul.product(g, w, transpose_b=True), g, w),
            "torch": ("torch", lambda g, w: g @ w.T, g, w),
        },
        "weight grad x^T@g": {
            "xla x^T@g": ("jax", lambda x, g: over(x, g, 0, 0), x, g),
            "xla g^T@x [O,I]": ("jax", lambda x, g: over(g, x, 0, 0), x, g),
            "xla |x^T|@g": ("jax", lambda x, g: barrier(x.T) @ g, x, g),
            "blas": ("blas", lambda x, g: blas_matmul.product(x, g, transpose_a=True), x, g),
            "torch": ("torch", lambda x, g: x.T @ g, x, g),
        },
    }
    return {product: {name: form for name, form in by_name.items() if form[0] != "blas" or blas_matmul.available()}
            for product, by_name in forms.items()}  # fmt: skip


def product_rates(shape: Shape, rounds: int = 3, repeats: int = 10) -> dict[tuple[int, int, int], dict]:
    """GFLOP/s of every form of every dense product of the step, {(m, k, n): {product: {form: rate}}}: the
    forms of one product take turns, `rounds` times; each keeps its best round's median call."""
    rates: dict[tuple[int, int, int], dict] = {}
    for m, k, n in dense_shapes(shape):
        rates[(m, k, n)] = {}
        for product, forms in product_forms(m, k, n).items():
            calls = {name: _call(library, function, operands) for name, (library, function, *operands) in forms.items()}
            seconds = {name: math.inf for name in calls}
            for _ in range(rounds):
                for name, call in calls.items():
                    seconds[name] = min(seconds[name], median_step_seconds(call, 2, repeats))
            rates[(m, k, n)][product] = {name: 2 * m * k * n / t / 1e9 for name, t in seconds.items()}
    return rates


def _call(library: str, function, operands):
    if library == "torch":
        tensors = [torch.from_numpy(a) for a in operands]
        return lambda: function(*tensors)
    compiled, arrays = jax.jit(function), [jnp.asarray(a) for a in operands]
    return lambda: jax.block_until_ready(compiled(*arrays))


def print_product_rates(rates) -> None:
    for (m, k, n), products in rates.items():
        print(f"  x [{m}, {k}] @ W [{k}, {n}]")
        for product, by_form in products.items():
            print(f"    {product:<18} " + "  ".join(f"{form} {rate:4.0f}" for form, rate in by_form.items()))


def median_step_seconds(step, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start_time = time.perf_counter()
        step()
        times.append(time.perf_counter() - start_time)
    return statistics.median(times)


def jgpt_step(shape: Shape, unroll: bool | int, kernels: Kernels = XLA):
    architecture = shape.architecture
    mesh = sharding.data_mesh()
    optimizer = adamw(CONFIG)
    tokens = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.int32)
    data = jax.device_put(TokenStream(jnp.asarray(tokens), shape.context), sharding.replicated(mesh))
    train_step = make_train_step(
        architecture,
        optimizer,
        jax.random.key(1),
        shape.batch,
        sharding.batch_sharding(mesh),
        unroll,
        kernels=kernels,
    )
    state = jax.device_put(start(initialize(architecture, 0)[0], optimizer), sharding.replicated(mesh))
    box = [state]

    def step():
        box[0], metrics = train_step(box[0], data)
        jax.block_until_ready(metrics["loss"])

    return step


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class TorchGPT(nn.Module):
    def __init__(self, shape: Shape):
        super().__init__()
        self.token_embedding = nn.Embedding(VOCABULARY, shape.width)
        self.position_embedding = nn.Embedding(shape.context, shape.width)
        self.blocks = nn.ModuleList(Block(shape.width, shape.heads) for _ in range(shape.layers))
        self.ln_final = nn.LayerNorm(shape.width)
        self.lm_head = nn.Linear(shape.width, VOCABULARY)

    def forward(self, ids, targets):
        x = self.token_embedding(ids) + self.position_embedding(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_final(x))
        return nn.functional.cross_entropy(logits.view(-1, VOCABULARY), targets.reshape(-1))


def torch_step(shape: Shape, compiled: bool):
    torch.manual_seed(0)
    model = TorchGPT(shape)
    decayed = [p for name, p in model.named_parameters() if p.dim() >= 2 and "embedding" not in name]
    others = [p for name, p in model.named_parameters() if not (p.dim() >= 2 and "embedding" not in name)]
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": CONFIG.weight_decay}, {"params": others, "weight_decay": 0.0}],
        lr=CONFIG.learning_rate, betas=(CONFIG.beta1, CONFIG.beta2),
    )  # fmt: skip
    loss_of = torch.compile(model) if compiled else model
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 256, 100_000)).long()
    generator = torch.Generator().manual_seed(1)

    def step():
        starts = torch.randint(0, tokens.numel() - shape.context - 1, (shape.batch, 1), generator=generator)
        windows = tokens[starts + torch.arange(shape.context + 1)]
        loss = loss_of(windows[:, :-1], windows[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CONFIG.clip_norm)
        optimizer.step()

    return step


def alternating_medians(
    steps: dict[str, Callable[[], None]], warmup: int, count: int, turn: int = 5
) -> dict[str, float]:
    """Median seconds per step of each side, the sides taking turns of `turn` timed steps until each has
    run `count`: a load that comes and goes falls on every side alike. Each round starts one side later, so
    no side always runs right after the peer's turn (in probes the side that did ran up to 2x slower in some processes,
    whichever side it was)."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps.items())
    while any(len(observed) < count for observed in times.values()):
        order = order[1:] + order[:1]
        for name, step in order:
            for _ in range(min(turn, count - len(times[name]))):
                start_time = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start_time)
    return {name: statistics.median(observed) for name, observed in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SHAPES))
    parser.add_argument("--products", action="store_true", help="print each dense product's rate in every form")
    parser.add_argument("--torch-compile", action="store_true", help="also time torch.compile of the peer")
    parser.add_argument("--scan", action="store_true", help="also time jgpt with a rolled layer scan (unroll=1)")
    add_results_argument(parser)
    args = parser.parse_args()
    run = BenchRun.start("train-step", __doc__)
    figures = {}
    blas = blas_matmul.available()
    print(f"jax {jax.__version__} on {jax.device_count()} {jax.devices()[0].platform} device(s); "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads; "
          f"jgpt's dense products by {'BLAS (jgpt.kernels.blas_matmul)' if blas else 'XLA'}")  # fmt: skip
    for shape in [SHAPES[args.only]] if args.only else SHAPES.values():
        tokens = shape.batch * shape.context
        print(f"\n{shape.name}: layers={shape.layers} heads={shape.heads} width={shape.width} "
              f"context={shape.context} batch={shape.batch} ({tokens} tokens/step)")  # fmt: skip
        rates = product_rates(shape)
        if args.products:
            print_product_rates(rates)
        attentions = ATTENTIONS if blas_attention.available() else ATTENTIONS[:2]
        steps = {f"jgpt {products} {attention}": jgpt_step(shape, True, Kernels(products, attention))
                 for products in (PRODUCTS if blas else ["xla"]) for attention in attentions}  # fmt: skip
        if args.scan:
            steps["jgpt scan"] = jgpt_step(shape, 1, Kernels(products="blas" if blas else "xla"))
        peers = ["torch eager"] + (["torch compile"] if args.torch_compile else [])
        steps |= {name: torch_step(shape, compiled=name == "torch compile") for name in peers}
        results = alternating_medians(steps, args.warmup, args.steps)
        for name, seconds in results.items():
            print(f"  {name:<22} {seconds * 1e3:8.1f} ms/step  {tokens / seconds:10,.0f} tokens/s")
        for peer in peers:
            for name in [name for name in results if name.startswith("jgpt")]:
                print(f"  ratio {name} / {peer}: {results[peer] / results[name]:.2f}x")
        flops = step_flops(shape)
        peak = max(rate for products in rates.values() for by_form in products.values() for rate in by_form.values())
        floor = flops / (peak * 1e9)
        print(f"  floor: {flops / 1e9:.2f} GFLOP of matmuls at the best measured {peak:.0f} GFLOP/s = "
              f"{floor * 1e3:.1f} ms/step; no step can beat torch eager by more than {results['torch eager'] / floor:.2f}x here")  # fmt: skip
        title = (f"{shape.name}: L{shape.layers} H{shape.heads} C{shape.width} T{shape.context} B{shape.batch}, "
                 "median step")  # fmt: skip
        figures[title] = {
            name: {"step_ms": seconds * 1e3, "tokens_per_s": tokens / seconds,
                   "against_torch_eager_x": results["torch eager"] / seconds}
            for name, seconds in results.items()
        } | {"floor": {"step_ms": floor * 1e3, "gflop": flops / 1e9, "against_torch_eager_x": results["torch eager"] / floor}}  # fmt: skip
    run.write(figures, args.results)


if __name__ == "__main__":
    main()
