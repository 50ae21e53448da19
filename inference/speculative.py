"""Speculative decoding: a draft proposes k ids, the target verifies them in one forward.

A round, for every unfinished row: the draft model selects k ids greedily after
the row's last selected id (k draft decode steps); the target processes the last
id and the k drafted ones in one forward over k + 1 positions with its KVState,
which gives its own greedy id after each of them. The drafted ids the target
agrees with, up to the first disagreement, are accepted, and the target's own id
after them is selected too, so a round selects between 1 and k + 1 ids, each the
id plain greedy decoding selects (the target's argmax after the same prefix).

Rollback is the KVState being a value: the verify forward returns a state that
has processed all k + 1 ids, and the state the round keeps is that value with
`lengths` set to the accepted positions. Nothing is copied and nothing mutated:
slots at or past a row's length hold nothing meaningful and no query reads them
(the next round's writes land there). The draft's state rolls back the same way;
when all k drafted ids are accepted the draft has not processed the last of
them yet, and its next round starts with a window of two ids.

The whole loop (draft steps, verify, acceptance, next round) is one jitted
`lax.while_loop` with fixed shapes, like greedy's decode loop: on small models a
host round trip per round would cost more than the forwards it saves.

The draft is a model with the target's tokenizer, or `PromptLookup`, which proposes
without a forward: the ids that followed an earlier occurrence of the row's last
ids, or the ids the previous verify computed past its first rejected draft.

A sampling request (GenerationPolicy selection "sample") is decoded by speculative
sampling (`speculative_sample`), which preserves the target's filtered distribution:
the draft draws its k ids from its own filtered distribution q, drafted id x is
accepted with probability min(1, p(x) / q(x)), the first rejected one is replaced
by a draw from normalize(max(p - q, 0)), and when all are accepted a bonus id is
drawn from p. Every draw's key derives from (seed, request, output index) as plain
sampling's does, so a request draws the same ids alone or in a batch.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from inference.evidence import (
    PREFILL,
    VERIFY,
    CacheComputation,
    GenerationWork,
    SpeculationEvidence,
    SpeculationRound,
)
from inference.execution import ModelExecution, advance, bucket
from inference.generation import Generation, check_buffers, selectable, stop_codes, stop_reason
from inference.policy import SAMPLE, InferenceRequest
from inference.response import InferenceResponse, RunOutcome, TokenSelection
from inference.sampling import SelectionRule, filtered_logits, request_stream, select, step_key
from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import is_integer
from jgpt.kernels.plan import XLA, Kernels
from jgpt.model.kv_state import KVState
from jgpt.model.transformer import forward

SPECULATIVE = "speculative"  # TokenSelection.decoding of a speculatively decoded id
MAX_SPECULATE = 16
LOOP_BOUNDARY = "host: dispatch of the compiled speculative loop to its results ready, divided evenly over its rounds"
PREFILL_BOUNDARY = "host: dispatch of the target's compiled prefill to its logits ready"
# Purposes folded into an output index's key beside the draw plain sampling makes with the key itself (the
# draft's draw there, or the bonus draw): the acceptance test's uniform, and the draw from the residual.
ACCEPT, RESIDUAL = 1, 2


def verify_window(weights, layer_weights, architecture, state: KVState, window_ids, unroll, kernels: Kernels = XLA):
    """The target's logits [B, W, V] after every id of `window_ids` [B, W], and the state that has processed
    all of them (lengths + W); rollback keeps a shorter length of this same value."""
    W = window_ids.shape[1]
    positions = state.lengths[:, None] + jnp.arange(W, dtype=jnp.int32)
    out = forward(
        weights,
        architecture,
        window_ids,
        positions=positions,
        cache=state.buffers,
        unroll=unroll,
        layer_weights=layer_weights,
        kernels=kernels.calls(),
    )
    write = lambda row, ids, slots: row.at[slots].set(ids, mode="drop")
    state = state.replace(
        keys=out.cache.keys, values=out.cache.values,
        token_ids=jax.vmap(write)(state.token_ids, window_ids, positions), lengths=state.lengths + W,
    )  # fmt: skip
    return out.logits, state


def _argmax(logits):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def speculative_sample(target_logits, q, drafted, keys):
    """One row's round of speculative sampling. target_logits [k + 1, V]: the target's filtered logits after
    the last id and after each drafted one (p is their softmax); q [k, V]: the distributions the drafted ids
    [k] were drawn from; keys [k + 1]: the keys of the round's output indices. Returns (accepted count, ids
    [k + 1]): the accepted drafted ids, then the target's draw (from the residual, or the bonus from p).

    Drafted id x is accepted when u q(x) < p(x), u uniform in [0, 1): with probability min(1, p(x) / q(x)).
    """
    k = drafted.shape[0]
    p = jax.nn.softmax(target_logits, axis=-1)
    positions = jnp.arange(k)
    uniforms = jax.vmap(lambda key: jax.random.uniform(jax.random.fold_in(key, ACCEPT)))(keys[:k])
    accepted = jnp.sum(jnp.cumprod(uniforms * q[positions, drafted] < p[positions, drafted]))
    at = jnp.minimum(accepted, k - 1)
    residual = jnp.maximum(p[at] - q[at], 0.0)
    # p == q leaves no residual, and then no draft is ever rejected; float rounding may, so draw from p then
    residual_logits = jnp.where(jnp.any(residual > 0), jnp.log(residual), target_logits[at])
    resampled = jax.random.categorical(jax.random.fold_in(keys[at], RESIDUAL), residual_logits)
    bonus = jax.random.categorical(keys[k], target_logits[k])  # the key and logits plain sampling would use
    final = jnp.where(accepted == k, bonus, resampled).astype(jnp.int32)
    return accepted, jnp.where(jnp.arange(k + 1) < accepted, jnp.append(drafted, 0), final)


def _output_keys(rule: SelectionRule, selected, width: int):
    """Per row, the keys [B, width] of output indices selected, selected + 1, ... (plain sampling's keys)."""
    indices = selected[:, None] + jnp.arange(width, dtype=jnp.int32)
    return jax.vmap(lambda seed, stream, row: jax.vmap(lambda i: step_key(seed, stream, i))(row))(
        rule.seed, rule.stream, indices
    )


def _judge(rule: SelectionRule | None, k: int):
    """The round's acceptance: (logits [B, k + 1, V], drafted [B, k], q [B, k, V] or None, selected [B]) ->
    (accepted [B], ids [B, k + 1]). Greedy rows accept the drafted ids equal to the target's argmax and
    select the argmax; sampling rows follow `speculative_sample`."""

    def greedy(logits, drafted):
        target_ids = _argmax(logits)  # ids greedy decoding selects, as far as the drafts agree
        return jnp.sum(jnp.cumprod(drafted == target_ids[:, :k], axis=1), axis=1), target_ids

    if rule is None:
        return lambda logits, drafted, q, selected: greedy(logits, drafted)

    def judge(logits, drafted, q, selected):
        filtered = jax.vmap(jax.vmap(filtered_logits, in_axes=(0, None, None, None)))(
            logits, rule.temperature, rule.top_k, rule.top_p
        )
        drawn = jax.vmap(speculative_sample)(filtered, q, drafted, _output_keys(rule, selected, k + 1))
        argmax = greedy(logits, drafted)
        return jax.tree.map(
            lambda a, b: jnp.where(rule.sample.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), drawn, argmax
        )

    return judge


def _draw(rule: SelectionRule | None):
    """The draft's selection: (logits [B, V], output index [B]) -> (ids [B], the distribution q [B, V] they
    were drawn from, None when every row is greedy)."""
    if rule is None:
        return lambda logits, index: (_argmax(logits), None)

    def draw(logits, index):
        filtered = jax.vmap(filtered_logits)(logits, rule.temperature, rule.top_k, rule.top_p)
        return select(logits, rule, index), jax.nn.softmax(filtered, axis=-1)

    return draw


@dataclasses.dataclass(frozen=True)
class PromptLookup:
    """The draft-free proposer: the k ids that followed the latest earlier occurrence of the row's last
    `ngram` ids in its own sequence (prompt lookup) when at least two of them occur; else the guesses the
    previous verify left, then the continuation of a one-id match.

    A verify forward gives the target's id after every drafted one; past the first rejected draft those
    ids were conditioned on a wrong prefix, but often still are the ids greedy decoding selects next
    (Jacobi iteration). Neither source costs a forward: on a model whose step is bound by per-operation
    overhead a round then costs about one target step.
    """

    ngram: int = 3
    checkpoint_sha256 = None  # no model: SpeculationEvidence records no draft checkpoint


PROMPT_LOOKUP = "prompt-lookup"  # the --draft name of the draft-free proposer


def lookup(token_ids, lengths, last, k: int, ngram: int, filler: int):
    """Per row, the k ids after the latest earlier occurrence of its last `ngram` ids (the longest suffix
    that occurs, down to one id), where `last` sits at position `lengths`; `filler` where none occurs
    or the continuation runs past `last`. token_ids [B, S], lengths and last [B] -> (ids [B, k], the
    matched suffix's length [B], 0 where none occurs)."""
    B, S = token_ids.shape
    slots = jnp.arange(S + 1)
    sequence = jnp.concatenate([token_ids, jnp.zeros((B, 1), jnp.int32)], 1)
    sequence = jnp.where(slots == lengths[:, None], last[:, None], sequence)  # [B, S + 1]
    matched = jnp.ones((B, S + 1), jnp.int32)
    length = jnp.zeros((B, S + 1), jnp.int32)  # how many ids before the last the match at each end slot spans
    for i in range(ngram):
        tail = jnp.take_along_axis(sequence, jnp.maximum(lengths - i, 0)[:, None], 1)  # [B, 1]
        shifted = jnp.pad(sequence, ((0, 0), (i, 0)), constant_values=-1)[:, : S + 1]
        matched = matched * (shifted == tail) * (lengths[:, None] >= i)
        length = length + matched
    score = jnp.where(slots < lengths[:, None], length * (S + 1) + slots, 0)  # longest match, then latest
    end = jnp.argmax(score, axis=1)
    matched = jnp.max(score, axis=1) // (S + 1)
    taken = end[:, None] + 1 + jnp.arange(k)
    proposed = jnp.take_along_axis(sequence, jnp.minimum(taken, S), 1)
    return jnp.where((matched[:, None] > 0) & (taken <= lengths[:, None]), proposed, filler), matched


@functools.partial(
    jax.jit,
    static_argnames=("target_architecture", "draft_architecture", "k", "steps", "turn_end_id", "target_unroll",
                     "draft_unroll", "ngram", "target_kernels", "draft_kernels"),
    donate_argnames="target_state",
)  # fmt: skip
def _speculative_loop(
    target_weights, target_layers, draft_weights, draft_layers, target_state, draft_state, first_logits, budget, rule,
    *, target_architecture, draft_architecture, k, steps, turn_end_id, target_unroll, draft_unroll, ngram,
    target_kernels, draft_kernels,
):  # fmt: skip
    """Rounds until every row stops. Returns (output ids [B, steps + k + 1], selected [B], stop codes [B],
    per round [B, steps, k + 1] the drafted ids and the accepted count, rounds [B], target state).

    draft_architecture None: PromptLookup(ngram) proposes (draft_* are None). rule: the rows' SelectionRule,
    or None when every row is greedy (the greedy program, unchanged).

    Every round writes each row's k + 1 target ids at its next output column and its log at its round
    column whether the row runs or has stopped: what lands past a row's selected ids (or its rounds) is
    never read, and overwriting it costs one dynamic_update_slice instead of masked scatters.
    """
    B = first_logits.shape[0]
    rows = jnp.arange(B)
    offsets = jnp.arange(k + 1, dtype=jnp.int32)
    prefix_length = target_state.lengths  # processed positions before the first selection
    context = target_architecture.context
    one = jnp.ones((B,), jnp.int32)
    zero = jnp.zeros((B,), jnp.int32)
    first = select(first_logits, rule, zero)
    outputs = jnp.zeros((B, steps + k + 1), jnp.int32).at[:, 0].set(first)
    log = jnp.zeros((B, steps, k + 1), jnp.int32)
    stop = stop_codes(jnp, first, one, budget, prefix_length, context, turn_end_id)
    if draft_architecture is None:
        propose, roll_back = _lookup_proposer(k, ngram, turn_end_id, None if rule is None else first_logits.shape[-1])
        drafting = (jnp.zeros((B, k), jnp.int32), zero)  # guesses the last verify left, and how many
    else:
        step = functools.partial(
            advance, draft_weights, draft_architecture, unroll=draft_unroll, layer_weights=draft_layers,
            kernels=draft_kernels,
        )  # fmt: skip
        propose, roll_back = _model_proposer(step, k, _draw(rule))
        drafting = (draft_state, zero - 1)
    judge = _judge(rule, k)

    def running(carry):
        return jnp.any(carry[4] == 0)

    def round_(carry):
        target_state, drafting, last, selected, stop, outputs, log, rounds = carry
        active = (stop == 0).astype(jnp.int32)
        drafted, q, drafting = propose(drafting, target_state, last, active, selected)  # [B, k], [B, k, V]
        # Verify: the target's own id after the last id and after each drafted one, in one forward.
        logits, verified = verify_window(
            target_weights, target_layers, target_architecture, target_state,
            jnp.concatenate([last[:, None], drafted], 1), target_unroll, target_kernels,
        )  # fmt: skip
        accepted, target_ids = judge(logits, drafted, q, selected)  # [B], [B, k + 1]
        selected_after = selected[:, None] + offsets + 1  # a row's selected ids, counting each target id
        codes = stop_codes(
            jnp, target_ids, selected_after, budget[:, None], prefix_length[:, None], context, turn_end_id
        )
        taken, stopped, code = _taken(codes, accepted, active)
        outputs = _put(outputs, target_ids, selected)
        log = _put(log, jnp.concatenate([drafted, jnp.minimum(accepted, taken)[:, None]], 1)[:, None], rounds)
        # Roll back: each state is the value the forwards returned, with the accepted positions as its length.
        processed = target_state.lengths
        target_state = verified.replace(lengths=processed + taken)
        drafting = roll_back(drafting, processed, drafted, target_ids, accepted, active)
        last = jnp.where(active == 1, target_ids[rows, jnp.maximum(taken - 1, 0)], last)
        stop = jnp.where(active == 1, jnp.where(stopped, code, 0), stop)
        return target_state, drafting, last, selected + taken, stop, outputs, log, rounds + active

    carry = (target_state, drafting, first, one, stop, outputs, log, zero)
    target_state, _, _, selected, stop, outputs, log, rounds = jax.lax.while_loop(running, round_, carry)
    return outputs, selected, stop, log, rounds, target_state


def _taken(codes, accepted, active):
    """Per row, how many of the round's k + 1 target ids it selects: target_ids[:accepted + 1], up to the first
    whose stop code (`codes` [B, k + 1]) stops the row, none for a row that had stopped (`active` 0); whether
    one stopped it, and its code."""
    offsets = jnp.arange(codes.shape[1], dtype=jnp.int32)
    stops = (codes != 0) & (offsets <= accepted[:, None])
    stopped = jnp.any(stops, axis=1)
    stops_at = jnp.argmax(stops, axis=1)
    taken = jnp.where(stopped, stops_at + 1, accepted + 1) * active
    return taken, stopped, codes[jnp.arange(codes.shape[0]), stops_at]


def _put(buffers, updates, columns):
    """Each row's update written into its buffer from its column on (one dynamic_update_slice a row)."""
    return jax.vmap(
        lambda buffer, update, at: jax.lax.dynamic_update_slice(buffer, update, (at,) + (0,) * (update.ndim - 1))
    )(buffers, updates, columns)


def _model_proposer(step, k: int, draw):
    """A draft model's (propose, roll back) over (its KVState, the id it still owes or -1); `draw` selects
    its ids (`_draw`)."""

    def propose(drafting, target_state, last, active, selected):
        # The draft first processes the id it still owes (when it drafted all k ids and all were accepted)
        # and the last selected id, then selects k ids, greedily or drawn at output indices selected + i.
        draft_state, pending = drafting
        owes = pending >= 0
        window = jnp.where(owes[:, None], jnp.stack([pending, last], 1), jnp.stack([last, jnp.zeros_like(last)], 1))
        logits, draft_state = step(draft_state, window, (1 + owes) * active)
        proposed = [draw(logits, selected)]
        for i in range(1, k):
            logits, draft_state = step(draft_state, proposed[-1][0][:, None], active)
            proposed.append(draw(logits, selected + i))
        ids, q = zip(*proposed)
        return jnp.stack(ids, 1), None if q[0] is None else jnp.stack(q, 1), (draft_state, pending)

    def roll_back(drafting, processed, drafted, target_ids, accepted, active):
        draft_state, _ = drafting
        lengths = jnp.where(active == 1, processed + jnp.minimum(accepted, k - 1) + 1, draft_state.lengths)
        pending = jnp.where((active == 1) & (accepted == k), drafted[:, k - 1], -1)
        return draft_state.replace(lengths=lengths), pending

    return propose, roll_back


def _lookup_proposer(k: int, ngram: int, filler: int, vocabulary: int | None):
    """PromptLookup's (propose, roll back) over (the guesses the last verify left [B, k], how many). With a
    `vocabulary` (sampling rows) it also gives the distribution its ids come from: all mass on each."""

    def propose(drafting, target_state, last, active, selected):
        guesses, count = drafting
        found, matched = lookup(target_state.token_ids, target_state.lengths, last, k, ngram, filler)
        column = jnp.arange(k)
        pick = jnp.where(column < count[:, None], column, k + column - count[:, None])
        guessed = jnp.take_along_axis(jnp.concatenate([guesses, found], 1), pick, 1)
        drafted = jnp.where(matched[:, None] >= 2, found, guessed)
        return drafted, None if vocabulary is None else jax.nn.one_hot(drafted, vocabulary), drafting

    def roll_back(drafting, processed, drafted, target_ids, accepted, active):
        # The target's ids after the first rejected draft: they follow the id it selected instead.
        column = jnp.arange(k)
        guesses = jnp.take_along_axis(target_ids, jnp.minimum(accepted[:, None] + 1 + column, k), 1)
        return guesses, k - jnp.minimum(accepted, k)

    return propose, roll_back


def check_draft(target: ModelExecution, draft: ModelExecution | PromptLookup, k: int) -> None:
    """Refuse a draft model that does not share the target's tokenizer and vocabulary, or a bad k."""
    if not is_integer(k) or not 1 <= k <= MAX_SPECULATE:
        raise ApiError("speculate", f"must be an integer in 1..{MAX_SPECULATE}, got {k!r}")
    if isinstance(draft, PromptLookup):
        return
    if draft.identity.tokenizer_sha256 != target.identity.tokenizer_sha256:
        raise ApiError("draft", "has another tokenizer than the target model; a draft must propose the target's ids")
    if draft.architecture.vocabulary != target.architecture.vocabulary:
        raise ApiError(
            "draft", f"has a vocabulary of {draft.architecture.vocabulary}, the target {target.architecture.vocabulary}"
        )
    if draft.turn_end_id != target.turn_end_id:
        raise ApiError("draft", f"ends turns with id {draft.turn_end_id}, the target with {target.turn_end_id}")


def generate_speculative(
    target: ModelExecution, draft: ModelExecution | PromptLookup, requests: Sequence[InferenceRequest], k: int
) -> Generation:
    """Generation of the target model, decoded speculatively with `draft` (a draft model, or PromptLookup)
    proposing k ids a round.

    A greedy request's output ids are plain greedy decoding's; a sampling request's are drawn by
    speculative sampling, distributed as the target's filtered distribution. Each response's
    `speculation` records every round's drafted, accepted and rejected ids and the acceptance rate.
    """
    check_draft(target, draft, k)
    if not requests:
        raise ApiError("requests", "is empty; nothing to generate")
    rule = SelectionRule.of(requests)
    prompts = [r.prompt_ids for r in requests]
    budgets = np.asarray([r.generation.max_new_tokens for r in requests], np.int32)
    context = target.architecture.context
    reach = [selectable(p, n, context) for p, n in zip(prompts, budgets)]
    steps = max(reach)
    capacity = max(len(p) + n - 1 for p, n in zip(prompts, reach))
    model = None if isinstance(draft, PromptLookup) else draft
    # Per column: an output id and a round's log (k drafted ids and the accepted count); per slot, the draft's
    # state. A sampling draft model's q [B, k, V] lives only inside a round.
    draft_slot = 0 if model is None else model.costs.kv_bytes_per_position + 4
    check_buffers(target, prompts, steps + k + 1, 4 * (k + 2), draft_slot)
    if model is not None and model.architecture.context < min(capacity, target.architecture.context):
        raise ApiError("draft", f"has a context of {model.architecture.context} positions; this run needs {capacity}")
    target_start, window_ids, counts, _ = target.window(prompts, None, capacity)
    loop = functools.partial(
        _speculative_loop, target.weights, target.layer_weights, model and model.weights, model and model.layer_weights,
        target_architecture=target.architecture, draft_architecture=model and model.architecture, k=k,
        steps=bucket(steps, context + 1), turn_end_id=target.turn_end_id, target_unroll=target.scan_unroll,
        draft_unroll=model and model.scan_unroll, ngram=draft.ngram if isinstance(draft, PromptLookup) else 0,
        target_kernels=target.kernels, draft_kernels=model and model.kernels,
    )  # fmt: skip

    def draft_prefill():
        draft_start, _, _, _ = model.window(prompts, None, target_start.capacity)
        return model.advance(draft_start, window_ids, counts)[1]

    # Compile every program first, so times exclude compilation: a budget of two runs one round, because
    # XLA on CPU also prepares a loop body's kernels the first time they run (a first timed loop of the
    # chat model took 20-50x its later runs after a warm-up whose loop ran no round).
    warm_logits, warm_target = target.advance(target_start, window_ids, counts)
    jax.block_until_ready(
        loop(warm_target, model and draft_prefill(), warm_logits, jnp.minimum(jnp.asarray(budgets), 2), rule)
    )
    (first_logits, target_state), prefill_seconds = _timed(target.advance, target_start, window_ids, counts)
    draft_state, draft_prefill_seconds = _timed(draft_prefill) if model else (None, 0.0)
    ran, loop_seconds = _timed(loop, target_state, draft_state, first_logits, jnp.asarray(budgets), rule)
    outputs, selected, stop, log, rounds = jax.device_get(ran[:5])
    per_round = loop_seconds / max(1, int(rounds.max()))
    responses = []
    for b, request in enumerate(requests):
        output_ids = tuple(int(t) for t in outputs[b, : selected[b]])
        speculation = _speculation(draft, k, output_ids, log[b, : rounds[b]], draft_prefill_seconds)
        computations = _computations(target, request, output_ids, speculation, prefill_seconds, per_round)
        responses.append(
            InferenceResponse(
                request_id=request.request_id, prompt_ids=tuple(request.prompt_ids), output_ids=output_ids,
                published_ids=tuple(t for t in output_ids if t != target.turn_end_id),
                outcome=RunOutcome.of(output_ids, int(budgets[b]), stop_reason(stop[b]), target.turn_end_id),
                selections=tuple(_selection(request, step, t) for step, t in enumerate(output_ids)),
                computations=computations, work=GenerationWork.total(computations), speculation=speculation,
            )
        )  # fmt: skip
    return Generation(tuple(responses), ran[5])


def _selection(request: InferenceRequest, step: int, selected_id: int) -> TokenSelection:
    """A sampled id records what its keys derive from (the round's candidates are not kept)."""
    policy = request.generation
    if policy.selection != SAMPLE:
        return TokenSelection(selected_id, decoding=SPECULATIVE)
    key = {"seed": policy.seed, "stream": request_stream(request), "step": step}
    return TokenSelection(selected_id, rule=SAMPLE, decoding=SPECULATIVE, rng_state=key)


def _timed(program, *args):
    """(result, seconds from dispatch to ready)."""
    started = time.perf_counter()
    result = jax.block_until_ready(program(*args))
    return result, time.perf_counter() - started


def _speculation(draft, k: int, output_ids, log, draft_prefill_seconds) -> SpeculationEvidence:
    """Each round's drafted ids (log[:, :k]) split at the first the target rejected (log[:, k] accepted);
    the round's first id is output id `step` (id 0 comes from the prefill)."""
    rounds, step = [], 1
    for row in log:
        ids, n = tuple(int(t) for t in row[:k]), int(row[k])
        own = output_ids[step + n] if step + n < len(output_ids) else None
        rounds.append(SpeculationRound(step, ids, ids[:n], ids[n:], own))
        step += n + (own is not None)
    checkpoint = None if isinstance(draft, PromptLookup) else draft.identity.checkpoint_sha256
    return SpeculationEvidence(checkpoint, k, tuple(rounds), draft_prefill_seconds * 1e6)


def _computations(target: ModelExecution, request, output_ids, speculation, prefill_seconds, per_round):
    """The target's works: its prefill, then one verify work of k + 1 positions per round."""
    costs, prompt = target.costs, request.prompt_ids
    works = [(PREFILL, tuple(prompt), 0, prefill_seconds, PREFILL_BOUNDARY)]
    for r in speculation.rounds:
        start = len(prompt) + r.step - 1  # the round processes output id step - 1 and its drafts
        works.append((VERIFY, (output_ids[r.step - 1], *r.drafted_ids), start, per_round, LOOP_BOUNDARY))
    return tuple(
        CacheComputation(
            work_id=f"{request.request_id}/{step}", request_id=request.request_id, step=step, phase=phase,
            input_ids=input_ids, processed_positions=len(input_ids), reused_positions=start,
            matmul_flops=costs.matmul_flops(start, start + len(input_ids)),
            reference_matmul_flops=costs.reference_matmul_flops(start + len(input_ids)),
            logical_memory_bytes=costs.memory_bytes(start, start + len(input_ids)), reference_max_abs_error=None,
            wall_time_us=seconds * 1e6, measurement_boundary=boundary,
        )
        for step, (phase, input_ids, start, seconds, boundary) in enumerate(works)
    )  # fmt: skip
