"""Inference: cached decode against full-prefix recompute, KVState immutability, prefix reuse, stopping, refusals."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.execution import (
    CAPACITY_STEP,
    MIN_BUCKET,
    ModelExecution,
    bucket,
    capacity_bucket,
    decode,
    prefill,
    window_bucket,
)
from inference.generation import generate, generate_stepwise
from inference.policy import GenerationPolicy, InferenceRequest
from jgpt.foundation.errors import ApiError
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.kv_state import KVState, StateIdentity
from jgpt.model.layer_strategy import stored_layout
from jgpt.model.transformer import forward
from jgpt.model.weights import initialize
from jgpt.tokenizers.framing import TURN_END_ID

TOLERANCE = 1e-5  # float32 max abs logit error, cached vs full-prefix recompute
IDENTITY = StateIdentity("c" * 64, "t" * 64, "float32")
ARCHITECTURES = {
    "gpt": ModelArchitecture(vocabulary=260, width=32, ffn=64, context=48, layers=2, heads=4),
    "llama": LlamaArchitecture(vocabulary=260, width=32, ffn=48, context=48, layers=2, heads=4, kv_heads=2),
}
PROMPTS = [[257, 72, 105, 33, 259, 258], [257, 7, 259, 258], list(range(1, 21))]


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def execution(request) -> ModelExecution:
    architecture = ARCHITECTURES[request.param]
    weights, _ = initialize(architecture, seed=3)
    return ModelExecution(weights, architecture, IDENTITY)


@pytest.fixture(scope="module")
def gpt() -> ModelExecution:
    architecture = ARCHITECTURES["gpt"]
    return ModelExecution(initialize(architecture, seed=5)[0], architecture, IDENTITY)


@functools.partial(jax.jit, static_argnames="architecture")
def _full_logits(weights, architecture, ids):
    return forward(weights, architecture, ids).logits[0]


def recompute(execution: ModelExecution, sequence) -> np.ndarray:
    """The independent reference: the model over the whole sequence, no cache; logits after its last id.

    The sequence is right-padded to the context, which causal attention never lets earlier positions see.
    """
    ids = np.zeros((1, execution.architecture.context), np.int32)
    ids[0, : len(sequence)] = sequence
    return np.asarray(_full_logits(execution.weights, execution.architecture, jnp.asarray(ids))[len(sequence) - 1])


def requests(budgets, prompts=PROMPTS):
    return [InferenceRequest(f"r{i}", p, GenerationPolicy(n)) for i, (p, n) in enumerate(zip(prompts, budgets))]


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_cached_decode_matches_full_prefix_recompute_at_every_step(execution, batched):
    batch = requests([7, 4, 9]) if batched else requests([7])
    generation = generate(execution, batch, reference=True, scores=True)
    for request, response in zip(batch, generation.responses):
        sequence = list(request.prompt_ids)
        for selection, computation in zip(response.selections, response.computations):
            error = np.max(np.abs(recompute(execution, sequence) - selection.raw_logits))
            assert error <= TOLERANCE
            assert computation.reference_max_abs_error <= TOLERANCE
            assert selection.selected_id == int(np.argmax(selection.raw_logits))
            assert np.isclose(selection.probabilities.sum(), 1.0, atol=1e-5)
            assert int(np.argmax(selection.probabilities)) == selection.selected_id
            sequence.append(selection.selected_id)
        assert response.outcome.selected_tokens == request.generation.max_new_tokens


def test_loop_and_step_timing_select_the_same_ids(gpt):
    batch = requests([5, 11, 3])
    loop = generate(gpt, batch)
    step = generate_stepwise(gpt, batch)
    assert [r.output_ids for r in loop.responses] == [r.output_ids for r in step.responses]
    assert loop.state.prefixes() == step.state.prefixes()
    assert [c.measurement_boundary for c in step.responses[0].computations] != [
        c.measurement_boundary for c in loop.responses[0].computations
    ]


def test_a_snapshot_continued_twice_stays_valid_and_both_continuations_are_exact(execution):
    prompt = PROMPTS[0]
    _, snapshot = prefill(execution.weights, execution.architecture, prompt, identity=IDENTITY)
    before = jax.tree.map(np.array, snapshot)
    first_logits, first = decode(execution.weights, execution.architecture, snapshot, 65)
    second_logits, second = decode(execution.weights, execution.architecture, snapshot, 66)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, snapshot), before)
    assert snapshot.prefixes() == (tuple(prompt),)
    assert first.prefixes() == (tuple(prompt) + (65,),) and second.prefixes() == (tuple(prompt) + (66,),)
    assert np.max(np.abs(first_logits[0] - recompute(execution, prompt + [65]))) <= TOLERANCE
    assert np.max(np.abs(second_logits[0] - recompute(execution, prompt + [66]))) <= TOLERANCE
    # Continuing one branch further does not disturb the other.
    third_logits, _ = decode(execution.weights, execution.architecture, first, 67)
    again_logits, _ = decode(execution.weights, execution.architecture, second, 67)
    assert np.max(np.abs(third_logits[0] - recompute(execution, prompt + [65, 67]))) <= TOLERANCE
    assert np.max(np.abs(again_logits[0] - recompute(execution, prompt + [66, 67]))) <= TOLERANCE


def test_kv_state_is_a_pytree_whose_identity_is_static():
    state = KVState.empty(IDENTITY, layers=2, batch=1, capacity=16, kv_heads=2, head_dim=4)
    leaves, tree = jax.tree.flatten(state)
    assert len(leaves) == 4
    rebuilt = jax.tree.unflatten(tree, leaves)
    assert rebuilt.identity == IDENTITY
    moved = jax.jit(lambda s: s.replace(lengths=s.lengths + 1))(state)
    assert moved.identity == IDENTITY and int(moved.lengths[0]) == 1 and int(state.lengths[0]) == 0


def test_kv_state_channels_are_the_key_and_value_projections_by_position(gpt):
    """`channels()` reads the head-major buffers back as [layers, B, S, kv_width] in projection order:
    layer 0's keys and values are ln1(token + position vectors) times the key and value weights."""
    prompt = PROMPTS[0]
    _, state = gpt.prefill([prompt])
    keys, values = state.channels()
    a, w = gpt.architecture, stored_layout(gpt.weights)  # the execution holds its projections output-major on CPU
    assert keys.shape == values.shape == (a.layers, 1, state.capacity, a.kv_width)
    x = np.asarray(w.token_embedding)[prompt] + np.asarray(w.position_embedding)[: len(prompt)]
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + a.epsilon)
    h = x * np.asarray(w.ln1_scale[0]) + np.asarray(w.ln1_bias[0])
    for got, name in ((keys, "key"), (values, "value")):
        expected = h @ np.asarray(getattr(w, name)[0]) + np.asarray(getattr(w, f"{name}_bias")[0])
        np.testing.assert_allclose(got[0, 0, : len(prompt)], expected, atol=1e-5, rtol=0)


def test_prefix_reuse_processes_only_new_positions_and_matches_a_fresh_run(execution):
    first = generate(execution, requests([6]))
    (response,) = first.responses
    follow_up = list(response.prompt_ids) + list(response.output_ids) + [259, 257, 104, 259, 258]
    request = InferenceRequest("follow-up", follow_up, GenerationPolicy(5))
    reused = generate(execution, [request], first.state, scores=True, reference=True)
    fresh = generate(execution, [request], scores=True)
    (reused_response,), (fresh_response,) = reused.responses, fresh.responses
    prefill_work = reused_response.computations[0]
    held = len(response.prompt_ids) + len(response.output_ids) - 1  # the last selected id was never processed
    assert prefill_work.reused_positions == held
    assert prefill_work.processed_positions == len(follow_up) - held
    assert prefill_work.matmul_flops < prefill_work.reference_matmul_flops
    assert fresh_response.computations[0].reused_positions == 0
    assert reused_response.output_ids == fresh_response.output_ids
    for a, b in zip(reused_response.selections, fresh_response.selections):
        assert np.max(np.abs(a.raw_logits - b.raw_logits)) <= TOLERANCE
    assert max(c.reference_max_abs_error for c in reused_response.computations) <= TOLERANCE


def test_a_state_that_is_not_a_prefix_is_not_reused(gpt):
    first = generate(gpt, requests([3]))
    other = InferenceRequest("other", [258, 1, 2, 3], GenerationPolicy(2))
    (response,) = generate(gpt, [other], first.state).responses
    assert response.computations[0].reused_positions == 0


def test_rows_stop_at_their_own_budget_and_at_context_capacity(gpt):
    context = gpt.architecture.context
    near_end = list(range(1, context - 2))  # room to process two more positions
    batch = requests([2, 9, 20], prompts=[PROMPTS[0], PROMPTS[1], near_end])
    responses = generate(gpt, batch).responses
    assert [r.outcome.selected_tokens for r in responses[:2]] == [2, 9]
    assert [r.outcome.stop_reason for r in responses] == ["max_new_tokens", "max_new_tokens", "context"]
    ended = responses[2].outcome
    assert len(near_end) + ended.selected_tokens == context + 1  # the last selection needs no position
    assert ended.unused_budget == 20 - ended.selected_tokens and not ended.complete


def test_turn_end_stops_the_row_and_is_selected_but_not_published(gpt):
    lm_bias = jnp.zeros_like(gpt.weights.lm_bias).at[TURN_END_ID].set(1e4)
    ending = dataclasses.replace(gpt, weights=gpt.weights.replace(lm_bias=lm_bias))
    for run in (generate, generate_stepwise):
        (response,) = run(ending, requests([8])).responses
        assert response.output_ids == (TURN_END_ID,) and response.published_ids == ()
        outcome = response.outcome
        assert (outcome.selected_tokens, outcome.published_tokens, outcome.unused_budget) == (1, 0, 7)
        assert outcome.stop_reason == "turn_end" and outcome.complete


def test_observing_a_step_records_every_operation_of_that_step(gpt):
    (response,) = generate_stepwise(gpt, requests([4]), observe_step=2).responses
    observations = response.observations
    operations = {o.operation for o in observations}
    assert {"Embedding", "PositionEncoding", "Normalization", "Attention", "ResidualAddition", "FeedForward",
            "OutputProjection"} <= operations  # fmt: skip
    assert {o.step for o in observations} == {2}
    position = len(PROMPTS[0]) + 1
    assert all(o.positions == (position,) for o in observations)
    ids = {o.id for o in observations}
    assert all(set(o.inputs) <= ids for o in observations)
    logits = next(o for o in observations if o.operation == "OutputProjection")
    assert int(np.argmax(logits.values[0])) == response.output_ids[2]


@pytest.mark.parametrize(
    "prompt, field",
    [([], "prompt_ids"), (list(range(49)), "prompt_ids"), ([1, 2, 260], "prompt_ids[2]"), ([1, -1], "prompt_ids[1]")],
    ids=["empty", "longer-than-context", "unknown-id", "negative-id"],
)
def test_bad_prompts_are_refused_naming_the_field(gpt, prompt, field):
    with pytest.raises(ApiError) as refused:
        generate(gpt, [InferenceRequest("bad", prompt, GenerationPolicy(3))])
    assert refused.value.field == field


@pytest.mark.parametrize("field", ["checkpoint_sha256", "tokenizer_sha256"])
def test_a_state_from_another_checkpoint_or_tokenizer_is_refused(gpt, field):
    _, state = gpt.prefill([PROMPTS[0]])
    foreign = state.replace(**{field: "f" * 64})
    with pytest.raises(ApiError, match=field) as refused:
        gpt.decode(foreign, [5])
    assert refused.value.field == f"state.{field}"
    with pytest.raises(ApiError, match=field):
        generate(gpt, requests([3]), foreign)


def test_decode_refuses_unknown_ids_and_a_full_context(gpt):
    _, state = gpt.prefill([list(range(1, 49))])
    with pytest.raises(ApiError, match="token_id"):
        gpt.decode(state, [260])
    with pytest.raises(ApiError, match="whole context"):
        gpt.decode(state, [5])
    with pytest.raises(ApiError, match="max_new_tokens"):
        GenerationPolicy(0)
    with pytest.raises(ApiError, match="observe"):
        generate_stepwise(gpt, requests([3]), observe_step=3)
    with pytest.raises(ApiError, match="empty"):
        prefill(gpt.weights, gpt.architecture, [], identity=IDENTITY)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 4096), limit=st.integers(1, 4096))
def test_buckets_hold_what_fits_and_take_few_values(n, limit):
    for size in (bucket(n, limit), capacity_bucket(n, limit)):
        assert size <= limit and (size >= n or size == limit)
    assert bucket(n, limit) == limit or bucket(n, limit) & (bucket(n, limit) - 1) == 0
    capacity = capacity_bucket(n, limit)
    assert capacity in (limit, bucket(n, limit)) or capacity % CAPACITY_STEP == 0
    assert capacity < n + CAPACITY_STEP
    window = window_bucket(n, limit)
    assert window <= limit and (window >= n or window == limit)
    assert window in (limit, MIN_BUCKET) or 4 * window <= 5 * n  # at most a quarter of padding past n
    assert window == limit or window % max(1, 1 << (window.bit_length() - 3)) == 0  # four widths per doubling
