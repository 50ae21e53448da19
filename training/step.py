"""The train step and the development-loss step: pure functions, jitted once per run.

`train_step(state, data) -> (state, metrics)` draws its own batch from
`fold_in(data_key, state.step)`, so the step number alone fixes the data and a
resumed run replays the uninterrupted one bit for bit. Under a Mesh the batch
is constrained to shard over the data axis and the state to the shardings the
caller placed it with (`training.sharding`); XLA inserts the gathers and the
gradient reductions.

`make_train_step` computes the dense products with BLAS (`jgpt.blas_matmul`:
forward and both backward products, weights as stored) when asked, and by
default on one CPU device; `jgpt train` asks only with `--products blas`
(`TrainingConfig.products`, default "xla": XLA's dot, the pure-JAX reference the
BLAS path is tested against and the shipped models were trained with). The
`attention` choices other than "full" (opt-in, like the BLAS products: they round
differently) skip the key blocks wholly after each block of queries instead of
computing and masking them, "causal_blas" by the `jgpt.blas_attention` kernel
(docs/training.md, Speed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding

from jgpt import blas_attention, blas_matmul
from jgpt import pytree as struct
from jgpt.architecture import Architecture
from jgpt.errors import ApiError
from jgpt.model import forward
from jgpt.operations import causal_blocks
from jgpt.weights import ModelWeights
from training.batches import Batch, TokenRows, TokenStream
from training.config import ATTENTIONS


@struct.dataclass
class TrainState:
    step: jax.Array  # int32[]: the number of updates applied so far
    weights: ModelWeights
    optimizer_state: optax.OptState


def start(weights: ModelWeights, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(jnp.zeros((), jnp.int32), weights, optimizer.init(weights))


# Query rows per block of the "causal_blocks" attention (training.config.ATTENTIONS; jgpt.operations.causal_blocks):
# 64 was the fastest of 32, 64 and 128 on the large bench config (docs/training.md, Speed).
CAUSAL_BLOCK_ROWS = 64
BLAS_ATTENTION_REFUSED = "causal_blas needs one CPU device where jgpt.blas_attention builds; use causal_blocks"


def summed_loss(
    weights: ModelWeights,
    architecture: Architecture,
    batch: Batch,
    unroll: bool | int,
    blas_products: bool = False,
    attention: str = "full",
) -> tuple[jax.Array, jax.Array]:
    """(sum of masked next-token cross-entropies in nats, number of counted targets)."""
    held = blas_matmul.with_blas_products(weights) if blas_products else weights
    skipping = attention in ("causal_blocks", "causal_blas")
    with causal_blocks(CAUSAL_BLOCK_ROWS, attention == "causal_blas") if skipping else contextlib.nullcontext():
        logits = forward(held, architecture, batch.inputs, unroll=unroll).logits  # [B, T, V]
    nats = optax.softmax_cross_entropy_with_integer_labels(logits, batch.targets)  # [B, T]
    return jnp.sum(nats * batch.mask), jnp.sum(batch.mask)


def mean_loss(weights, architecture, batch, unroll, blas_products: bool = False, attention: str = "full") -> jax.Array:
    total, count = summed_loss(weights, architecture, batch, unroll, blas_products, attention)
    return total / jnp.maximum(count, 1.0)


def make_train_step(
    architecture: Architecture,
    optimizer: optax.GradientTransformation,
    data_key: jax.Array,
    batch_size: int,
    batch_sharding: NamedSharding,
    unroll: bool | int,
    state_sharding: TrainState | None = None,
    blas_products: bool | None = None,
    attention: str = "full",
) -> Callable[[TrainState, TokenRows | TokenStream], tuple[TrainState, dict[str, jax.Array]]]:
    """The jitted update; the state argument is donated (its buffers become the new state's).

    `state_sharding` (NamedShardings shaped like the state) keeps the new state split as the old one was:
    without it XLA may return a sharded weight's update replicated. `blas_products` (default: `uses_blas`)
    computes the dense products with BLAS; `attention` is one of ATTENTIONS.
    """
    if attention not in ATTENTIONS:
        raise ApiError("attention", f"must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    if attention == "causal_blas" and not uses_blas_attention(batch_sharding):
        raise ApiError("attention", BLAS_ATTENTION_REFUSED)
    if blas_products is None:
        blas_products = uses_blas(batch_sharding)

    def train_step(state: TrainState, data: TokenRows | TokenStream):
        batch = data.sample(jax.random.fold_in(data_key, state.step), batch_size)
        batch = jax.lax.with_sharding_constraint(batch, batch_sharding)
        loss, grads = jax.value_and_grad(mean_loss)(
            state.weights, architecture, batch, unroll, blas_products, attention
        )
        updates, optimizer_state = optimizer.update(grads, state.optimizer_state, state.weights)
        weights = optax.apply_updates(state.weights, updates)
        metrics = {"loss": loss, "gradient_norm": optax.global_norm(grads)}
        state = TrainState(state.step + 1, weights, optimizer_state)
        if state_sharding is not None:
            state = jax.lax.with_sharding_constraint(state, state_sharding)
        return state, metrics

    return jax.jit(train_step, donate_argnums=0)


def uses_blas(batch_sharding: NamedSharding) -> bool:
    """BLAS products where they were measured faster and need no partitioning: one CPU device."""
    return batch_sharding.mesh.size == 1 and blas_matmul.available(batch_sharding.mesh.devices.flat[0].platform)


def uses_blas_attention(batch_sharding: NamedSharding) -> bool:
    """Where the BLAS attention kernel runs: one CPU device where it builds (it is not partitioned)."""
    return batch_sharding.mesh.size == 1 and blas_attention.available(batch_sharding.mesh.devices.flat[0].platform)


def make_development_step(architecture: Architecture, batch_sharding: NamedSharding, unroll: bool | int):
    """Jitted (summed nats, counted targets) of one development batch."""

    def development_step(weights: ModelWeights, batch: Batch):
        batch = jax.lax.with_sharding_constraint(batch, batch_sharding)
        return summed_loss(weights, architecture, batch, unroll)

    return jax.jit(development_step)
