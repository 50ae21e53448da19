"""BLAS products of the train step on CPU (jgpt.kernels.blas_matmul, the plan's products="blas") against float64
NumPy and the pure-JAX plan."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgpt.kernels import blas_matmul
from jgpt.kernels.plan import XLA, Kernels
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.weights import initialize
from training import sharding
from training.batches import Batch, TokenStream
from training.config import TrainingConfig
from training.optimizer import adamw
from training.step import make_train_step, mean_loss, start, uses_blas

BLAS = Kernels(products="blas")
ARCHITECTURES = [
    ModelArchitecture(vocabulary=260, width=32, ffn=64, context=16, layers=1, heads=2),
    LlamaArchitecture(vocabulary=260, width=32, ffn=96, context=16, layers=1, heads=4, kv_heads=2),
]


def relative_error(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def test_the_kernel_builds_and_is_chosen_on_one_cpu_device():
    assert blas_matmul.available("cpu") and not blas_matmul.available("gpu")
    assert uses_blas(sharding.batch_sharding(sharding.data_mesh()))


# 70 and 200 rows split into parts of uneven size over the pool; 5 rows make one part.
@pytest.mark.parametrize("rows, inner, columns", [(70, 33, 45), (200, 64, 96), (5, 17, 3)])
def test_each_product_form_matches_float64(rows, inner, columns):
    rng = np.random.default_rng(rows)
    x, w, g = (
        rng.standard_normal(shape).astype(np.float32) for shape in ((rows, inner), (inner, columns), (rows, columns))
    )
    forms = jax.jit(lambda x, w, g: (blas_matmul.product(x, w), blas_matmul.product(g, w, transpose_b=True),
                                     blas_matmul.product(x, g, transpose_a=True)))  # fmt: skip
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, g))
    for actual, expected in zip(forms(x, w, g), (x64 @ w64, g64 @ w64.T, x64.T @ g64)):
        assert actual.shape == expected.shape
        assert relative_error(actual, expected) < 1e-5


def test_matmul_gradients_match_xla_dot():
    rng = np.random.default_rng(1)
    x, w, r = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in ((48, 24), (24, 40), (48, 40)))
    of = lambda product: jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(product(x, w) * r), argnums=(0, 1)))
    (value, grads), (reference_value, reference_grads) = of(blas_matmul.matmul)(x, w), of(jnp.dot)(x, w)
    assert abs(float(value) - float(reference_value)) < 1e-5 * abs(float(reference_value))
    for actual, expected in zip(grads, reference_grads):
        assert relative_error(actual, expected) < 1e-5


def batch_of(architecture, seed: int = 0) -> Batch:
    ids = jnp.asarray(np.random.default_rng(seed).integers(0, 256, (4, architecture.context + 1)), jnp.int32)
    return Batch(ids[:, :-1], ids[:, 1:], jnp.ones((4, architecture.context), jnp.float32))


@pytest.mark.parametrize("architecture", ARCHITECTURES, ids=["gpt", "llama"])
def test_train_step_gradients_match_the_reference_path(architecture):
    weights, _ = initialize(architecture, 0)
    grad = jax.jit(jax.value_and_grad(mean_loss), static_argnums=(1, 3, 4))
    (loss, grads), (reference_loss, reference_grads) = (grad(weights, architecture, batch_of(architecture), True, plan)
                                                        for plan in (BLAS, XLA))  # fmt: skip
    assert abs(float(loss) - float(reference_loss)) < 1e-5 * float(reference_loss)
    # Relative to the whole gradient's largest entry: a key bias's gradient is zero up to rounding
    # (softmax ignores what it adds to every score of a row), so its own scale is noise.
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(reference_grads))
    for name, expected in reference_grads.as_dict().items():
        actual = getattr(grads, name)
        assert float(jnp.max(jnp.abs(actual - expected))) < 1e-5 * scale, name
        assert relative_error(actual, expected) < 1e-5 or "key_bias" in name, name


def test_a_few_train_steps_follow_the_reference_loss_curve():
    architecture = ARCHITECTURES[1]
    config = TrainingConfig(steps=100, warmup_steps=2, learning_rate=1e-2)
    optimizer, mesh = adamw(config), sharding.data_mesh()
    tokens = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.int32)
    data = TokenStream(jnp.asarray(tokens), architecture.context)
    curves = {}
    for blas in (True, False):
        step = make_train_step(architecture, optimizer, jax.random.key(1), 4, sharding.batch_sharding(mesh), True,
                               kernels=BLAS if blas else XLA)  # fmt: skip
        state, losses = start(initialize(architecture, 0)[0], optimizer), []
        for _ in range(3):
            state, metrics = step(state, data)
            losses.append(float(metrics["loss"]))
        curves[blas] = losses
    assert curves[False][-1] < curves[False][0]  # it learns, so the curves compared are not flat
    assert relative_error(curves[True], curves[False]) < 1e-5
