"""The model core: architecture validation, weights, forward pass, causality, cache, walkthrough."""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jgpt.foundation.errors import ApiError
from jgpt.foundation.ontology import is_admitted
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture, architecture_from_json
from jgpt.model.kv_state import KVBuffers
from jgpt.model.layer_strategy import LayerStrategy, per_layer_view
from jgpt.model.transformer import forward
from jgpt.model.walkthrough import walkthrough
from jgpt.model.weights import BLOCK_NAMES, ModelWeights, check_weights, initialize, parameter_count

GPT = ModelArchitecture(vocabulary=61, width=32, ffn=80, context=24, layers=2, heads=4)
LLAMA = LlamaArchitecture(vocabulary=61, width=32, ffn=48, context=24, layers=3, heads=4, kv_heads=2)
ARCHITECTURES = {"gpt": GPT, "llama": LLAMA}
FORWARD = jax.jit(forward, static_argnames=("architecture", "observe", "unroll"))


@functools.cache
def weights_of(name: str) -> ModelWeights:
    return initialize(ARCHITECTURES[name], seed=7)[0]


def random_ids(shape, vocabulary, seed=0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocabulary, shape), jnp.int32)


# --- architecture -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "changes", "field"),
    [
        (ModelArchitecture, {"width": 30}, "width"),  # not divisible by 4 heads
        (ModelArchitecture, {"activation": "relu"}, "activation"),
        (ModelArchitecture, {"layers": 0}, "layers"),
        (ModelArchitecture, {"vocabulary": -3}, "vocabulary"),
        (ModelArchitecture, {"ffn": 2.5}, "ffn"),
        (ModelArchitecture, {"epsilon": 0.0}, "epsilon"),
        (ModelArchitecture, {"precision": "float16"}, "precision"),
        (ModelArchitecture, {"normalization": "rmsnorm"}, "normalization"),
        (LlamaArchitecture, {"kv_heads": 3}, "kv_heads"),
        (LlamaArchitecture, {"position": "learned"}, "position"),
        (LlamaArchitecture, {"rope_theta": -1.0}, "rope_theta"),
    ],
)
def test_invalid_architecture_is_rejected_naming_the_field(cls, changes, field):
    base = dict(vocabulary=61, width=32, ffn=80, context=24, layers=2, heads=4)
    with pytest.raises(ApiError) as error:
        cls(**{**base, **changes})
    assert error.value.field == field


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_architecture_round_trips_through_json_and_is_hashable(name):
    architecture = ARCHITECTURES[name]
    again = architecture_from_json(architecture.to_json())
    assert again == architecture and type(again) is type(architecture)
    assert hash(again) == hash(architecture)


def test_architecture_json_rejects_unknown_and_missing_fields():
    with pytest.raises(ApiError) as error:
        architecture_from_json({**GPT.to_json(), "dropout": 0.1})
    assert error.value.field == "dropout"
    document = LLAMA.to_json()
    del document["heads"]
    with pytest.raises(ApiError) as error:
        architecture_from_json(document)
    assert error.value.field == "heads"


# --- weights ------------------------------------------------------------------------------------------


def gpt_parameters(V, C, F, T, L):
    per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (C * F + F) + (F * C + C)
    return V * C + T * C + L * per_layer + 2 * C + C * V + V


def llama_parameters(V, C, F, L, kv_width):
    per_layer = C + C * C + 2 * C * kv_width + C * C + C + 3 * C * F
    return V * C + L * per_layer + C + C * V


def test_parameter_counts_match_the_analytic_formula():
    for V, C, F, T, L in [(61, 32, 80, 24, 2), (260, 128, 512, 64, 4), (50257, 768, 3072, 1024, 12)]:
        assert parameter_count(ModelArchitecture(V, C, F, T, L, heads=4)) == gpt_parameters(V, C, F, T, L)
    assert parameter_count(ModelArchitecture(50257, 768, 3072, 1024, 12, heads=12)) == 124_439_808 + 768 * 50257 + 50257
    for V, C, F, L, H, K in [(61, 32, 48, 3, 4, 2), (32000, 4096, 11008, 32, 32, 32), (128256, 4096, 14336, 32, 32, 8)]:
        architecture = LlamaArchitecture(V, C, F, 8, L, heads=H, kv_heads=K)
        assert parameter_count(architecture) == llama_parameters(V, C, F, L, K * C // H)
    # Llama-2-7B (untied head) and Llama-3-8B, as published.
    assert parameter_count(LlamaArchitecture(32000, 4096, 11008, 8, 32, heads=32)) == 6_738_415_616
    assert parameter_count(LlamaArchitecture(128256, 4096, 14336, 8, 32, heads=32, kv_heads=8)) == 8_030_261_248


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_initialization_is_seeded_and_fits_the_architecture(name):
    architecture = ARCHITECTURES[name]
    weights, provenance = initialize(architecture, seed=7)
    check_weights(weights, architecture)
    assert (provenance.kind, provenance.seed) == ("random", 7)
    assert sum(t.size for t in weights.as_dict().values()) == parameter_count(architecture)
    same, _ = initialize(architecture, seed=7)
    other, _ = initialize(architecture, seed=8)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(weights), jax.tree.leaves(same)))
    assert not np.array_equal(weights.query, other.query)
    for block_tensor in BLOCK_NAMES & set(weights.as_dict()):
        assert getattr(weights, block_tensor).shape[0] == architecture.layers
    assert (weights.ff_gate is None) == (name == "gpt") and (weights.lm_bias is None) == (name == "llama")


def test_check_weights_names_the_tensor_at_fault():
    weights = weights_of("gpt")
    with pytest.raises(ApiError) as error:
        check_weights(weights.replace(key=weights.key[:, :, :-1]), GPT)
    assert error.value.field == "key"
    with pytest.raises(ApiError) as error:
        check_weights(weights, dataclasses.replace(GPT, layers=3))
    assert error.value.field == "attention_output"


# --- forward ------------------------------------------------------------------------------------------


class ForwardBoundaryTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_shapes_and_dtypes(self):
        for name, architecture in ARCHITECTURES.items():
            run = self.variant(functools.partial(forward, architecture=architecture))
            out = run(weights_of(name), token_ids=random_ids((3, 5), architecture.vocabulary))
            chex.assert_shape(out.logits, (3, 5, architecture.vocabulary))
            chex.assert_type(out.logits, jnp.float32)
            a = architecture
            chex.assert_shape([out.cache.keys, out.cache.values], (a.layers, 3, a.kv_heads, 5, a.head_dim))
            chex.assert_tree_all_finite(out.logits)
            self.assertIsNone(out.observations)

    @chex.variants(with_jit=True, without_jit=True)
    def test_boundary_rejects_wrong_rank_and_dtype(self):
        run = self.variant(functools.partial(forward, architecture=GPT))
        with self.assertRaises(AssertionError):
            run(weights_of("gpt"), token_ids=random_ids((5,), GPT.vocabulary))
        with self.assertRaises(AssertionError):
            run(weights_of("gpt"), token_ids=random_ids((1, 5), GPT.vocabulary).astype(jnp.float32))

    @chex.variants(with_jit=True, without_jit=True)
    def test_bfloat16_keeps_float32_logits_close_to_float32(self):
        for name, architecture in ARCHITECTURES.items():
            ids = random_ids((2, 12), architecture.vocabulary, seed=3)
            reference = FORWARD(weights_of(name), architecture, ids).logits
            low = dataclasses.replace(architecture, precision="bfloat16")
            out = self.variant(functools.partial(forward, architecture=low))(weights_of(name), token_ids=ids)
            chex.assert_type(out.logits, jnp.float32)
            # Attention's operands stay float32 (jgpt.model.bf16_matmul.attention_dtype); only a bf16 KV state rounds them.
            self.assertEqual(out.cache.keys.dtype, jnp.float32)
            error = float(jnp.max(jnp.abs(out.logits - reference)))
            # bfloat16 keeps 8 mantissa bits: relative rounding 2^-8 of operands of magnitude ~1.
            self.assertLess(error, 0.05 * float(jnp.max(jnp.abs(reference))))
            self.assertGreater(error, 0.0)


@pytest.mark.parametrize("name", ARCHITECTURES)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_changing_token_t_never_changes_earlier_logits(name, data):
    architecture = ARCHITECTURES[name]
    T = architecture.context
    ids = random_ids((1, T), architecture.vocabulary, seed=data.draw(st.integers(0, 1000)))
    t = data.draw(st.integers(0, T - 1))
    changed = ids.at[0, t].set(
        (ids[0, t] + data.draw(st.integers(1, architecture.vocabulary - 1))) % architecture.vocabulary
    )
    before = FORWARD(weights_of(name), architecture, ids).logits
    after = FORWARD(weights_of(name), architecture, changed).logits
    np.testing.assert_array_equal(before[:, :t], after[:, :t])
    assert not np.allclose(before[:, t], after[:, t])


@pytest.mark.parametrize(("name", "unroll"), [("gpt", 1), ("llama", 1), ("llama", True)])
def test_prefill_then_continuation_through_the_cache_equals_one_full_pass(name, unroll):
    architecture = ARCHITECTURES[name]
    B, T, S = 2, architecture.context, architecture.context + 4
    ids = random_ids((B, T), architecture.vocabulary, seed=5)
    full = FORWARD(weights_of(name), architecture, ids, unroll=unroll).logits
    # Garbage in the unwritten slots must stay invisible.
    garbage = jnp.full((architecture.layers, B, architecture.kv_heads, S, architecture.head_dim), 1e3, jnp.float32)
    cache = KVBuffers(keys=garbage, values=-garbage)
    split = 9
    prefix = FORWARD(weights_of(name), architecture, ids[:, :split], cache=cache, unroll=unroll)
    positions = jnp.broadcast_to(jnp.arange(split, T, dtype=jnp.int32), (B, T - split))
    rest = FORWARD(
        weights_of(name), architecture, ids[:, split:], positions=positions, cache=prefix.cache, unroll=unroll
    )
    np.testing.assert_allclose(prefix.logits, full[:, :split], atol=1e-5, rtol=0)
    np.testing.assert_allclose(rest.logits, full[:, split:], atol=1e-5, rtol=0)
    # One token at a time (decode) from the prefix.
    cache = prefix.cache
    for p in range(split, split + 3):
        step = FORWARD(
            weights_of(name), architecture, ids[:, p : p + 1], positions=jnp.full((B, 1), p, jnp.int32), cache=cache
        )
        np.testing.assert_allclose(step.logits[:, 0], full[:, p], atol=1e-5, rtol=0)
        cache = step.cache
    np.testing.assert_allclose(cache.keys[:, :, :, : split + 3], rest.cache.keys[:, :, :, : split + 3], atol=1e-6)


def test_rows_at_different_positions_share_one_cached_call():
    """Rows of a batch may continue from different lengths: each attends to its own slots <= position."""
    architecture, name = LLAMA, "llama"
    ids = random_ids((2, 16), architecture.vocabulary, seed=9)
    full = FORWARD(weights_of(name), architecture, ids).logits
    cache = FORWARD(weights_of(name), architecture, ids[:, :10], cache=KVBuffers.empty(architecture, 2, 16)).cache
    positions = jnp.array([[6], [9]], jnp.int32)
    step = FORWARD(
        weights_of(name), architecture, jnp.take_along_axis(ids, positions, 1), positions=positions, cache=cache
    )
    np.testing.assert_allclose(step.logits[0, 0], full[0, 6], atol=1e-5, rtol=0)
    np.testing.assert_allclose(step.logits[1, 0], full[1, 9], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_observations_name_each_operation_with_layer_and_positions(name):
    architecture = ARCHITECTURES[name]
    ids = random_ids((2, 6), architecture.vocabulary)
    out = FORWARD(weights_of(name), architecture, ids, observe=True)
    records = out.observations.records
    np.testing.assert_array_equal(out.observations.positions, jnp.broadcast_to(jnp.arange(6), (2, 6)))
    assert all(is_admitted(r.operation) for r in records)
    assert {r.layer for r in records} == {None, *range(architecture.layers)}
    by_stage = {(r.stage, r.layer): r.value for r in records}
    np.testing.assert_array_equal(by_stage[("logits", None)], out.logits)
    for layer in range(architecture.layers):
        # Each residual addition is its input stream plus its branch.
        stream = by_stage[("embedding", None)] if layer == 0 else by_stage[("residual2", layer - 1)]
        np.testing.assert_allclose(by_stage[("residual1", layer)], stream + by_stage[("attention", layer)], atol=1e-6)
        weights = by_stage[("attention_weights", layer)]
        chex.assert_shape(weights, (2, 6, architecture.heads, 6))
        np.testing.assert_allclose(jnp.sum(weights, -1), 1.0, atol=1e-5)
        assert float(jnp.max(jnp.triu(weights.transpose(0, 2, 1, 3), k=1))) == 0.0  # nothing from the future


# --- walkthrough --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_walkthrough_stages_are_owned_by_admitted_concepts_and_inspect_real_observations(name):
    architecture = ARCHITECTURES[name]
    stages = walkthrough(architecture).stages
    out = FORWARD(weights_of(name), architecture, random_ids((1, 3), architecture.vocabulary), observe=True)
    observed = {r.stage for r in out.observations.records}
    operations = {r.operation for r in out.observations.records}
    for index, stage in enumerate(stages):
        assert is_admitted(stage.owner), stage.owner
        assert all(is_admitted(concept) for concept in stage.related), stage.related
        assert all(0 <= i < index for i in stage.inputs), (index, stage.inputs)
        assert stage.inspection in observed, stage.inspection
        assert stage.scope in ("input", "block", "output")
    owners = [s.owner for s in stages]
    assert set(owners) == operations  # every operation the pass performs is declared, and nothing else
    # Residual additions keep both branches explicit.
    assert all(len(s.inputs) == 2 for s in stages if s.owner == "ResidualAddition")
    assert walkthrough(architecture).to_json()["stages"][0]["owner"] == owners[0]


def test_logits_at_projects_only_each_rows_chosen_token():
    ids = random_ids((3, 9), GPT.vocabulary, seed=11)
    at = jnp.array([8, 0, 4], jnp.int32)
    full = FORWARD(weights_of("gpt"), GPT, ids).logits
    chosen = FORWARD(weights_of("gpt"), GPT, ids, logits_at=at).logits
    assert chosen.shape == (3, 1, GPT.vocabulary)
    np.testing.assert_allclose(chosen[:, 0], full[jnp.arange(3), at], atol=1e-6, rtol=0)
    with pytest.raises(ApiError, match="logits_at"):
        FORWARD(weights_of("gpt"), GPT, ids, observe=True, logits_at=at)


# --- layer strategy -----------------------------------------------------------------------------------

STRATEGIES = [
    LayerStrategy.unrolled_layers(),
    LayerStrategy.unrolled_layers(output_major=True),
    LayerStrategy.scan(unroll=True),
    LayerStrategy.scan(unroll=2),
]


@pytest.mark.parametrize("name", ARCHITECTURES)
@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
def test_every_layer_strategy_gives_the_rolled_scans_logits_cache_and_observations(name, strategy):
    architecture = ARCHITECTURES[name]
    ids = random_ids((2, 7), architecture.vocabulary, seed=4)
    cache = KVBuffers.empty(architecture, 2, 10)
    scanned = FORWARD(weights_of(name), architecture, ids, cache=cache, observe=True)
    held = strategy.held_weights(weights_of(name))  # as an execution holds them: output-major head and blocks
    run = functools.partial(FORWARD, unroll=strategy.unroll, layer_weights=strategy.layer_weights(held))
    other = run(held, architecture, ids, cache=cache, observe=True)
    # The same operations in the same order; 1e-6 leaves room for XLA fusing them differently.
    for a, b in zip(jax.tree.leaves(scanned), jax.tree.leaves(other)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    assert [(r.stage, r.layer) for r in scanned.observations.records] == [
        (r.stage, r.layer) for r in other.observations.records
    ]


@pytest.mark.parametrize(("backend", "expected"), [
    ("cpu", LayerStrategy.unrolled_layers(output_major=True)), ("gpu", LayerStrategy.scan()), ("tpu", LayerStrategy.scan()),
])  # fmt: skip
def test_the_layer_strategy_is_chosen_by_asking_the_backend(monkeypatch, backend, expected):
    from inference.execution import ModelExecution
    from jgpt.model.kv_state import StateIdentity

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert LayerStrategy.for_backend() == expected
    execution = ModelExecution(weights_of("gpt"), GPT, StateIdentity("c", "t", "float32"))
    assert execution.strategy == expected
    # A scan holds no per-layer view at all: the stacked weights are the one copy.
    assert (execution.layer_weights is None) == (backend != "cpu")


def test_the_per_layer_view_shares_the_stacked_weights_memory_on_cpu():
    weights = weights_of("llama")
    view = per_layer_view(weights)
    assert len(view) == LLAMA.layers
    for name, stacked in weights.block().items():
        stride = stacked.nbytes // LLAMA.layers  # every layer of these widths starts 64-byte aligned
        for index, layer in enumerate(view):
            np.testing.assert_array_equal(layer[name], stacked[index])
            assert layer[name].unsafe_buffer_pointer() == stacked.unsafe_buffer_pointer() + index * stride, name


def test_layer_strategy_refuses_a_meaningless_unroll():
    for bad in (0, -1, 1.5, "split"):
        with pytest.raises(ApiError) as error:
            LayerStrategy.scan(unroll=bad)
        assert error.value.field == "unroll"
    with pytest.raises(ApiError) as error:
        LayerStrategy(per_layer=True, unroll=4)
    assert error.value.field == "unroll"
    with pytest.raises(ApiError) as error:
        LayerStrategy(per_layer=False, output_major=True)
    assert error.value.field == "output_major"


@pytest.mark.parametrize("strategy", [LayerStrategy.unrolled_layers(), LayerStrategy.scan()], ids=str)
def test_the_walkthrough_steps_name_the_operations_of_the_lowered_program(strategy):
    ids = random_ids((1, 4), GPT.vocabulary)
    layers = strategy.layer_weights(weights_of("gpt"))
    lowered = FORWARD.lower(weights_of("gpt"), GPT, ids, cache=KVBuffers.empty(GPT, 1, 8), layer_weights=layers)
    text = lowered.as_text(debug_info=True)  # operations carry their scope path in their locations
    for operation in ("embed/jit(_take)", "block/attention/dot_general", "block/attention/scatter",
                      "block/feed_forward/dot_general", "head/dot_general"):  # fmt: skip
        assert f'{operation}"' in text, operation
