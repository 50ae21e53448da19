"""Speculative decoding: ids equal plain greedy's exactly, rollback is a KVState value, evidence, refusals;
speculative sampling preserves the target's filtered distribution."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_sampling import DRAWS, SIGNIFICANCE, chi_square_p_value, reference_distribution

from inference.execution import ModelExecution
from inference.generation import generate
from inference.policy import GenerationPolicy, InferenceRequest
from inference.sampling import SelectionRule, filtered_logits, select, step_key
from inference.speculative import PromptLookup, generate_speculative, lookup, speculative_sample, verify_window
from jgpt.foundation.errors import ApiError
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.kv_state import StateIdentity
from jgpt.model.transformer import forward
from jgpt.model.weights import initialize

TOLERANCE = 1e-5  # float32 max abs logit difference between two cached computations of the same prefix
TARGET = StateIdentity("c" * 64, "t" * 64, "float32")
ARCHITECTURE = LlamaArchitecture(vocabulary=260, width=32, ffn=48, context=64, layers=2, heads=4, kv_heads=2)
PROMPTS = [[257, 72, 105, 33, 259, 258], [257, 7, 259, 258], list(range(1, 21))]
# The shipped draft (1 layer, width 64) agrees with the chat model on 30-70% of the ids it drafts for
# held-out exercises, by K (bench/speculative.py); an unrelated model agrees on almost none.
MIN_CHAT_ACCEPTANCE = 0.2


def execution(seed: int, identity: StateIdentity = TARGET, architecture=ARCHITECTURE, scale: float | None = None):
    weights, _ = initialize(architecture, seed=seed)
    if scale is not None:  # the target's weights, perturbed: a draft that agrees with it part of the time
        target, _ = initialize(architecture, seed=3)
        weights = jax.tree.map(lambda t, w: t + scale * w, target, weights)
    return ModelExecution(weights, architecture, identity)


def draft_identity(name: str) -> StateIdentity:
    return StateIdentity(name * 64, "t" * 64, "float32")


def requests(budgets, prompts=PROMPTS):
    return [InferenceRequest(f"r{i}", p, GenerationPolicy(n)) for i, (p, n) in enumerate(zip(prompts, budgets))]


def assert_same_as_greedy(target, draft, batch, k):
    greedy = generate(target, batch)
    speculative = generate_speculative(target, draft, batch, k)
    for plain, fast in zip(greedy.responses, speculative.responses):
        assert fast.output_ids == plain.output_ids
        assert fast.outcome == plain.outcome
        # Each round's accepted ids and the target's own id are the output ids that round selected.
        rebuilt = [fast.output_ids[0]]
        for r in fast.speculation.rounds:
            assert r.step == len(rebuilt) and r.drafted_ids[: len(r.accepted_ids)] == r.accepted_ids
            assert r.accepted_ids + r.rejected_ids == r.drafted_ids and len(r.drafted_ids) == k
            rebuilt += [*r.accepted_ids, *([] if r.target_id is None else [r.target_id])]
        assert tuple(rebuilt) == fast.output_ids
    # The kept state holds what greedy's holds: every row's prompt and selected ids but the last.
    assert speculative.state.prefixes() == greedy.state.prefixes()
    return speculative


def test_speculative_ids_equal_greedy_batched_rows_with_different_acceptance():
    target = execution(3)
    drafts = {"same weights": execution(3, draft_identity("a")), "perturbed": execution(9, draft_identity("b"), scale=0.5),
              "unrelated": execution(4, draft_identity("d"))}  # fmt: skip
    rates = {}
    for name, draft in drafts.items():
        for k in (1, 4):
            run = assert_same_as_greedy(target, draft, requests([30, 9, 25]), k)
            rates[name, k] = [r.speculation.acceptance_rate for r in run.responses]
    assert min(rates["same weights", 4]) > 0.8  # only a stop inside a round leaves drafts unselected
    assert max(rates["unrelated", 4]) < 0.5
    perturbed = rates["perturbed", 4]
    assert 0 < min(perturbed) < 1 and len(set(perturbed)) > 1, perturbed  # rows accept differently in one batch


def test_prompt_lookup_ids_equal_greedy_and_it_accepts_a_repeating_reply():
    """The random target's greedy replies cycle (period 6): once a cycle has passed, two-id matches draft it."""
    run = assert_same_as_greedy(execution(3), PromptLookup(), requests([30, 9, 25]), 3)
    rates = [r.speculation.acceptance_rate for r in run.responses]
    assert rates[0] > 0.3 and rates[2] > 0.2, rates
    assert all(r.speculation.draft_checkpoint_sha256 is None and r.speculation.draft_prefill_wall_time_us == 0
               for r in run.responses)  # fmt: skip
    assert_same_as_greedy(execution(3), PromptLookup(ngram=1), requests([20, 3, 40]), 1)


def test_lookup_drafts_what_followed_the_latest_longest_match():
    ids = jnp.asarray([[1, 2, 3, 9, 1, 2, 0, 0], [5, 6, 5, 7, 0, 0, 0, 0]], jnp.int32)
    found, matched = lookup(ids, jnp.asarray([6, 4]), jnp.asarray([3, 5]), 3, 3, 99)
    # Row 0 is 1 2 3 9 1 2 [3]: [1 2 3] ended at slot 2. Row 1 is 5 6 5 7 [5]: 5 last occurred at slot 2,
    # and what follows it runs into the row's last id and then past it (filler).
    assert found.tolist() == [[9, 1, 2], [7, 5, 99]] and matched.tolist() == [3, 1]
    found, matched = lookup(ids, jnp.asarray([6, 4]), jnp.asarray([8, 8]), 2, 3, 99)
    assert found.tolist() == [[99, 99], [99, 99]] and matched.tolist() == [0, 0]


def test_speculative_ids_equal_greedy_with_a_stop_inside_an_accepted_round():
    target = execution(3)
    plain = generate(target, requests([20])).responses[0].output_ids
    # With k = 4 and a draft that always agrees, rounds select ids 1-5, 6-10, ...: the target's own id is
    # every fifth. An id greedy selects first as one of a round's first three drafts becomes the end id: an
    # accepted draft then stops the row, and the drafts after it are not selected.
    stop_at = next(i for i in range(1, 20) if plain[i] not in plain[:i] and i % 5 in (1, 2, 3))
    end = dataclasses.replace(target, turn_end_id=plain[stop_at])
    draft = dataclasses.replace(execution(3, draft_identity("a")), turn_end_id=plain[stop_at])
    run = assert_same_as_greedy(end, draft, requests([20, 3, 40]), 4)
    first = run.responses[0]
    assert first.output_ids == plain[: stop_at + 1] and first.outcome.stop_reason == "turn_end"
    last_round = first.speculation.rounds[-1]
    assert last_round.target_id is None and last_round.accepted_ids[-1] == plain[stop_at] and last_round.rejected_ids


def test_speculative_ids_equal_greedy_on_a_gpt_architecture_and_at_the_context_limit():
    architecture = ModelArchitecture(vocabulary=260, width=32, ffn=64, context=32, layers=2, heads=4)
    target = execution(5, architecture=architecture)
    draft = execution(
        5, draft_identity("g"), ModelArchitecture(vocabulary=260, width=32, ffn=64, context=32, layers=1, heads=4)
    )
    run = assert_same_as_greedy(target, draft, requests([40, 8], [list(range(1, 21)), [257, 7, 259, 258]]), 3)
    assert run.responses[0].outcome.stop_reason == "context"


def test_speculative_ids_equal_greedy_on_an_imported_hugging_face_model(tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from jgpt.artifacts.hf_import import convert

    executions = []
    for layers, seed in ((3, 0), (1, 1)):
        torch.manual_seed(seed)
        GPT2LMHeadModel(
            GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=300, n_positions=64)
        ).save_pretrained(tmp_path / str(layers))
        architecture, weights, _ = convert(tmp_path / str(layers))
        executions.append(ModelExecution(jax.tree.map(jnp.asarray, weights), architecture,
                                         StateIdentity(str(layers) * 64, "h" * 64, "float32"), -1))  # fmt: skip
    assert_same_as_greedy(*executions, requests([12, 7], [[5, 6, 7, 8], [290, 1]]), 2)


def test_rollback_is_the_verified_state_with_a_shorter_length():
    """The state a round keeps is the verify forward's value with `lengths` rewound: continuing it gives
    the logits of a state that only ever processed the accepted ids, and the caller's state is untouched."""
    target = execution(3)
    prompt, drafted = [257, 72, 105, 33], [40, 41, 42, 43]
    _, before = target.prefill([prompt], capacity=16)
    kept_keys = np.asarray(before.keys).copy()
    _, verified = verify_window(target.weights, target.layer_weights, target.architecture, before,
                                jnp.asarray([drafted]), target.scan_unroll)  # fmt: skip
    rolled_back = verified.replace(lengths=before.lengths + 2)  # two of four accepted
    np.testing.assert_array_equal(np.asarray(before.keys), kept_keys)
    assert before.prefixes() == (tuple(prompt),) and rolled_back.prefixes() == ((*prompt, 40, 41),)
    _, fresh = target.prefill([[*prompt, 40, 41]], capacity=16)
    continued, _ = target.decode(rolled_back, [50])
    reference, _ = target.decode(fresh, [50])
    assert np.max(np.abs(np.asarray(continued) - np.asarray(reference))) < TOLERANCE


def test_speculative_refuses_bad_drafts_and_k():
    target = execution(3)
    with pytest.raises(ApiError, match="speculate"):
        generate_speculative(target, execution(3, draft_identity("a")), requests([4]), 0)
    with pytest.raises(ApiError, match="tokenizer"):
        generate_speculative(target, execution(3, StateIdentity("a" * 64, "x" * 64, "float32")), requests([4]), 2)
    other = ModelArchitecture(vocabulary=300, width=32, ffn=64, context=64, layers=1, heads=4)
    with pytest.raises(ApiError, match="vocabulary"):
        generate_speculative(target, execution(3, draft_identity("a"), other), requests([4]), 2)


def sampled(budget, prompt=PROMPTS[2], request_id="s", **policy):
    return InferenceRequest(request_id, prompt, GenerationPolicy(budget, "sample", **policy))


def test_speculative_sampling_draws_follow_the_targets_filtered_distribution():
    """10,000 rounds (seeds 0..9999) at one step: the round's first id, the draft's draw when accepted and the
    residual's otherwise, follows the target's filtered distribution (chi-square at significance 1e-3, against
    a float64 numpy computation); the draft's own distribution differs, and both branches are taken."""
    target, draft = execution(3), execution(9, draft_identity("b"), scale=0.5)
    temperature, top_k, top_p = 0.8, 20, 0.9
    ids = jnp.asarray([PROMPTS[2]], jnp.int32)
    target_logits = forward(target.weights, ARCHITECTURE, ids).logits[0, -1] * 10  # sharpened: top-p keeps 16 ids
    draft_logits = forward(draft.weights, ARCHITECTURE, ids).logits[0, -1] * 10
    rule = SelectionRule(
        sample=jnp.ones(DRAWS, bool), temperature=jnp.full(DRAWS, temperature, jnp.float32),
        top_k=jnp.full(DRAWS, top_k, jnp.int32), top_p=jnp.full(DRAWS, top_p, jnp.float32),
        seed=jnp.arange(DRAWS, dtype=jnp.int32), stream=jnp.zeros(DRAWS, jnp.int32),
    )  # fmt: skip

    @jax.jit
    def rounds(target_logits, draft_logits):
        drafts = jnp.broadcast_to(draft_logits, (DRAWS, 260))
        drafted = select(drafts, rule, jnp.zeros(DRAWS, jnp.int32))  # the draft's draw at output index 0
        q = jax.nn.softmax(jax.vmap(filtered_logits)(drafts, rule.temperature, rule.top_k, rule.top_p))
        p = filtered_logits(target_logits, temperature, top_k, top_p)
        keys = jax.vmap(lambda seed: jax.vmap(lambda i: step_key(seed, 0, i))(jnp.arange(2)))(rule.seed)
        window = jnp.broadcast_to(jnp.stack([p, p]), (DRAWS, 2, 260))  # the bonus position's logits: any
        return jax.vmap(speculative_sample)(window, q[:, None], drafted[:, None], keys)

    accepted, chosen = rounds(target_logits, draft_logits)
    expected = reference_distribution(np.asarray(target_logits), temperature, top_k, top_p)
    proposal = reference_distribution(np.asarray(draft_logits), temperature, top_k, top_p)
    assert 0.5 * np.abs(expected - proposal).sum() > 0.5  # the draft proposes from another distribution
    assert 0.1 < float(np.mean(np.asarray(accepted))) < 0.9  # acceptance and resampling both happen
    counts = np.bincount(np.asarray(chosen[:, 0]), minlength=260)
    assert counts[expected == 0].sum() == 0  # nothing outside the target's filter is ever selected
    assert chi_square_p_value(counts, expected) > SIGNIFICANCE


def test_speculative_sampling_with_the_targets_weights_draws_plain_samplings_ids():
    """A draft with the target's weights proposes from p itself: every draft is accepted, and each id is the
    one plain sampling draws with the same key, alone or in a batch beside greedy and other sampled rows."""
    target = execution(3)
    draft = execution(3, draft_identity("a"))
    batch = [requests([9])[0], sampled(10, PROMPTS[0], "other", seed=7), sampled(14, seed=7, temperature=0.8, top_k=30)]
    batched = generate_speculative(target, draft, batch, 3).responses
    alone = [generate(target, [request]).responses[0] for request in batch]  # plain decoding, each request alone
    assert [r.output_ids for r in batched] == [r.output_ids for r in alone]  # the greedy row stays greedy
    assert batched[1].output_ids != alone[2].output_ids[: len(batched[1].output_ids)]  # another request draws otherwise
    assert batched[2].selections[1].rule == "sample" and batched[2].selections[1].rng_state["step"] == 1
    assert min(r.speculation.acceptance_rate for r in batched) > 0.6  # only a stop inside a round leaves drafts


@pytest.mark.parametrize("temperature", [0.0, 1e-4])
def test_speculative_sampling_as_temperature_goes_to_zero_selects_greedys_ids(temperature):
    target = execution(3)
    greedy = generate(target, requests([20, 20, 20])).responses
    for draft in (execution(9, draft_identity("b"), scale=0.5), PromptLookup()):
        batch = [sampled(20, prompt, f"s{i}", temperature=temperature, seed=i) for i, prompt in enumerate(PROMPTS)]
        run = generate_speculative(target, draft, batch, 3).responses
        assert [r.output_ids for r in run] == [r.output_ids for r in greedy]
        assert min(r.speculation.acceptance_rate for r in run) < 1  # drafts were rejected, and greedy's id taken


def test_speculative_on_the_shipped_chat_model_with_its_draft():
    from jgpt.artifacts.catalog import load_model
    from jgpt.tokenizers.tokenizer import Tokenizer
    from training.conversation_corpus import split_conversations
    from training.corpus import exercises_of

    target, draft = (ModelExecution.from_artifact(a, a.tokenizer()) for a in map(load_model, ("chat", "chat-draft")))
    conversations = split_conversations(0, "development", 4, target.architecture.context + 1)
    prompts = [e.prompt for c in conversations for e in exercises_of(Tokenizer.bytes_only(), c)][:8]
    run = assert_same_as_greedy(target, draft, requests([16] * len(prompts), prompts), 3)
    evidence = [r.speculation for r in run.responses]
    assert sum(e.accepted for e in evidence) / sum(e.drafted for e in evidence) > MIN_CHAT_ACCEPTANCE


def test_generate_command_refuses_speculate_without_a_draft():
    from inference.commands import main

    with pytest.raises(ApiError, match="speculate"):
        main("generate", ["--speculate", "3", "hi"])


def test_generate_command_samples_speculatively_with_the_shipped_draft(capsys):
    from inference.commands import main

    argv = [
        "--model",
        "chat",
        "--draft",
        "chat-draft",
        "--speculate",
        "2",
        "--sample",
        "--seed",
        "5",
        "--temperature",
        "0.7",
        "--max-new-tokens",
        "8",
        "--json",
        "reverse fish",
    ]
    assert main("generate", argv) == 0
    response = json.loads(capsys.readouterr().out)
    assert {s["rule"] for s in response["selections"]} == {"sample"}
    assert {s["decoding"] for s in response["selections"]} == {"speculative"}
    assert response["speculation"]["speculate"] == 2 and response["speculation"]["rounds"]
    assert main("generate", argv) == 0 and json.loads(capsys.readouterr().out)["output_ids"] == response["output_ids"]
