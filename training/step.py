"""The train step and the development-loss step: pure functions, jitted once per run.

`train_step(state, data) -> (state, metrics)` draws its own batch from
`fold_in(data_key, state.step)`, so the step number alone fixes the data and a
resumed run replays the uninterrupted one bit for bit. Under a Mesh the batch
is constrained to shard over the data axis and the state to the shardings the
caller placed it with (`training.sharding`); XLA inserts the gathers and the
gradient reductions.

What the step computes by kernels is its plan (`jgpt.kernels.plan.Kernels`, default the pure-JAX
reference the shipped models were trained with), a jit-static part of the step: `jgpt train` makes it
from the run's `--products` and `--attention` (`training_kernels`). `products="blas"` computes the
dense products with BLAS (`jgpt.kernels.blas_matmul`: forward and both backward products, weights as
stored); the attentions other than "full" skip the key blocks wholly after each block of queries
instead of computing and masking them, "causal_blas" by the `jgpt.kernels.blas_attention` kernel
(docs/training.md, Speed). Both round differently from the reference, so they are opt-in.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding

from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_attention, blas_matmul
from jgpt.kernels.plan import XLA, Kernels
from jgpt.model import pytree as struct
from jgpt.model.architecture import Architecture
from jgpt.model.transformer import forward
from jgpt.model.weights import ModelWeights
from training.batches import Batch, TokenRows, TokenStream


@struct.dataclass
class TrainState:
    step: jax.Array  # int32[]: the number of updates applied so far
    weights: ModelWeights
    optimizer_state: optax.OptState


def start(weights: ModelWeights, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(jnp.zeros((), jnp.int32), weights, optimizer.init(weights))


BLAS_PRODUCTS_REFUSED = "blas needs one CPU device where jgpt.kernels.blas_matmul builds; use xla"
BLAS_ATTENTION_REFUSED = "causal_blas needs one CPU device where jgpt.kernels.blas_attention builds; use causal_blocks"


def summed_loss(
    weights: ModelWeights,
    architecture: Architecture,
    batch: Batch,
    unroll: bool | int,
    kernels: Kernels = XLA,
) -> tuple[jax.Array, jax.Array]:
    """(sum of masked next-token cross-entropies in nats, number of counted targets)."""
    logits = forward(weights, architecture, batch.inputs, unroll=unroll, kernels=kernels.calls()).logits  # [B, T, V]
    nats = optax.softmax_cross_entropy_with_integer_labels(logits, batch.targets)  # [B, T]
    return jnp.sum(nats * batch.mask), jnp.sum(batch.mask)


def mean_loss(weights, architecture, batch, unroll, kernels: Kernels = XLA) -> jax.Array:
    total, count = summed_loss(weights, architecture, batch, unroll, kernels)
    return total / jnp.maximum(count, 1.0)


def make_train_step(
    architecture: Architecture,
    optimizer: optax.GradientTransformation,
    data_key: jax.Array,
    batch_size: int,
    batch_sharding: NamedSharding,
    unroll: bool | int,
    state_sharding: TrainState | None = None,
    kernels: Kernels = XLA,
) -> Callable[[TrainState, TokenRows | TokenStream], tuple[TrainState, dict[str, jax.Array]]]:
    """The jitted update; the state argument is donated (its buffers become the new state's).

    `state_sharding` (NamedShardings shaped like the state) keeps the new state split as the old one was:
    without it XLA may return a sharded weight's update replicated. `kernels` is the step's plan (its
    products and attention; refused where a kernel it names cannot run over `batch_sharding`).
    """
    check_training_kernels(kernels, batch_sharding)

    def train_step(state: TrainState, data: TokenRows | TokenStream):
        batch = data.sample(jax.random.fold_in(data_key, state.step), batch_size)
        batch = jax.lax.with_sharding_constraint(batch, batch_sharding)
        loss, grads = jax.value_and_grad(mean_loss)(state.weights, architecture, batch, unroll, kernels)
        updates, optimizer_state = optimizer.update(grads, state.optimizer_state, state.weights)
        weights = optax.apply_updates(state.weights, updates)
        metrics = {"loss": loss, "gradient_norm": optax.global_norm(grads)}
        state = TrainState(state.step + 1, weights, optimizer_state)
        if state_sharding is not None:
            state = jax.lax.with_sharding_constraint(state, state_sharding)
        return state, metrics

    return jax.jit(train_step, donate_argnums=0)


def training_kernels(products: str, attention: str) -> Kernels:
    """The plan of a run's `--products` and `--attention` (TrainingConfig.products, .attention)."""
    return Kernels(products=products, attention=attention)


def check_training_kernels(kernels: Kernels, batch_sharding: NamedSharding) -> None:
    """Refuse a plan whose kernels cannot run over `batch_sharding`: a recipe's arithmetic is never swapped."""
    if kernels.products == "blas" and not uses_blas(batch_sharding):
        raise ApiError("products", BLAS_PRODUCTS_REFUSED)
    if kernels.attention == "causal_blas" and not uses_blas_attention(batch_sharding):
        raise ApiError("attention", BLAS_ATTENTION_REFUSED)


def uses_blas(batch_sharding: NamedSharding) -> bool:
    """Where the BLAS products kernel runs: one CPU device where it builds (it is not partitioned)."""
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
