"""The opt-in causal block attentions of the train step (`attention="causal_blocks"`, and "causal_blas", the
same blocks by the BLAS kernel) against the full, masked attention that `jgpt train` runs by default: same
loss, gradients and train steps within 1e-5 relative.

Tolerance: all compute the same softmax in float32; the block forms sum fewer (exactly zero) terms and run
their products over shorter key spans (the kernel also scales inside its products and has its own exponential),
so only the rounding differs (observed ~3e-7 relative).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_attention
from jgpt.kernels.plan import CAUSAL_BLOCK_ROWS, Kernels
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.operations import KernelCalls
from jgpt.model.transformer import forward
from jgpt.model.weights import initialize
from training import sharding
from training.batches import Batch, TokenStream
from training.config import TrainingConfig
from training.optimizer import adamw
from training.step import make_train_step, mean_loss, start

TOLERANCE = 1e-5
GPT = ModelArchitecture(vocabulary=260, width=64, ffn=256, context=48, layers=2, heads=4)
# Grouped queries (two query heads per key/value head) and rotary positions: the other attention layout.
LLAMA = LlamaArchitecture(vocabulary=260, width=64, ffn=128, context=48, layers=2, heads=4, kv_heads=2)


def batch_of(rows: int, length: int, seed: int = 0) -> Batch:
    ids = jnp.asarray(np.random.default_rng(seed).integers(0, 256, (rows, length + 1)), jnp.int32)
    return Batch(ids[:, :-1], ids[:, 1:], jnp.ones((rows, length), jnp.float32))


def blocks_of(rows: int, by_blas: bool) -> KernelCalls:
    """The calls of the plan's attention="causal_blocks" (or "causal_blas"), at `rows` query rows per block."""
    return KernelCalls(causal_rows=rows, causal_attention=blas_attention.causal_attention if by_blas else None)


def loss_and_gradients(architecture, weights, batch, rows: int | None, by_blas: bool = False):
    def loss(w):
        if rows is None:
            return mean_loss(w, architecture, batch, True)
        logits = forward(w, architecture, batch.inputs, unroll=True, kernels=blocks_of(rows, by_blas)).logits
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch.targets))

    return jax.jit(jax.value_and_grad(loss))(weights)


@functools.cache
def full_attention(architecture):
    """The loss and gradients of the full attention on the cases' weights and batch: the same in every case of an
    architecture, so compiled and run once for it."""
    return loss_and_gradients(architecture, initialize(architecture, 0)[0], batch_of(3, architecture.context), None)


@pytest.mark.parametrize("architecture", [GPT, LLAMA], ids=["gpt", "llama-grouped"])
@pytest.mark.parametrize("rows", [16, 20, 64])  # 20 leaves a last block of 8 of the 48 queries; 64 is one block
@pytest.mark.parametrize("by_blas", [False, True], ids=["xla", "blas"])
def test_loss_and_gradients_match_the_full_attention(architecture, rows, by_blas):
    full_loss, full = full_attention(architecture)
    block_loss, blocks = loss_and_gradients(
        architecture, initialize(architecture, 0)[0], batch_of(3, architecture.context), rows, by_blas
    )
    assert abs(float(block_loss - full_loss)) <= TOLERANCE * abs(float(full_loss))
    # Per weight against the whole gradient's norm: a key bias's gradient is zero but for rounding (softmax
    # ignores a shift shared by every key), so its own relative error measures only noise.
    scale = float(jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(full))))
    for name, expected in full.as_dict().items():
        difference = float(jnp.linalg.norm(getattr(blocks, name) - expected))
        assert difference <= TOLERANCE * scale, name
        if "key_bias" not in name:
            assert difference <= TOLERANCE * float(jnp.linalg.norm(expected)), name


@pytest.mark.parametrize("by_blas", [False, True], ids=["xla", "blas"])
def test_attention_weights_are_zero_past_each_query(by_blas):
    weights = initialize(GPT, 0)[0]
    ids = batch_of(2, GPT.context).inputs
    full = forward(weights, GPT, ids, observe=True).observations
    blocks = forward(weights, GPT, ids, observe=True, kernels=blocks_of(16, by_blas)).observations
    for expected, actual in zip(full.records, blocks.records, strict=True):
        assert (expected.operation, expected.stage) == (actual.operation, actual.stage)
        np.testing.assert_allclose(actual.value, expected.value, rtol=TOLERANCE, atol=1e-6)
    block_weights = [r.value for r in blocks.records if r.stage == "attention_weights"]
    upper = np.triu(np.ones((GPT.context, GPT.context), bool), k=1)  # key after query
    assert all(np.all(np.asarray(w).transpose(0, 2, 1, 3)[..., upper] == 0) for w in block_weights)


def test_train_steps_follow_the_full_attention():
    architecture = ModelArchitecture(vocabulary=260, width=64, ffn=256, context=CAUSAL_BLOCK_ROWS + 16, layers=2,
                                     heads=4)  # fmt: skip  # two blocks of queries, the second of 16
    config = TrainingConfig(steps=100, warmup_steps=2, learning_rate=1e-2)
    optimizer, mesh = adamw(config), sharding.data_mesh()
    tokens = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.int32)
    data = TokenStream(jnp.asarray(tokens), architecture.context)
    curves, flops = {}, {}
    for attention in ("full", "causal_blocks", "causal_blas"):
        step = make_train_step(architecture, optimizer, jax.random.key(1), 4, sharding.batch_sharding(mesh), True,
                               kernels=Kernels(attention=attention))  # fmt: skip
        state, losses = start(initialize(architecture, 0)[0], optimizer), []
        cost = step.lower(state, data).compile().cost_analysis()
        flops[attention] = (cost[0] if isinstance(cost, list) else cost)["flops"]
        for _ in range(3):
            state, metrics = step(state, data)
            losses.append(float(metrics["loss"]))
        curves[attention] = np.array(losses)
    assert curves["full"][-1] < curves["full"][0]  # it learns, so the curves compared are not flat
    np.testing.assert_allclose(curves["causal_blocks"], curves["full"], rtol=TOLERANCE)
    np.testing.assert_allclose(curves["causal_blas"], curves["full"], rtol=TOLERANCE)
    # The opt-in step really skips work (its losses may equal the full step's: the skipped terms are zeros);
    # the kernel's products are not XLA's, so XLA counts none of attention's scores or mixes.
    assert flops["causal_blas"] < flops["causal_blocks"] < flops["full"]


def test_bad_choices_are_refused():
    mesh = sharding.data_mesh()
    with pytest.raises(ApiError, match="attention"):
        make_train_step(GPT, adamw(TrainingConfig()), jax.random.key(1), 4, sharding.batch_sharding(mesh), True,
                        kernels=Kernels(attention="flash"))  # fmt: skip
    for rows in (0, -1, 2.0, True):
        with pytest.raises(ApiError, match="causal_rows"):
            KernelCalls(causal_rows=rows)
    with pytest.raises(ApiError, match="causal_attention"):
        KernelCalls(causal_attention=blas_attention.causal_attention)
