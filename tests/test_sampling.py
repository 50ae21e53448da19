"""Seeded sampling: the filtered distribution (boundaries, a chi-square test of 10,000 draws), reproducibility
alone and in a batch, loop and step timing, temperature 0 as greedy, evidence, policy and workload fields."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from inference.execution import ModelExecution
from inference.generation import generate, generate_stepwise
from inference.policy import GenerationPolicy, InferenceRequest
from inference.sampling import SelectionRule, filtered_logits, select
from jgpt.foundation.errors import ApiError
from jgpt.model.architecture import LlamaArchitecture
from jgpt.model.kv_state import StateIdentity
from jgpt.model.weights import initialize

SIGNIFICANCE = 1e-3  # the chi-square test fails when draws this unlikely under the filtered distribution occur
DRAWS = 10_000
ARCHITECTURE = LlamaArchitecture(vocabulary=260, width=32, ffn=48, context=64, layers=2, heads=4, kv_heads=2)
PROMPTS = [[257, 72, 105, 33, 259, 258], [257, 7, 259, 258], list(range(1, 21))]


@pytest.fixture(scope="module")
def model() -> ModelExecution:
    return ModelExecution(
        initialize(ARCHITECTURE, seed=3)[0], ARCHITECTURE, StateIdentity("c" * 64, "t" * 64, "float32")
    )


def sample(request_id="s", prompt=PROMPTS[0], budget=12, **policy):
    return InferenceRequest(request_id, prompt, GenerationPolicy(budget, "sample", **policy))


def kept(logits, temperature=1.0, top_k=0, top_p=1.0) -> set[int]:
    z = filtered_logits(jnp.asarray(logits, jnp.float32), temperature, top_k, top_p)
    return set(np.flatnonzero(np.isfinite(np.asarray(z))).tolist())


def reference_distribution(logits, temperature, top_k, top_p) -> np.ndarray:
    """The filtered distribution in float64 numpy: softmax(logits / T), the top_k largest (ties kept), then
    the most probable ids up to a mass of top_p (ties with the last one kept), renormalized."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    if top_k:
        p[z < np.sort(z)[::-1][top_k - 1]] = 0
    p /= p.sum()
    ranked = np.sort(p)[::-1]
    last = ranked[np.searchsorted(np.cumsum(ranked), top_p - 1e-6)]
    p[p < last] = 0
    return p / p.sum()


def test_top_k_keeps_ties_at_its_boundary():
    logits = [3.0, 2.0, 2.0, 1.0, 0.0]
    assert kept(logits, top_k=1) == {0}
    assert kept(logits, top_k=2) == {0, 1, 2}  # the second value is tied: both ids are kept
    assert kept(logits, top_k=4) == {0, 1, 2, 3}
    assert kept(logits, top_k=0) == kept(logits, top_k=99) == {0, 1, 2, 3, 4}


def test_top_p_exactly_at_a_cumulative_boundary_keeps_ids_up_to_it():
    logits = np.log([0.5, 0.25, 0.125, 0.125, 1e-9])
    assert kept(logits, top_p=0.5) == {0}
    assert kept(logits, top_p=0.75) == {0, 1}  # 0.5 + 0.25 reaches 0.75: nothing more
    assert kept(logits, top_p=0.76) == {0, 1, 2, 3}  # one 0.125 is needed; its tie comes too
    assert kept(logits, top_p=0.01) == {0}
    assert kept(logits, top_p=1.0) == {0, 1, 2, 3, 4}  # 1 is no limit, the 1e-9 id included
    assert kept(logits, top_k=3, top_p=0.7) == {0, 1}  # top-p applies to the top-k distribution


def test_ten_thousand_draws_follow_the_filtered_distribution():
    logits = np.random.default_rng(0).normal(0, 2, 260).astype(np.float32)
    temperature, top_k, top_p = 0.8, 20, 0.9
    expected = reference_distribution(logits, temperature, top_k, top_p)
    rule = SelectionRule(
        sample=jnp.ones(DRAWS, bool), temperature=jnp.full(DRAWS, temperature, jnp.float32),
        top_k=jnp.full(DRAWS, top_k, jnp.int32), top_p=jnp.full(DRAWS, top_p, jnp.float32),
        seed=jnp.arange(DRAWS, dtype=jnp.int32), stream=jnp.zeros(DRAWS, jnp.int32),
    )  # fmt: skip
    draws = np.asarray(
        jax.jit(select)(jnp.broadcast_to(jnp.asarray(logits), (DRAWS, 260)), rule, jnp.zeros(DRAWS, jnp.int32))
    )
    counts = np.bincount(draws, minlength=260)
    assert counts[expected == 0].sum() == 0  # nothing outside the filter is ever drawn
    support = np.flatnonzero(expected > 0)
    assert 2 < len(support) < top_k  # both filters bite
    assert chi_square_p_value(counts, expected) > SIGNIFICANCE


def chi_square_p_value(counts: np.ndarray, expected: np.ndarray) -> float:
    """The chi-square test's p-value of `counts` drawn from the distribution `expected` (over its support); ids
    expected fewer than 5 times are pooled, as the test's approximation requires."""
    support = np.flatnonzero(expected > 0)
    draws = counts.sum()
    small = expected[support] * draws < 5
    observed = np.append(counts[support][~small], counts[support][small].sum())
    predicted = np.append(expected[support][~small], expected[support][small].sum()) * draws
    observed, predicted = observed[predicted > 0], predicted[predicted > 0]
    statistic = ((observed - predicted) ** 2 / predicted).sum()
    return float(stats.chi2.sf(statistic, len(observed) - 1))


def test_a_request_draws_the_same_ids_alone_in_a_batch_and_step_by_step(model):
    request = sample("me", seed=7)
    alone = generate(model, [request]).responses[0]
    assert generate(model, [request]).responses[0].output_ids == alone.output_ids
    batch = [InferenceRequest("g", PROMPTS[1], GenerationPolicy(5)), sample("other", PROMPTS[2], 9, seed=7), request]
    batched = generate(model, batch).responses
    assert batched[2].output_ids == alone.output_ids
    assert batched[0].output_ids == generate(model, [batch[0]]).responses[0].output_ids  # greedy rows stay greedy
    streamed = []
    stepwise = generate_stepwise(model, [request], on_select=lambda row, token: streamed.append(token)).responses[0]
    assert stepwise.output_ids == alone.output_ids == tuple(streamed)
    assert generate(model, [sample("me", seed=8)]).responses[0].output_ids != alone.output_ids
    assert generate(model, [sample("you", seed=7)]).responses[0].output_ids != alone.output_ids


def test_temperature_zero_is_greedy_and_near_zero_draws_greedy_ids(model):
    greedy = generate(model, [InferenceRequest("g", PROMPTS[2], GenerationPolicy(12))]).responses[0].output_ids
    assert generate(model, [sample("g", PROMPTS[2], temperature=0.0)]).responses[0].output_ids == greedy
    assert generate(model, [sample("g", PROMPTS[2], temperature=1e-4)]).responses[0].output_ids == greedy
    assert generate(model, [sample("g", PROMPTS[2], temperature=1.0)]).responses[0].output_ids != greedy


def test_a_sampled_selection_records_its_candidates_and_key(model):
    response = generate(model, [sample("ev", seed=5, top_k=3)], scores=True).responses[0]
    for step, selection in enumerate(response.selections):
        assert selection.rule == "sample" and selection.rng_state["seed"] == 5 and selection.rng_state["step"] == step
        ids = [i for i, _ in selection.candidates]
        probabilities = [p for _, p in selection.candidates]
        assert len(ids) == 3 and selection.selected_id in ids  # top_k = 3: the whole filtered distribution
        assert probabilities == sorted(probabilities, reverse=True) and abs(sum(probabilities) - 1) < 1e-5
        assert ids[0] == int(np.argmax(selection.raw_logits))
        assert selection.to_json()["candidates"][0] == [ids[0], probabilities[0]]


def test_policy_sampling_fields_are_checked_and_read_from_workloads():
    from inference.recorded_computations import read_workload
    from jgpt.tokenizers.tokenizer import Tokenizer

    assert GenerationPolicy(4).to_json() == {
        "max_new_tokens": 4,
        "selection": "greedy",
        "stopping": "turn_end_or_budget",
    }
    for bad in ({"temperature": 0.5}, {"selection": "sample", "top_p": 0.0}, {"selection": "sample", "top_k": -1},
                {"selection": "sample", "seed": 2**31}, {"selection": "sample", "temperature": float("inf")},
                {"selection": "beam"}):  # fmt: skip
        with pytest.raises(ApiError):
            GenerationPolicy(4, **bad)
    document = {
        "kind": "requests",
        "requests": [
            {
                "request_id": "a",
                "arrival_us": 0,
                "request": {
                    "text": "hi",
                    "generation": {
                        "max_new_tokens": 3,
                        "selection": "sample",
                        "temperature": 0.7,
                        "top_p": 0.9,
                        "seed": 11,
                    },
                },
            }
        ],
    }
    (request,) = read_workload(document, Tokenizer.bytes_only())
    assert request.generation == GenerationPolicy(3, "sample", temperature=0.7, top_p=0.9, seed=11)
    document["requests"][0]["request"]["generation"]["top_p"] = 2
    with pytest.raises(ApiError, match="top_p"):
        read_workload(document, Tokenizer.bytes_only())


@pytest.mark.parametrize("policy", ["continuous_batching", "serialized"])
def test_the_engine_draws_what_generate_draws(model, policy):
    from inference.engine import InferenceEngine
    from kvsim.system import parse_system

    requests = [sample("e0", PROMPTS[0], 9, seed=3), sample("e1", PROMPTS[2], 6, seed=3, top_k=8),
                InferenceRequest("e2", PROMPTS[1], GenerationPolicy(7)), sample("e3", PROMPTS[1], 5, top_p=0.5)]  # fmt: skip
    system = parse_system({
        "max_requests": 8, "max_new_tokens_cap": 64, "scheduling": {"max_active_requests": 4, "policy": policy},
        "kv_cache": {"device_kv_bytes": 1 << 30, "host_kv_bytes": 0, "retention_policy": "none"},
        "transfer": {"link_bytes_per_us": 1000, "link_latency_us": 10},
        "compute_service": {"compute_flops_per_us": 2000000, "memory_bytes_per_us": 20000},
    })  # fmt: skip
    served = InferenceEngine(model, system).serve(requests, as_fast_as_possible=True)
    for request, result in zip(requests, served.requests):
        assert result.output_ids == generate(model, [request]).responses[0].output_ids
