"""OutputMajor projections: the same products as the stored layout, and the views that hold them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.layer_strategy import HELD_OUTPUT_MAJOR, PROJECTIONS, LayerStrategy, stored_layout
from jgpt.model.operations import dense
from jgpt.model.output_major import OutputMajor
from jgpt.model.weights import initialize

GPT = ModelArchitecture(vocabulary=61, width=32, ffn=80, context=24, layers=2, heads=4)
LLAMA = LlamaArchitecture(vocabulary=61, width=32, ffn=48, context=24, layers=3, heads=4, kv_heads=2)


# One row, a few and many: each of OutputMajor.product's forms (MANY_ROWS = 128).
@pytest.mark.parametrize("rows", [1, 16, 130])
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


def test_output_major_weights_hold_every_projection_and_the_lm_head_transposed_in_place_of_the_stored():
    output_major, stored = LayerStrategy.unrolled_layers(output_major=True), LayerStrategy.unrolled_layers()
    for architecture in (GPT, LLAMA):
        weights, _ = initialize(architecture, seed=0)
        held = output_major.held_weights(weights)
        for name, tensor in weights.as_dict().items():
            if name in HELD_OUTPUT_MAJOR:
                assert isinstance(held.as_dict()[name], OutputMajor), name
                np.testing.assert_array_equal(held.as_dict()[name].matrix, np.swapaxes(np.asarray(tensor), -1, -2))
            else:
                assert held.as_dict()[name] is tensor, name
        again = output_major.held_weights(held)
        assert all(again.as_dict()[name] is t for name, t in held.as_dict().items())  # converted once only
        assert stored.held_weights(held) is held  # held as given
        back = stored_layout(held).as_dict()
        for name, tensor in weights.as_dict().items():
            np.testing.assert_array_equal(back[name], tensor)
        view = output_major.layer_weights(weights)
        assert view is not None and len(view.layers) == architecture.layers
        for index, layer in enumerate(view.layers):
            for name in PROJECTIONS:
                if name in layer:
                    np.testing.assert_array_equal(layer[name].matrix, np.asarray(weights.as_dict()[name][index]).T)
        plain = stored.layer_weights(weights)
        assert not any(isinstance(t, OutputMajor) for layer in plain.layers for t in layer.values())
