"""OutputMajor projections: the same products as the stored layout, and the views that hold them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgpt.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.layer_strategy import PROJECTIONS, LayerStrategy
from jgpt.operations import dense
from jgpt.output_major import OutputMajor
from jgpt.weights import initialize

GPT = ModelArchitecture(vocabulary=61, width=32, ffn=80, context=24, layers=2, heads=4)
LLAMA = LlamaArchitecture(vocabulary=61, width=32, ffn=48, context=24, layers=3, heads=4, kv_heads=2)


@pytest.mark.parametrize("rows", [1, 16, 70])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_an_output_major_product_is_x_at_w_within_1e_5(rows, dtype):
    keys = jax.random.split(jax.random.PRNGKey(rows), 3)
    x = jax.random.normal(keys[0], (rows, 96))
    w = jax.random.normal(keys[1], (96, 200)) / 10
    b = jax.random.normal(keys[2], (200,))
    got = np.asarray(jax.jit(dense, static_argnums=3)(x, OutputMajor.of(w), b, dtype))
    stored = np.asarray(jax.jit(dense, static_argnums=3)(x, w, b, dtype))
    # The independent reference: float64 numpy on the operands as `dtype` rounds them.
    rounded = lambda t: np.asarray(jnp.asarray(t).astype(dtype).astype(jnp.float32), np.float64)
    reference = rounded(x) @ rounded(w) + np.asarray(b, np.float64)
    assert got.shape == (rows, 200)
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got, stored, atol=1e-5, rtol=0)


def test_the_output_major_view_holds_every_projection_and_the_lm_head_transposed():
    for architecture in (GPT, LLAMA):
        weights, _ = initialize(architecture, seed=0)
        view = LayerStrategy.unrolled_layers(output_major=True).layer_weights(weights)
        assert view is not None and len(view.layers) == architecture.layers
        for index, layer in enumerate(view.layers):
            for name, stacked in weights.block().items():
                if name in PROJECTIONS:
                    assert isinstance(layer[name], OutputMajor), name
                    np.testing.assert_array_equal(layer[name].matrix, np.asarray(stacked[index]).T)
                else:
                    np.testing.assert_array_equal(layer[name], stacked[index])
        np.testing.assert_array_equal(view.lm_head.matrix, np.asarray(weights.lm_head).T)
        plain = LayerStrategy.unrolled_layers().layer_weights(weights)
        assert plain.lm_head is None and not any(isinstance(t, OutputMajor) for layer in plain.layers for t in layer.values())
