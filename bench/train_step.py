"""Training throughput of jgpt's train step against a PyTorch peer, measured in one run.

Both sides run the same GPT (learned positions, LayerNorm, exact GELU, biases,
untied head), the same AdamW (weight decay off for biases, norms and
embeddings) with global-norm clipping, on the same batch shape of random byte
tokens. Each side runs warm-up steps, then timed steps; the figure is tokens
per second over the median step time.

It also prints the step's floor: the matrix-multiply FLOPs of one step (forward
and backward, attention scores as computed) divided by the fastest f32 matmul
rate either library reaches on this machine for the step's own shapes. No train
step can beat its floor, so `torch time / floor` bounds the ratio any
implementation could show against the PyTorch peer here.

    python bench/train_step.py [--steps 20] [--only small|large] [--scan] [--torch-compile]

`make bench` runs it with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, as `jgpt train` runs
(see docs/training.md, Speed); both sides of the comparison get the same allocator.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn

from jgpt.architecture import ModelArchitecture
from jgpt.weights import initialize
from training import sharding
from training.batches import TokenStream
from training.config import TrainingConfig
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


def peak_matmul_flops_per_second(shape: Shape, repeats: int = 20) -> float:
    """The fastest rate, over jax and torch and the three product forms of training, of the step's dense shapes."""
    rng = np.random.default_rng(0)
    best = 0.0
    for m, k, n in dense_shapes(shape):
        a, b, g = (rng.standard_normal(dims, dtype=np.float32) for dims in ((m, k), (k, n), (m, n)))
        forms = {  # forward y = a @ b, input gradient g @ b.T, weight gradient a.T @ g
            "jax": [(jax.jit(lambda x, y: x @ y), a, b), (jax.jit(lambda x, y: x @ y.T), g, b), (jax.jit(lambda x, y: x.T @ y), a, g)],
            "torch": [(torch.mm, a, b), (lambda x, y: x @ y.T, g, b), (lambda x, y: x.T @ y, a, g)],
        }  # fmt: skip
        for library, products in forms.items():
            convert = jnp.asarray if library == "jax" else torch.from_numpy
            for product, x, y in products:
                x, y = convert(x), convert(y)
                seconds = median_step_seconds(lambda: jax.block_until_ready(product(x, y)), 2, repeats)
                best = max(best, 2 * m * k * n / seconds)
    return best


def median_step_seconds(step, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start_time = time.perf_counter()
        step()
        times.append(time.perf_counter() - start_time)
    return statistics.median(times)


def jgpt_step(shape: Shape, unroll: bool | int):
    architecture = shape.architecture
    mesh = sharding.data_mesh()
    optimizer = adamw(CONFIG)
    tokens = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.int32)
    data = jax.device_put(TokenStream(jnp.asarray(tokens), shape.context), sharding.replicated(mesh))
    train_step = make_train_step(
        architecture, optimizer, jax.random.key(1), shape.batch, sharding.batch_sharding(mesh), unroll
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SHAPES))
    parser.add_argument("--torch-compile", action="store_true", help="also time torch.compile of the peer")
    parser.add_argument("--scan", action="store_true", help="also time jgpt with a rolled layer scan (unroll=1)")
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.device_count()} {jax.devices()[0].platform} device(s); "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads")  # fmt: skip
    for shape in [SHAPES[args.only]] if args.only else SHAPES.values():
        tokens = shape.batch * shape.context
        print(f"\n{shape.name}: layers={shape.layers} heads={shape.heads} width={shape.width} "
              f"context={shape.context} batch={shape.batch} ({tokens} tokens/step)")  # fmt: skip
        peers = {"torch eager": torch_step(shape, compiled=False)}
        if args.torch_compile:
            peers["torch compile"] = torch_step(shape, compiled=True)
        results = {"jgpt": median_step_seconds(jgpt_step(shape, unroll=True), args.warmup, args.steps)}
        if args.scan:
            results["jgpt scan"] = median_step_seconds(jgpt_step(shape, unroll=1), args.warmup, args.steps)
        results |= {name: median_step_seconds(step, args.warmup, args.steps) for name, step in peers.items()}
        for name, seconds in results.items():
            print(f"  {name:<14} {seconds * 1e3:8.1f} ms/step  {tokens / seconds:10,.0f} tokens/s")
        for name in peers:
            print(f"  ratio jgpt / {name}: {results[name] / results['jgpt']:.2f}x")
        flops, peak = step_flops(shape), peak_matmul_flops_per_second(shape)
        floor = flops / peak
        print(f"  floor: {flops / 1e9:.2f} GFLOP of matmuls at the best measured {peak / 1e9:.0f} GFLOP/s = "
              f"{floor * 1e3:.1f} ms/step; no step can beat torch eager by more than {results['torch eager'] / floor:.2f}x here")  # fmt: skip


if __name__ == "__main__":
    main()
