"""The Llama-family variants of LlamaArchitecture: Qwen2's query/key/value biases, Mistral's sliding window and
Llama 3.1's rotary scaling (parity with transformers: tests/test_hf_parity.py, tests/test_hf_export.py).

Here: the fields' JSON (left out at their defaults, so that every earlier artifact reads and identifies as before),
their validation, the window's agreement between a full forward, a cached decode and the causal block attention,
the kernels' limits (the fused decode kernel computes biases and scaled rotations as XLA does, and never takes a
windowed model; the BLAS causal attention refuses one), and the cost model's count of the keys a window leaves.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference.costs import WorkCosts
from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_attention, fused_decode
from jgpt.kernels.plan import XLA, Kernels
from jgpt.model.architecture import LlamaArchitecture, RopeScaling, architecture_from_json
from jgpt.model.kv_state import KVBuffers
from jgpt.model.layer_strategy import LayerStrategy
from jgpt.model.operations import KernelCalls
from jgpt.model.transformer import forward
from jgpt.model.weights import initialize, parameter_count

REPO = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5
FORWARD = jax.jit(forward, static_argnames=("architecture", "observe", "unroll", "kernels"))
SCALING = RopeScaling(factor=8.0, low_freq_factor=0.5, high_freq_factor=2.0, original_context=20)
BASE = LlamaArchitecture(vocabulary=61, width=32, ffn=48, context=24, layers=2, heads=4, kv_heads=2)
WINDOWED = dataclasses.replace(BASE, sliding_window=5)
VARIANTS = dataclasses.replace(BASE, attention_bias=True, sliding_window=7, rope_scaling=SCALING)


def perturbed(architecture, seed: int = 1):
    """Random weights with every bias and scale moved off its trivial initial value."""
    weights, _ = initialize(architecture, seed=seed)
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda t: t + 0.1 * jnp.asarray(rng.standard_normal(t.shape), jnp.float32), weights)


def test_default_fields_are_left_out_of_the_json_so_earlier_artifacts_read_as_written():
    assert BASE.to_json() == {
        "vocabulary": 61, "width": 32, "ffn": 48, "context": 24, "layers": 2, "heads": 4, "epsilon": 1e-6,
        "position": "rope", "normalization": "rmsnorm", "activation": "swiglu", "precision": "float32",
        "kv_heads": 2, "rope_theta": 10000.0,
    }  # fmt: skip
    manifest = json.loads((REPO / "checkpoints" / "chat" / "manifest.json").read_text())
    assert architecture_from_json(manifest["architecture"]).to_json() == manifest["architecture"]
    written = VARIANTS.to_json()
    assert written["attention_bias"] is True and written["sliding_window"] == 7
    assert written["rope_scaling"] == {"factor": 8.0, "low_freq_factor": 0.5, "high_freq_factor": 2.0,
                                       "original_context": 20}  # fmt: skip
    again = architecture_from_json(json.loads(json.dumps(written)))
    assert again == VARIANTS and hash(again) == hash(VARIANTS) and isinstance(again.rope_scaling, RopeScaling)
    # Qwen2's biases: query (C), key and value (kv_width) per layer.
    assert parameter_count(dataclasses.replace(BASE, attention_bias=True)) - parameter_count(BASE) == 2 * (32 + 2 * 16)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"attention_bias": 1}, "attention_bias"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": 2.5}, "sliding_window"),
        ({"rope_scaling": "llama3"}, "rope_scaling"),
        ({"rope_scaling": {"factor": 8.0}}, "rope_scaling.high_freq_factor"),
        ({"rope_scaling": {**SCALING.to_json(), "beta": 1}}, "rope_scaling.beta"),
        ({"rope_scaling": {**SCALING.to_json(), "factor": -1.0}}, "rope_scaling.factor"),
        ({"rope_scaling": {**SCALING.to_json(), "high_freq_factor": 0.5}}, "rope_scaling.high_freq_factor"),
        ({"rope_scaling": {**SCALING.to_json(), "original_context": 0}}, "rope_scaling.original_context"),
    ],
)
def test_invalid_variant_fields_are_refused_naming_them(changes, field):
    with pytest.raises(ApiError) as error:
        architecture_from_json({**BASE.to_json(), **changes})
    assert error.value.field == field


def test_a_window_holding_the_whole_context_masks_nothing():
    weights = perturbed(BASE)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 61, (2, 24)), jnp.int32)
    whole = dataclasses.replace(BASE, sliding_window=24)
    assert whole.attention_window is None and WINDOWED.attention_window == 5
    np.testing.assert_array_equal(FORWARD(weights, whole, ids).logits, FORWARD(weights, BASE, ids).logits)
    assert not np.allclose(FORWARD(weights, WINDOWED, ids).logits, FORWARD(weights, BASE, ids).logits, atol=1e-3)


@pytest.mark.parametrize("architecture", [WINDOWED, VARIANTS], ids=["window", "all-variants"])
def test_the_window_masks_the_same_keys_in_a_full_forward_a_cached_decode_and_causal_blocks(architecture):
    a = architecture
    weights = perturbed(a)
    ids = jnp.asarray(np.random.default_rng(1).integers(0, a.vocabulary, (2, a.context)), jnp.int32)
    full = np.asarray(FORWARD(weights, a, ids).logits)
    # A prefill of 3 positions, then one token at a time past the window, over a cache longer than the context.
    out = FORWARD(weights, a, ids[:, :3], cache=KVBuffers.empty(a, 2, a.context + 8))
    cache, decoded = out.cache, [out.logits]
    for p in range(3, a.context):
        out = FORWARD(weights, a, ids[:, p : p + 1], positions=jnp.full((2, 1), p, jnp.int32), cache=cache)
        cache = out.cache
        decoded.append(out.logits)
    assert np.max(np.abs(np.concatenate(decoded, axis=1) - full)) <= TOLERANCE
    blocks = FORWARD(weights, a, ids, kernels=KernelCalls(causal_rows=4)).logits  # the window inside each block
    assert np.max(np.abs(np.asarray(blocks) - full)) <= TOLERANCE


def test_the_blas_causal_attention_is_refused_a_windowed_model_naming_the_window():
    calls = KernelCalls(causal_rows=4, causal_attention=blas_attention.causal_attention)
    ids = jnp.zeros((1, 8), jnp.int32)
    with pytest.raises(ApiError, match="sliding_window=5") as error:
        jax.eval_shape(lambda w: forward(w, WINDOWED, ids, kernels=calls), perturbed(WINDOWED))
    assert error.value.field == "kernels.causal_attention"


# Blocks of at least fused_decode.SMALLEST_BYTES, so that the fused kernel takes the model where it may.
LARGE = LlamaArchitecture(vocabulary=97, width=192, ffn=400, context=40, layers=3, heads=8, kv_heads=4)


def test_the_fused_decode_kernel_never_takes_a_windowed_model():
    fused = Kernels(decode="fused")
    assert fused.for_execution(LARGE, output_major=True).decode == "fused"
    windowed = dataclasses.replace(LARGE, sliding_window=16)
    assert fused.for_execution(windowed, output_major=True).decode == "xla"
    assert fused.for_execution(dataclasses.replace(LARGE, sliding_window=40), output_major=True).decode == "fused"
    layers = LayerStrategy.unrolled_layers(output_major=True).layer_weights(initialize(windowed, seed=1)[0])
    assert not fused_decode.admits(windowed, 1, jnp.float32, layers.layers)


def test_the_fused_decode_kernel_computes_biases_and_scaled_rotations_as_xla_does():
    """Where the kernel is available (a CPU with AVX-512F) it takes the step; elsewhere both plans are XLA's."""
    a = dataclasses.replace(LARGE, attention_bias=True, rope_scaling=SCALING)
    strategy = LayerStrategy.unrolled_layers(output_major=True)
    weights = perturbed(a)
    held, layers = strategy.held_weights(weights), strategy.layer_weights(weights)
    keys, values = jax.random.normal(jax.random.PRNGKey(0), (2, a.layers, 1, a.kv_heads, 24, a.head_dim))
    results = []
    for plan in (Kernels(decode="fused"), XLA):
        calls = plan.calls()
        step = jax.jit(lambda ids, p, c, calls=calls: forward(held, a, ids, positions=p, cache=c, layer_weights=layers,
                                                              kernels=calls))  # fmt: skip
        args = (jnp.array([[5]], jnp.int32), jnp.array([[17]], jnp.int32), KVBuffers(keys=keys, values=values))
        assert ("jgpt_fused_decode" in step.lower(*args).as_text()) == (plan != XLA and fused_decode.available())
        results.append(step(*args))
    got, want = results
    for g, w in ((got.logits, want.logits), (got.cache.keys, want.cache.keys)):
        w = np.asarray(w, np.float64)
        assert np.abs(np.asarray(g) - w).max() <= TOLERANCE * np.abs(w).max()


def test_costs_count_the_keys_a_window_leaves():
    weights = initialize(BASE, seed=0)[0]
    full, windowed = (WorkCosts.of(a, weights, 4) for a in (BASE, WINDOWED))
    assert windowed.window == 5 and full.window is None
    per_key = full.attention_flops_per_key
    for p in (0, 3, 4, 5, 20):
        assert windowed.position_matmul_flops(p) == full.dense_flops_per_position + per_key * min(p + 1, 5)
        assert windowed.position_memory_bytes(p) == full.row_bytes_per_position + full.kv_bytes_per_position * min(
            p + 1, 5
        )
    for start, stop in ((0, 24), (2, 9), (6, 7), (3, 3)):
        assert windowed.matmul_flops(start, stop) == sum(windowed.position_matmul_flops(p) for p in range(start, stop))
        assert windowed.memory_bytes(start, stop) - windowed.fixed_memory_bytes == sum(
            windowed.position_memory_bytes(p) for p in range(start, stop)
        )
    assert WorkCosts.of(dataclasses.replace(BASE, sliding_window=24), weights, 4) == full


def test_the_walkthrough_states_the_variants_and_is_unchanged_without_them():
    from jgpt.model.walkthrough import walkthrough

    plain, variants = (json.dumps(walkthrough(a).to_json()) for a in (BASE, VARIANTS))
    for said in ("query_bias", "value_bias", "the 6 positions before it (sliding window)", "scaled as Llama 3.1's"):
        assert said in variants and said not in plain
    assert "each position attends causally to itself and earlier positions" in plain
