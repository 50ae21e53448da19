"""The BLAS attention kernel (jgpt.kernels.blas_attention) against causal attention computed in float64 NumPy.

Tolerance 1e-5 relative to the largest value: the kernel's products are float32 sgemm calls and its
exponential a degree-7 polynomial (about 1e-7 relative); observed errors are 1e-7 to 6e-7.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_attention

TOLERANCE = 1e-5


def reference(q, k, v, out_gradient):
    """Causal softmax attention and its gradients in float64, written out by hand: (out, (dq, dk, dv))."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, out_gradient))
    B, T, H, D = q.shape
    G = H // k.shape[2]
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)  # query head h reads key/value head h // G
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = np.einsum("bhts,bshd->bthd", weights, v)
    weights_gradient = np.einsum("bthd,bshd->bhts", do, v)
    scores_gradient = weights * (weights_gradient - np.sum(weights_gradient * weights, -1, keepdims=True))
    dq = np.einsum("bhts,bshd->bthd", scores_gradient, k) / np.sqrt(D)
    dk = np.einsum("bhts,bthd->bshd", scores_gradient, q) / np.sqrt(D)
    dv = np.einsum("bhts,bthd->bshd", weights, do)
    grouped = lambda x: x.reshape(B, T, H // G, G, D).sum(3)  # the G query heads' shares of one key/value head
    return out, (dq, grouped(dk), grouped(dv))


def relative_error(actual, expected) -> float:
    return float(np.max(np.abs(np.asarray(actual, np.float64) - expected)) / np.max(np.abs(expected)))


def test_the_kernel_builds_on_cpu_only():
    assert blas_attention.available("cpu") and not blas_attention.available("gpu")


# (B, T, H, K, D, rows): one block, several with an uneven last block, one row per block, grouped query heads
# (two and three per key/value head), a head width that is not a multiple of the vector width, and rows far
# past the tokens (the kernel's per-thread buffers are sized by the rows it uses, at most T).
@pytest.mark.parametrize(
    "B, T, H, K, D, rows",
    [(2, 16, 2, 2, 8, 64), (2, 37, 4, 4, 16, 16), (1, 9, 2, 2, 4, 1), (3, 40, 4, 2, 8, 12), (2, 30, 6, 2, 5, 7),
     (1, 9, 2, 2, 4, 1 << 40)],
)  # fmt: skip
def test_outputs_and_gradients_match_float64(B, T, H, K, D, rows):
    rng = np.random.default_rng(T)
    q, k, v, do = (
        rng.standard_normal(s).astype(np.float32) for s in ((B, T, H, D), (B, T, K, D), (B, T, K, D), (B, T, H, D))
    )
    out, vjp = jax.vjp(lambda q, k, v: blas_attention.causal_attention(q, k, v, rows), q, k, v)
    expected_out, expected_gradients = reference(q, k, v, do)
    assert relative_error(out, expected_out) <= TOLERANCE
    for name, actual, expected in zip("qkv", vjp(jnp.asarray(do)), expected_gradients, strict=True):
        assert relative_error(actual, expected) <= TOLERANCE, name


def test_large_scores_do_not_overflow():
    """Scores of +-300 (far past float32's exp range): the softmax subtracts each row's largest score."""
    rng = np.random.default_rng(0)
    q = (rng.standard_normal((1, 24, 2, 8)) * 30).astype(np.float32)
    k, v = (rng.standard_normal((1, 24, 2, 8)).astype(np.float32) * 10 for _ in range(2))
    out = np.asarray(blas_attention.causal_attention(q, k, v, 8))
    assert np.all(np.isfinite(out))
    assert relative_error(out, reference(q, k, v, np.zeros_like(q))[0]) <= TOLERANCE


def test_bad_shapes_and_rows_are_refused():
    q, k = jnp.zeros((1, 8, 4, 16)), jnp.zeros((1, 8, 2, 16))
    for keys, values in (
        (jnp.zeros((1, 8, 3, 16)),) * 2,
        (k, jnp.zeros((1, 8, 2, 8))),
        (jnp.zeros((1, 9, 2, 16)),) * 2,
    ):
        with pytest.raises(ApiError, match="causal_attention"):
            blas_attention.causal_attention(q, keys, values, 4)
    for rows in (0, -2, True, 1.5):
        with pytest.raises(ApiError, match="rows"):
            blas_attention.causal_attention(q, k, k, rows)
