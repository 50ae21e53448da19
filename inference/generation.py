"""Generation: the whole token loop in one jitted `lax.while_loop`, batched over requests.

`generate` prefills every request's prompt (reusing exact prefixes a given
KVState already holds), then runs the decode loop on the device without a host
round trip per token: each iteration processes the last selected id of every
unfinished row, selects the next id (greedily, or by the request's seeded sampling rule,
`inference/sampling.py`) and updates the stop flags. Rows
stop independently (TURN_END, their own budget, or context capacity); the loop
ends when all have.

`generate_stepwise` runs the same steps one jitted decode call at a time instead,
to measure each work's wall time (and to observe tensors at a chosen step, or
stream ids as they are selected). Both give the same ids and logits.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from inference.evidence import DECODE, PREFILL, CacheComputation, GenerationWork, tensor_observations
from inference.execution import ModelExecution, advance, bucket, capacity_bucket
from inference.policy import SAMPLE, STOP_BUDGET, STOP_CONTEXT, STOP_TURN_END, InferenceRequest
from inference.response import InferenceResponse, RunOutcome, TokenSelection
from inference.sampling import (
    TOP_CANDIDATES,
    SelectionRule,
    candidates,
    candidates_jit,
    request_stream,
    select,
    select_jit,
)
from jgpt.foundation.errors import ApiError
from jgpt.foundation.limits import check_buffer
from jgpt.model.kv_state import KVState
from jgpt.model.transformer import forward

STOP_REASONS = (None, STOP_TURN_END, STOP_BUDGET, STOP_CONTEXT)  # indexed by the loop's stop code
LOOP_BOUNDARY = "host: dispatch of the compiled decode loop to its results ready, divided evenly over its steps"
STEP_BOUNDARY = "host: dispatch of one compiled work (over the whole batch) to its logits ready"


def stop_reason(code) -> str:
    """The stop reason of a row's final stop code (a loop ends only once every row has one)."""
    reason = STOP_REASONS[code]
    assert reason is not None, "a finished row has a nonzero stop code"
    return reason


def stop_codes(xp, selected_id, selected, budget, prefix_length, context, turn_end_id):
    """Per row, why selection stops after `selected` ids (0: it continues); numpy or jax arrays.

    The next selection would need the last one processed at position
    prefix_length + selected - 1, which must lie inside the context.
    """
    return xp.where(
        selected_id == turn_end_id,
        1,
        xp.where(selected >= budget, 2, xp.where(prefix_length + selected > context, 3, 0)),
    )


@functools.partial(
    jax.jit,
    static_argnames=("architecture", "steps", "turn_end_id", "keep_logits", "unroll", "kernels"),
    donate_argnames="state",
)
def _decode_loop(
    weights, layer_weights, architecture, state, first_logits, budget, rule, *, steps, turn_end_id, keep_logits,
    unroll, kernels,
):  # fmt: skip
    """Select and process ids until every row stops. Returns (output ids [B, steps], selected [B],
    stop codes [B], logits [B, steps, V] or None, candidates or None, final state).

    rule: the rows' SelectionRule, or None when every row is greedy; candidates are then None, else
    the filtered distribution's top ids and probabilities, each [B, steps, TOP_CANDIDATES].
    """
    B = first_logits.shape[0]
    prefix_length = state.lengths  # processed positions before the first selection
    context = architecture.context
    first = select(first_logits, rule, jnp.zeros((B,), jnp.int32))
    one = jnp.ones((B,), jnp.int32)
    outputs = jnp.zeros((B, steps), jnp.int32).at[:, 0].set(first)
    logits_seen = (
        jnp.zeros((B, steps, architecture.vocabulary), jnp.float32).at[:, 0].set(first_logits) if keep_logits else None
    )
    seen = None
    if rule is not None:
        ids, probabilities = candidates(first_logits, rule)
        seen = (jnp.zeros((B, steps, TOP_CANDIDATES), jnp.int32).at[:, 0].set(ids),
                jnp.zeros((B, steps, TOP_CANDIDATES), jnp.float32).at[:, 0].set(probabilities))  # fmt: skip
    stop = stop_codes(jnp, first, one, budget, prefix_length, context, turn_end_id)

    def running(carry):
        return jnp.any(carry[3] == 0)

    def step(carry):
        state, last, selected, stop, outputs, logits_seen, seen = carry
        active = (stop == 0).astype(jnp.int32)
        logits, state = advance(weights, architecture, state, last[:, None], active, unroll, layer_weights, kernels)
        chosen = select(logits, rule, selected)
        rows = jnp.arange(B)
        column = jnp.where(active == 1, selected, steps)  # out of range: dropped for stopped rows
        outputs = outputs.at[rows, column].set(chosen, mode="drop")
        if keep_logits:
            logits_seen = logits_seen.at[rows, column].set(logits, mode="drop")
        if rule is not None:
            ids, probabilities = candidates(logits, rule)
            seen = (
                seen[0].at[rows, column].set(ids, mode="drop"),
                seen[1].at[rows, column].set(probabilities, mode="drop"),
            )
        selected = selected + active
        new_stop = stop_codes(jnp, chosen, selected, budget, prefix_length, context, turn_end_id)
        stop = jnp.where(active == 1, new_stop, stop)
        return state, jnp.where(active == 1, chosen, last), selected, stop, outputs, logits_seen, seen

    carry = (state, first, one, stop, outputs, logits_seen, seen)
    state, _, selected, stop, outputs, logits_seen, seen = jax.lax.while_loop(running, step, carry)
    return outputs, selected, stop, logits_seen, seen, state


@dataclasses.dataclass(frozen=True)
class Generation:
    responses: tuple[InferenceResponse, ...]
    state: KVState  # every row's prompt and selected ids but the last, processed


def generate(
    execution: ModelExecution,
    requests: Sequence[InferenceRequest],
    state: KVState | None = None,
    *,
    reference: bool = False,
    scores: bool = False,
) -> Generation:
    """Generation for a batch of requests (each by its own selection rule), with evidence: the decode
    steps run as one compiled loop, whose time is divided evenly over its steps.

    state: rows whose token ids are exact prefixes of the prompts are reused.
    reference: record each work's max abs logit error against a full-prefix recompute.
    scores: keep raw logits and probabilities in every TokenSelection.
    """
    plan = _plan(execution, requests, state, reference or scores, reference)
    return _generation(execution, requests, plan, _run_loop(execution, plan), LOOP_BOUNDARY, reference, scores)


def generate_stepwise(
    execution: ModelExecution,
    requests: Sequence[InferenceRequest],
    state: KVState | None = None,
    *,
    reference: bool = False,
    scores: bool = False,
    observe_step: int | None = None,
    run_id: str = "run",
    on_select: Callable[[int, int], None] | None = None,
) -> Generation:
    """`generate`'s steps run one compiled work per call, each timed alone; the same ids and evidence.

    observe_step: record TensorObservations of every model operation at that step.
    on_select: called with (row, id) as each id is selected, for streaming.
    """
    plan = _plan(execution, requests, state, reference or scores, reference)
    observe = None
    if observe_step is not None:
        if not 0 <= observe_step < plan.budgets.max():
            raise ApiError("observe", f"step {observe_step} is outside 0..{plan.budgets.max() - 1}, the steps the "
                                      "budget allows")  # fmt: skip
        observe = functools.partial(_observe, execution, run_id=run_id, requests=requests, step=observe_step)
    ran = _run_steps(execution, plan, observe_step, observe, on_select)
    steps = max(map(len, ran.output_ids))
    if observe_step is not None and observe_step >= steps:  # [] with exit 0 would read as "nothing to see"
        raise ApiError(
            "observe", f"step {observe_step} was not reached: generation ended after {steps} steps (0..{steps - 1})"
        )
    return _generation(execution, requests, plan, ran, STEP_BOUNDARY, reference, scores)


def selectable(prompt: Sequence[int], budget: int, context: int) -> int:
    """The most ids a row can select: its budget, or all the context leaves after its prompt (context -
    prompt + 1: the last selected id is never processed), whichever is less.

    Every buffer a run sizes by its steps is sized by this, never by a budget past the context: a budget
    of 2^31 - 1 keeps its meaning (the row stops at the context, stop reason "context") without asking
    for 2^31 columns of ids and logits.
    """
    return max(1, min(int(budget), context - len(prompt) + 1))


def check_buffers(
    execution: ModelExecution, prompts, steps: int, per_step: int, extra_state: int = 0, field: str = "max_new_tokens"
) -> None:
    """Refuse, naming `field`, a run whose buffers would pass jgpt.foundation.limits.BUFFER_LIMIT, before any is allocated:
    per row, `per_step` bytes for each of its `steps` columns (ids, kept logits, candidates, a round's log),
    and a KV state of the slots its prompt and steps reach, with `extra_state` more bytes per slot (a draft's
    state, the reference recompute's logits)."""
    a = execution.architecture
    slots = capacity_bucket(min(a.context, max(map(len, prompts)) + steps - 1), a.context)
    per_slot = execution.costs.kv_bytes_per_position + 4 + extra_state  # keys and values, and the slot's id
    total = len(prompts) * (steps * per_step + slots * per_slot)
    check_buffer(total, field, f"{len(prompts)} row(s) of {steps} selectable ids (as many as the context allows)")


def check_generation(
    execution: ModelExecution,
    requests: Sequence[InferenceRequest],
    keep_logits: bool,
    reference: bool,
    field: str = "max_new_tokens",
) -> list[int]:
    """Each request's `selectable` ids, once the run's buffers are known to fit (`check_buffers`): a caller
    that runs requests one at a time (`record`) checks every one of them before running any."""
    context = execution.architecture.context
    reach = [selectable(r.prompt_ids, r.generation.max_new_tokens, context) for r in requests]
    # Per column: the id, the logits kept, a sampled step's candidates; per slot: the reference's logits.
    logits = 4 * execution.architecture.vocabulary
    sampling = any(r.generation.selection == SAMPLE for r in requests)
    per_step = 4 + logits * keep_logits + 8 * TOP_CANDIDATES * sampling
    check_buffers(execution, [r.prompt_ids for r in requests], max(reach), per_step, logits * reference, field)
    return reach


def _plan(
    execution: ModelExecution,
    requests: Sequence[InferenceRequest],
    state: KVState | None,
    keep_logits: bool,
    reference: bool = False,
):
    if not requests:
        raise ApiError("requests", "is empty; nothing to generate")
    prompts = [r.prompt_ids for r in requests]
    budgets = np.asarray([r.generation.max_new_tokens for r in requests], np.int32)
    reach = check_generation(execution, requests, keep_logits, reference)
    # Slots for every position a row can process: its prompt and all selections but the last.
    capacity = max(len(p) + n - 1 for p, n in zip(prompts, reach))
    work_state, window_ids, counts, reused = execution.window(prompts, state, capacity)
    return _Plan(work_state, window_ids, counts, budgets, max(reach), reused, keep_logits, SelectionRule.of(requests))


def _generation(execution, requests, plan: _Plan, ran: _Run, decode_boundary: str, reference, scores) -> Generation:
    """The responses of a run, with their evidence."""
    prompts = [r.prompt_ids for r in requests]
    outputs, logits = ran.output_ids, ran.logits
    references = None
    if reference:
        sequences = [list(p) + list(o[:-1]) for p, o in zip(prompts, outputs)]
        references = execution.full_prefix_logits(sequences)
    responses = []
    for b, request in enumerate(requests):
        n = len(outputs[b])
        errors: list[float | None] = [None] * n
        if references is not None:
            assert logits is not None, "a run compared to its reference keeps its logits"
            last_prompt = len(prompts[b]) - 1
            errors = [float(np.max(np.abs(references[b, last_prompt + k] - logits[b][k]))) for k in range(n)]
        computations = work_computations(execution, request, outputs[b], plan.reused[b], ran.seconds[b], errors,
                                         decode_boundary)  # fmt: skip
        selections = tuple(
            _selection(request, k, t, None if logits is None or not scores else logits[b][k],
                       None if ran.candidates is None else (ran.candidates[0][b][k], ran.candidates[1][b][k]))
            for k, t in enumerate(outputs[b])
        )  # fmt: skip
        output_ids = tuple(outputs[b])
        responses.append(
            InferenceResponse(
                request_id=request.request_id, prompt_ids=tuple(request.prompt_ids), output_ids=output_ids,
                published_ids=tuple(t for t in output_ids if t != execution.turn_end_id),
                outcome=RunOutcome.of(output_ids, int(plan.budgets[b]), ran.stop_reasons[b], execution.turn_end_id),
                selections=selections, computations=computations, work=GenerationWork.total(computations),
                observations=ran.observations.get(b, ()),
            )
        )  # fmt: skip
    return Generation(tuple(responses), ran.state)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a run executes: the state to extend, each row's window of new prompt ids, and the budgets."""

    state: KVState
    window_ids: np.ndarray  # [B, W]
    counts: np.ndarray  # [B] new ids per row
    budgets: np.ndarray  # [B]
    steps: int  # the most ids any row can select (`selectable`): the loop's buffers' width
    reused: list[int]  # per row, the positions of its prompt the given state already held
    keep_logits: bool
    rule: SelectionRule | None  # None: every row greedy


@dataclasses.dataclass(frozen=True)
class _Run:
    output_ids: list[list[int]]  # per row
    stop_reasons: list[str]
    logits: list | None  # per row, [selected, V], when kept
    seconds: list[list[float]]  # per row, per work
    state: KVState
    observations: dict  # row -> TensorObservations
    candidates: tuple | None = (
        None  # per row, the filtered distribution's top (ids [selected, N], probabilities), when sampling
    )


def _run_loop(execution: ModelExecution, plan: _Plan) -> _Run:
    loop = functools.partial(
        _decode_loop, execution.weights, execution.layer_weights, execution.architecture,
        steps=bucket(plan.steps, execution.architecture.context + 1), turn_end_id=execution.turn_end_id,
        keep_logits=plan.keep_logits, unroll=execution.scan_unroll, kernels=execution.kernels,
    )  # fmt: skip
    budgets = jnp.asarray(plan.budgets)
    # Compile both programs first (a budget of one ends the loop at once), so times exclude compilation.
    warm_logits, warm_state = execution.advance(plan.state, plan.window_ids, plan.counts)
    jax.block_until_ready(loop(warm_state, warm_logits, jnp.ones_like(budgets), plan.rule))

    started = time.perf_counter()
    first_logits, state = execution.advance(plan.state, plan.window_ids, plan.counts)
    first_logits.block_until_ready()
    prefill_seconds = time.perf_counter() - started
    started = time.perf_counter()
    outputs, selected, stop, logits, seen, state = jax.block_until_ready(loop(state, first_logits, budgets, plan.rule))
    per_step = (time.perf_counter() - started) / max(1, int(selected.max()) - 1)
    outputs, selected, stop, logits, seen = jax.device_get((outputs, selected, stop, logits, seen))
    rows = range(len(budgets))
    return _Run(
        output_ids=[[int(t) for t in outputs[b, : selected[b]]] for b in rows],
        stop_reasons=[stop_reason(c) for c in stop],
        logits=None if logits is None else [logits[b, : selected[b]] for b in rows],
        seconds=[[prefill_seconds] + [per_step] * (int(selected[b]) - 1) for b in rows],
        state=state,
        observations={},
        candidates=None if seen is None else tuple([part[b, : selected[b]] for b in rows] for part in seen),
    )


def _run_steps(execution: ModelExecution, plan: _Plan, observe_step, observe, on_select) -> _Run:
    """The loop's steps, one jitted work per call, each timed from dispatch to ready (compiled beforehand)."""
    B = len(plan.budgets)
    state, window, active = plan.state, plan.window_ids, plan.counts
    prefix_length = np.asarray(state.lengths) + active
    ids: list[list[int]] = [[] for _ in range(B)]
    logits: list[list[np.ndarray]] = [[] for _ in range(B)]
    seconds: list[list[float]] = [[] for _ in range(B)]
    seen: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(B)]  # per row, each step's candidates
    stop = np.zeros(B, np.int64)
    observations, compiled = {}, set()
    for step in itertools.count():
        if step == observe_step:
            observations = observe(state, window, active)
        if window.shape not in compiled:
            jax.block_until_ready(execution.advance(state, window, active))
            compiled.add(window.shape)
        started = time.perf_counter()
        device_logits, state = execution.advance(state, window, active)
        if plan.rule is None:
            step_logits = np.asarray(device_logits)
            chosen = np.argmax(step_logits, axis=-1).astype(np.int32)
        else:  # the loop's own draw, keyed by each row's selection index
            chosen = np.asarray(select_jit(device_logits, plan.rule, jnp.asarray([len(r) for r in ids], jnp.int32)))
            top = jax.device_get(candidates_jit(device_logits, plan.rule))
            step_logits = np.asarray(device_logits)
        elapsed = time.perf_counter() - started
        for b in np.flatnonzero(active):
            ids[b].append(int(chosen[b]))
            if plan.keep_logits:  # else a long run would hold [steps, V] for nothing
                logits[b].append(step_logits[b])
            if plan.rule is not None:
                seen[b].append((top[0][b], top[1][b]))
            seconds[b].append(elapsed)
            if on_select is not None:
                on_select(int(b), int(chosen[b]))
        selected = np.asarray([len(r) for r in ids])
        a = execution.architecture
        new_stop = stop_codes(np, chosen, selected, plan.budgets, prefix_length, a.context, execution.turn_end_id)
        stop = np.where(active > 0, new_stop, stop)
        if np.all(stop != 0):
            break
        active = (stop == 0).astype(np.int32)
        window = np.asarray([r[-1] for r in ids], np.int32)[:, None]
    candidates = (
        None if plan.rule is None else tuple([np.asarray([c[part] for c in row]) for row in seen] for part in (0, 1))
    )
    kept = logits if plan.keep_logits else None
    return _Run(ids, [stop_reason(c) for c in stop], kept, seconds, state, observations, candidates)


_observed_forward = jax.jit(forward, static_argnames=("architecture", "observe", "unroll", "kernels"))


def _observe(execution, state, window, counts, *, run_id, requests, step):
    """Run one work again with observation on, from the state before it; each active row's tensors."""
    window = jnp.asarray(window, jnp.int32)
    positions = state.lengths[:, None] + jnp.arange(window.shape[1], dtype=jnp.int32)
    out = _observed_forward(
        execution.weights, execution.architecture, window, positions=positions, cache=state.buffers, observe=True,
        unroll=execution.scan_unroll, layer_weights=execution.layer_weights, kernels=execution.kernels.calls(),
    )  # fmt: skip
    return {
        b: tensor_observations(
            out.observations, b, int(counts[b]), run_id=run_id, request_id=requests[b].request_id, step=step
        )
        for b in np.flatnonzero(counts)
    }


def work_computations(execution, request, output_ids, reused, seconds, errors, decode_boundary):
    """The CacheComputation of every work a request executed: its prefill, then one decode per later id.

    decode_boundary: how a decode work's wall time was measured (a prefill is always timed alone).
    """
    costs = execution.costs
    prompt = request.prompt_ids
    works = [(PREFILL, tuple(prompt[reused:]), reused, len(prompt))]
    works += [(DECODE, (t,), len(prompt) + k, len(prompt) + k + 1) for k, t in enumerate(output_ids[:-1])]
    return tuple(
        CacheComputation(
            work_id=f"{request.request_id}/{step}", request_id=request.request_id, step=step, phase=phase,
            input_ids=input_ids, processed_positions=stop - start, reused_positions=start,
            matmul_flops=costs.matmul_flops(start, stop), reference_matmul_flops=costs.reference_matmul_flops(stop),
            logical_memory_bytes=costs.memory_bytes(start, stop), reference_max_abs_error=errors[step],
            wall_time_us=seconds[step] * 1e6,
            measurement_boundary=decode_boundary if phase == DECODE else STEP_BOUNDARY,
        )
        for step, (phase, input_ids, start, stop) in enumerate(works)
    )  # fmt: skip


def _selection(request: InferenceRequest, step: int, selected_id: int, logits, top) -> TokenSelection:
    """One step's evidence: raw scores when kept; for a sampled row, the filtered distribution's top
    candidates and the (seed, stream, step) its key was derived from."""
    scored = {}
    if logits is not None:
        probabilities = np.exp(logits - logits.max())
        scored = {"raw_logits": logits, "probabilities": probabilities / probabilities.sum()}
    policy = request.generation
    if policy.selection != SAMPLE:
        return TokenSelection(selected_id, **scored)
    key = {"seed": policy.seed, "stream": request_stream(request), "step": step}
    ranked = tuple((int(i), float(p)) for i, p in zip(*top) if p > 0)
    return TokenSelection(selected_id, rule=SAMPLE, rng_state=key, candidates=ranked, **scored)
