"""Speculative decoding, greedy-exact: a draft proposes k ids, the target verifies them in one forward.

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
"""

from __future__ import annotations

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
from inference.generation import STOP_REASONS, Generation, stop_codes
from inference.policy import GREEDY, InferenceRequest
from inference.response import InferenceResponse, RunOutcome, TokenSelection
from jgpt.errors import ApiError
from jgpt.kv_state import KVState
from jgpt.model import forward
from jgpt.validation import is_integer

SPECULATIVE = "speculative"  # TokenSelection.decoding of a speculatively decoded id
MAX_SPECULATE = 16
LOOP_BOUNDARY = "host: dispatch of the compiled speculative loop to its results ready, divided evenly over its rounds"
PREFILL_BOUNDARY = "host: dispatch of the target's compiled prefill to its logits ready"


def verify_window(weights, layer_weights, architecture, state: KVState, window_ids, unroll):
    """The target's logits [B, W, V] after every id of `window_ids` [B, W], and the state that has processed
    all of them (lengths + W); rollback keeps a shorter length of this same value."""
    W = window_ids.shape[1]
    positions = state.lengths[:, None] + jnp.arange(W, dtype=jnp.int32)
    out = forward(
        weights, architecture, window_ids, positions=positions, cache=state.buffers, unroll=unroll, layer_weights=layer_weights
    )
    write = lambda row, ids, slots: row.at[slots].set(ids, mode="drop")
    state = state.replace(
        keys=out.cache.keys, values=out.cache.values,
        token_ids=jax.vmap(write)(state.token_ids, window_ids, positions), lengths=state.lengths + W,
    )  # fmt: skip
    return out.logits, state


def _argmax(logits):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


@functools.partial(
    jax.jit,
    static_argnames=("target_architecture", "draft_architecture", "k", "steps", "turn_end_id", "target_unroll", "draft_unroll"),
    donate_argnames="target_state",
)
def _speculative_loop(
    target_weights, target_layers, draft_weights, draft_layers, target_state, draft_state, first_logits, budget,
    *, target_architecture, draft_architecture, k, steps, turn_end_id, target_unroll, draft_unroll,
):  # fmt: skip
    """Rounds until every row stops. Returns (output ids [B, steps], selected [B], stop codes [B],
    drafted ids [B, steps, k] and accepted counts [B, steps] per round, rounds [B], target state)."""
    B = first_logits.shape[0]
    rows = jnp.arange(B)
    offsets = jnp.arange(k + 1, dtype=jnp.int32)
    prefix_length = target_state.lengths  # processed positions before the first selection
    context = target_architecture.context
    draft_step = functools.partial(advance, draft_weights, draft_architecture, unroll=draft_unroll, layer_weights=draft_layers)
    first = _argmax(first_logits)
    one = jnp.ones((B,), jnp.int32)
    outputs = jnp.zeros((B, steps), jnp.int32).at[:, 0].set(first)
    stop = stop_codes(jnp, first, one, budget, prefix_length, context, turn_end_id)
    drafted_log = jnp.zeros((B, steps, k), jnp.int32)
    accepted_log = jnp.zeros((B, steps), jnp.int32)
    zero = jnp.zeros((B,), jnp.int32)

    def running(carry):
        return jnp.any(carry[5] == 0)

    def round_(carry):
        target_state, draft_state, last, pending, selected, stop, outputs, drafted_log, accepted_log, rounds = carry
        active = (stop == 0).astype(jnp.int32)
        # Propose: the draft first processes the id it still owes (when it drafted all k ids and all were
        # accepted) and the last selected id, then selects k ids greedily.
        owes = pending >= 0
        window = jnp.where(owes[:, None], jnp.stack([pending, last], 1), jnp.stack([last, zero], 1))
        logits, draft_state = draft_step(draft_state, window, (1 + owes) * active)
        proposed = [_argmax(logits)]
        for _ in range(k - 1):
            logits, draft_state = draft_step(draft_state, proposed[-1][:, None], active)
            proposed.append(_argmax(logits))
        drafted = jnp.stack(proposed, 1)  # [B, k]
        # Verify: the target's own id after the last id and after each drafted one, in one forward.
        logits, verified = verify_window(
            target_weights, target_layers, target_architecture, target_state,
            jnp.concatenate([last[:, None], drafted], 1), target_unroll,
        )  # fmt: skip
        target_ids = _argmax(logits)  # [B, k + 1]: ids greedy decoding selects, as far as the drafts agree
        accepted = jnp.sum(jnp.cumprod(drafted == target_ids[:, :k], axis=1), axis=1)  # [B]
        # Select target_ids[:accepted + 1], up to the first that stops the row.
        codes = stop_codes(
            jnp, target_ids, selected[:, None] + offsets + 1, budget[:, None], prefix_length[:, None], context, turn_end_id
        )
        stops = (codes != 0) & (offsets <= accepted[:, None])
        stops_at = jnp.argmax(stops, axis=1)
        taken = jnp.where(jnp.any(stops, axis=1), stops_at + 1, accepted + 1) * active
        columns = jnp.where(offsets < taken[:, None], selected[:, None] + offsets, steps)  # out of range: dropped
        outputs = outputs.at[rows[:, None], columns].set(target_ids, mode="drop")
        round_column = jnp.where(active == 1, rounds, steps)
        drafted_log = drafted_log.at[rows, round_column].set(drafted, mode="drop")
        accepted_log = accepted_log.at[rows, round_column].set(jnp.minimum(accepted, taken), mode="drop")
        # Roll back: each state is the value the forwards returned, with the accepted positions as its length.
        processed = target_state.lengths
        target_state = verified.replace(lengths=processed + taken)
        draft_lengths = jnp.where(active == 1, processed + jnp.minimum(accepted, k - 1) + 1, draft_state.lengths)
        draft_state = draft_state.replace(lengths=draft_lengths)
        pending = jnp.where((active == 1) & (accepted == k), drafted[:, k - 1], -1)
        last = jnp.where(active == 1, target_ids[rows, jnp.maximum(taken - 1, 0)], last)
        stop = jnp.where(active == 1, jnp.where(jnp.any(stops, axis=1), codes[rows, stops_at], 0), stop)
        return target_state, draft_state, last, pending, selected + taken, stop, outputs, drafted_log, accepted_log, rounds + active

    carry = (target_state, draft_state, first, zero - 1, one, stop, outputs, drafted_log, accepted_log, zero)
    target_state, _, _, _, selected, stop, outputs, drafted_log, accepted_log, rounds = jax.lax.while_loop(running, round_, carry)
    return outputs, selected, stop, drafted_log, accepted_log, rounds, target_state


def check_draft(target: ModelExecution, draft: ModelExecution, k: int) -> None:
    """Refuse a draft that does not share the target's tokenizer and vocabulary, or a bad k."""
    if not is_integer(k) or not 1 <= k <= MAX_SPECULATE:
        raise ApiError("speculate", f"must be an integer in 1..{MAX_SPECULATE}, got {k!r}")
    if draft.identity.tokenizer_sha256 != target.identity.tokenizer_sha256:
        raise ApiError("draft", "has another tokenizer than the target model; a draft must propose the target's ids")
    if draft.architecture.vocabulary != target.architecture.vocabulary:
        raise ApiError(
            "draft", f"has a vocabulary of {draft.architecture.vocabulary}, the target {target.architecture.vocabulary}"
        )
    if draft.turn_end_id != target.turn_end_id:
        raise ApiError("draft", f"ends turns with id {draft.turn_end_id}, the target with {target.turn_end_id}")


def generate_speculative(
    target: ModelExecution, draft: ModelExecution, requests: Sequence[InferenceRequest], k: int
) -> Generation:
    """Greedy generation of the target model, decoded speculatively with `draft` proposing k ids a round.

    The output ids are plain greedy decoding's; each response's `speculation` records every round's
    drafted, accepted and rejected ids and the acceptance rate.
    """
    check_draft(target, draft, k)
    if not requests:
        raise ApiError("requests", "is empty; nothing to generate")
    for r in requests:
        if r.generation.selection != GREEDY:
            raise ApiError("selection", f"speculative decoding is greedy-exact; request {r.request_id!r} asks for "
                                        f"{r.generation.selection!r}")  # fmt: skip
    prompts = [r.prompt_ids for r in requests]
    budgets = np.asarray([r.generation.max_new_tokens for r in requests], np.int32)
    capacity = max(len(p) + int(n) - 1 for p, n in zip(prompts, budgets))
    if draft.architecture.context < min(capacity, target.architecture.context):
        raise ApiError("draft", f"has a context of {draft.architecture.context} positions; this run needs {capacity}")
    target_start, window_ids, counts, _ = target.window(prompts, None, capacity)
    draft_start, _, _, _ = draft.window(prompts, None, target_start.capacity)
    loop = functools.partial(
        _speculative_loop, target.weights, target.layer_weights, draft.weights, draft.layer_weights,
        target_architecture=target.architecture, draft_architecture=draft.architecture, k=k,
        steps=bucket(int(budgets.max()), 1 << 30), turn_end_id=target.turn_end_id,
        target_unroll=target.scan_unroll, draft_unroll=draft.scan_unroll,
    )  # fmt: skip

    # Compile every program first, so times exclude compilation: a budget of two runs one round, because
    # XLA on CPU also prepares a loop body's kernels the first time they run (a first timed loop of the
    # chat model took 20-50x its later runs after a warm-up whose loop ran no round).
    warm_logits, warm_target = target.advance(target_start, window_ids, counts)
    warm_draft = draft.advance(draft_start, window_ids, counts)[1]
    jax.block_until_ready(loop(warm_target, warm_draft, warm_logits, jnp.minimum(jnp.asarray(budgets), 2)))
    (first_logits, target_state), prefill_seconds = _timed(target.advance, target_start, window_ids, counts)
    (_, draft_state), draft_prefill_seconds = _timed(draft.advance, draft_start, window_ids, counts)
    ran, loop_seconds = _timed(loop, target_state, draft_state, first_logits, jnp.asarray(budgets))
    outputs, selected, stop, drafted, accepted, rounds = jax.device_get(ran[:6])
    per_round = loop_seconds / max(1, int(rounds.max()))
    responses = []
    for b, request in enumerate(requests):
        output_ids = tuple(int(t) for t in outputs[b, : selected[b]])
        speculation = _speculation(draft, k, output_ids, drafted[b, : rounds[b]], accepted[b, : rounds[b]],
                                   draft_prefill_seconds)  # fmt: skip
        computations = _computations(target, request, output_ids, speculation, prefill_seconds, per_round)
        responses.append(
            InferenceResponse(
                request_id=request.request_id, prompt_ids=tuple(request.prompt_ids), output_ids=output_ids,
                published_ids=tuple(t for t in output_ids if t != target.turn_end_id),
                outcome=RunOutcome.of(output_ids, int(budgets[b]), STOP_REASONS[stop[b]], target.turn_end_id),
                selections=tuple(TokenSelection(t, decoding=SPECULATIVE) for t in output_ids),
                computations=computations, work=GenerationWork.total(computations), speculation=speculation,
            )
        )  # fmt: skip
    return Generation(tuple(responses), ran[6])


def _timed(program, *args):
    """(result, seconds from dispatch to ready)."""
    started = time.perf_counter()
    result = jax.block_until_ready(program(*args))
    return result, time.perf_counter() - started


def _speculation(draft: ModelExecution, k: int, output_ids, drafted, accepted, draft_prefill_seconds) -> SpeculationEvidence:
    """Each round's drafted ids split at the first the target rejected; the round's first id is output
    id `step` (id 0 comes from the prefill)."""
    rounds, step = [], 1
    for ids, n in zip(drafted, accepted):
        ids, n = tuple(int(t) for t in ids), int(n)
        own = output_ids[step + n] if step + n < len(output_ids) else None
        rounds.append(SpeculationRound(step, ids, ids[:n], ids[n:], own))
        step += n + (own is not None)
    return SpeculationEvidence(draft.identity.checkpoint_sha256, k, tuple(rounds), draft_prefill_seconds * 1e6)


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
