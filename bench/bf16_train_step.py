"""The shipped recipe's train step in f32 and in bf16, with bf16 matmuls native and as rounded f32 operands.

`jgpt.model.bf16_matmul` multiplies bf16 operands as float32 on a backend without
bf16 matrix units (a CPU) and natively elsewhere. This bench runs the train
step of the shipped chat model's shape (`training.config` defaults: rope,
RMSNorm, SwiGLU, L4 C128, batch 32 x 128 tokens) three ways in one process and
prints the median wall and process CPU time of a step of each and their ratios
to f32 (on a shared machine the CPU time is the steadier figure):

* `float32`: the f32 recipe;
* `bf16 native`: bf16 dots, as on a GPU or TPU (forced here by emptying
  `ROUNDED_BACKENDS` while the step compiles);
* `bf16 rounded`: what this backend runs for `--precision bf16`.

The variants take turns step by step, so a change in the machine's load hits all three alike.

    python bench/bf16_train_step.py [--steps 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from result import BenchRun, add_results_argument

from jgpt.model import bf16_matmul
from jgpt.model.weights import initialize
from training import sharding
from training.batches import TokenStream
from training.config import TrainingConfig
from training.optimizer import adamw
from training.step import make_train_step, start


def variant_step(config: TrainingConfig, precision: str, native: bool):
    """A warmed-up train step (compiled with bf16 matmuls `native` or not) as a function of no arguments."""
    architecture = dataclasses.replace(config.architecture, precision=precision)
    mesh = sharding.data_mesh()
    optimizer = adamw(config)
    tokens = np.random.default_rng(0).integers(0, architecture.vocabulary, 100_000, dtype=np.int32)
    data = jax.device_put(TokenStream(jnp.asarray(tokens), config.window), sharding.replicated(mesh))
    train_step = make_train_step(
        architecture, optimizer, jax.random.key(1), config.batch_size, sharding.batch_sharding(mesh), config.unroll
    )
    box = [jax.device_put(start(initialize(architecture, 0)[0], optimizer), sharding.replicated(mesh))]

    def step():
        box[0], metrics = train_step(box[0], data)
        jax.block_until_ready(metrics["loss"])

    rounded = bf16_matmul.ROUNDED_BACKENDS
    bf16_matmul.ROUNDED_BACKENDS = () if native else rounded
    try:
        step()  # traces and compiles under the chosen form
    finally:
        bf16_matmul.ROUNDED_BACKENDS = rounded
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    add_results_argument(parser)
    args = parser.parse_args()
    run = BenchRun.start("bf16-train-step", __doc__)
    config = TrainingConfig()
    variants = {
        "float32": variant_step(config, "float32", native=True),
        "bf16 native": variant_step(config, "bfloat16", native=True),
        "bf16 rounded": variant_step(config, "bfloat16", native=False),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.steps):
        for name, step in variants.items():
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    print(f"backend {jax.default_backend()}  bf16 native here: {bf16_matmul.native()}")
    print(f"train step, batch {config.batch_size} x {config.window} tokens, {args.steps} timed steps each, interleaved")
    medians = {name: [statistics.median(column) for column in zip(*rows)] for name, rows in times.items()}
    f32_wall, f32_cpu = medians["float32"]
    print(f"  {'variant':<13} {'wall ms':>8} {'vs f32':>7} {'CPU ms':>8} {'vs f32':>7}")
    rows = {}
    for name, (wall, cpu) in medians.items():
        print(f"  {name:<13} {1e3 * wall:8.1f} {wall / f32_wall:7.2f} {1e3 * cpu:8.1f} {cpu / f32_cpu:7.2f}")
        rows[name] = {"wall_ms": 1e3 * wall, "wall_against_f32_x": wall / f32_wall, "cpu_ms": 1e3 * cpu,
                      "cpu_against_f32_x": cpu / f32_cpu}  # fmt: skip
    title = f"train step on {jax.default_backend()}, batch {config.batch_size} x {config.window} tokens, medians"
    run.write({title: rows}, args.results)


if __name__ == "__main__":
    main()
