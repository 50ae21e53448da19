"""The kernel parity table: each kernel of a plan against the pure-JAX plan (`Kernels.xla()`), on this CPU and
with the kernel unavailable.

    python tools/kernel_parity.py

For every kernel it runs the same pass under the plan that names the kernel and under the reference plan and
prints the largest absolute difference over everything the pass returns (logits and KV cache of a decode step;
loss and every weight's gradient of a train step's loss), and that difference relative to the reference's
largest magnitude. Then, with every kernel's loader made to fail (as on a CPU without AVX-512F, or without a
compiler), it prints what the run's plan becomes and the difference again: the auto plan of an execution
resolves to "xla" for the decode kernels, and its results are the reference's bit for bit; a training plan that
names a kernel is refused, never silently replaced (its rounding is part of the recipe).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jgpt.foundation.errors import ApiError  # noqa: E402
from jgpt.kernels import blas_attention, blas_matmul, blas_matvec, fused_decode  # noqa: E402
from jgpt.kernels.plan import CAUSAL_BLOCK_ROWS, XLA, Kernels  # noqa: E402
from jgpt.model.architecture import Architecture, LlamaArchitecture, ModelArchitecture  # noqa: E402
from jgpt.model.kv_state import KVBuffers  # noqa: E402
from jgpt.model.layer_strategy import LayerStrategy  # noqa: E402
from jgpt.model.transformer import forward  # noqa: E402
from jgpt.model.weights import initialize  # noqa: E402
from training import sharding  # noqa: E402
from training.batches import Batch  # noqa: E402
from training.step import check_training_kernels, mean_loss  # noqa: E402

# A decode model whose blocks hold more than fused_decode.SMALLEST_BYTES, with widths that are not multiples of
# the kernels' vector or row groups; and Llama with grouped key/value heads.
DECODE_MODELS = {
    "gpt": ModelArchitecture(vocabulary=97, width=168, ffn=420, context=40, layers=3, heads=6),
    "llama": LlamaArchitecture(vocabulary=97, width=192, ffn=400, context=40, layers=3, heads=8, kv_heads=4),
}
# A train step's model with two blocks of causal query rows (CAUSAL_BLOCK_ROWS + 16 tokens).
TRAINING_MODEL = LlamaArchitecture(
    vocabulary=260, width=64, ffn=128, context=CAUSAL_BLOCK_ROWS + 16, layers=2, heads=4, kv_heads=2
)
SLOTS = 24
KERNEL_MODULES = (blas_matmul, blas_attention, blas_matvec, fused_decode)


@dataclasses.dataclass(frozen=True)
class Case:
    kernel: str  # the module
    plan: Kernels  # the plan that names it
    compared: str  # what the pass returns
    run: Callable[[Kernels], list[jax.Array]]
    trains: bool  # a training kernel: refused where unavailable, not replaced


@dataclasses.dataclass(frozen=True)
class Row:
    kernel: str
    plan: str  # the field the kernel is named by, e.g. decode=fused
    compared: str
    max_abs: float  # on this CPU, over everything compared
    relative: float
    parts: str  # the max abs error of each part compared (logits, keys, values; loss, gradients)
    unavailable_plan: str  # what the plan becomes with the kernel unavailable
    unavailable_max_abs: float | None  # None: refused


def decode_step(architecture: Architecture) -> Callable[[Kernels], list[jax.Array]]:
    """One batch-1 decode step at position 9 over a random cache, under a plan as an execution binds it."""
    weights = initialize(architecture, seed=3)[0]
    strategy = LayerStrategy.unrolled_layers(output_major=True)
    held, layers = strategy.held_weights(weights), strategy.layer_weights(weights)
    keys, values = jax.random.normal(
        jax.random.PRNGKey(1), (2, architecture.layers, 1, architecture.kv_heads, SLOTS, architecture.head_dim)
    )

    def run(plan: Kernels) -> list[jax.Array]:
        calls = plan.for_execution(architecture, output_major=True).calls()
        out = jax.jit(
            lambda ids, p, c: forward(
                held, architecture, ids, positions=p, cache=c, layer_weights=layers, kernels=calls
            )
        )(jnp.array([[5]], jnp.int32), jnp.array([[9]], jnp.int32), KVBuffers(keys=keys, values=values))
        return [out.logits, out.cache.keys, out.cache.values]

    return run


def train_loss(architecture: Architecture) -> Callable[[Kernels], list[jax.Array]]:
    """A train step's loss and every weight's gradient under a plan."""
    weights = initialize(architecture, seed=0)[0]
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 256, (3, architecture.context + 1)), jnp.int32)
    batch = Batch(ids[:, :-1], ids[:, 1:], jnp.ones((3, architecture.context), jnp.float32))

    def run(plan: Kernels) -> list[jax.Array]:
        loss, grads = jax.jit(jax.value_and_grad(mean_loss), static_argnums=(1, 3, 4))(
            weights, architecture, batch, True, plan
        )
        return [loss, *jax.tree.leaves(grads)]

    return run


def cases() -> list[Case]:
    decode = {name: decode_step(a) for name, a in DECODE_MODELS.items()}
    train = train_loss(TRAINING_MODEL)
    return [
        *(Case("fused_decode", Kernels(decode="fused"), f"{name} decode step: logits; K/V cache", run, False)
          for name, run in decode.items()),
        *(Case("blas_matvec", Kernels(one_row="kernel"), f"{name} decode step: logits; K/V cache", run, False)
          for name, run in decode.items()),
        Case("blas_matmul", Kernels(products="blas"), "llama train loss; every gradient", train, True),
        Case("(XLA blocks)", Kernels(attention="causal_blocks"), "llama train loss; every gradient", train, True),
        Case("blas_attention", Kernels(attention="causal_blas"), "llama train loss; every gradient", train, True),
    ]  # fmt: skip


def part_errors(got: list[jax.Array], want: list[jax.Array]) -> str:
    """The max abs error of the first array (logits, or the loss), and over the rest (cache, or gradients)."""
    first = float(np.max(np.abs(np.asarray(got[0], np.float64) - np.asarray(want[0], np.float64))))
    rest = max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
               for g, w in zip(got[1:], want[1:], strict=True))  # fmt: skip
    return f"{first:.1e}; {rest:.1e}"


def max_abs(got: list[jax.Array], want: list[jax.Array]) -> tuple[float, float]:
    """The largest absolute difference over all the arrays, and it relative to the reference's largest magnitude."""
    difference = max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
                     for g, w in zip(got, want, strict=True))  # fmt: skip
    scale = max(float(np.max(np.abs(np.asarray(w, np.float64)))) for w in want)
    return difference, difference / scale


@contextlib.contextmanager
def kernels_unavailable() -> Iterator[None]:
    """Every kernel's loader failing, as where the CPU lacks AVX-512F or no compiler is installed."""
    saved = {module: module._kernel for module in KERNEL_MODULES}
    try:
        for module in KERNEL_MODULES:
            module._kernel = lambda: None  # type: ignore[attr-defined]
        yield
    finally:
        for module, loader in saved.items():
            module._kernel = loader  # type: ignore[attr-defined]


def named_field(plan: Kernels, reference: Kernels = XLA) -> str:
    changed = [f"{k}={v}" for k, v in plan.to_json().items() if v != reference.to_json()[k]]
    return ", ".join(changed) or "the xla plan"


def table() -> list[Row]:
    rows = []
    one_device = sharding.batch_sharding(sharding.data_mesh())
    for case in cases():
        reference, planned = case.run(XLA), case.run(case.plan)
        difference, relative = max_abs(planned, reference)
        with kernels_unavailable():
            if case.trains:
                try:
                    check_training_kernels(case.plan, one_device)
                    resolved, unavailable = case.plan, max_abs(case.run(case.plan), reference)[0]
                except ApiError:
                    resolved, unavailable = None, None
            else:  # an execution's auto plan, bound once, as `jgpt generate --kernels auto` makes it
                resolved = Kernels.auto()
                unavailable = max_abs(case.run(resolved), reference)[0]
        became = "refused" if resolved is None else named_field(resolved)
        rows.append(Row(case.kernel, named_field(case.plan), case.compared, difference, relative,
                        part_errors(planned, reference), became, unavailable))  # fmt: skip
    return rows


def markdown(rows: list[Row]) -> str:
    lines = [
        "| kernel | plan | compared with the xla plan (first; rest) | max abs error (first; rest) | relative | "
        "kernel unavailable: plan | max abs error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        unavailable = "(not run)" if r.unavailable_max_abs is None else f"{r.unavailable_max_abs:.1e}"
        lines.append(f"| {r.kernel} | {r.plan} | {r.compared} | {r.parts} | {r.relative:.1e} | "
                     f"{r.unavailable_plan} | {unavailable} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    print(f"this CPU: fused_decode {fused_decode.available()}, blas_matvec {blas_matvec.available()}, "
          f"blas_matmul {blas_matmul.available()}, blas_attention {blas_attention.available()}; "
          f"auto plan: {Kernels.auto()}")  # fmt: skip
    print(markdown(table()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
