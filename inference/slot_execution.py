"""SlotExecution: the fixed-shape jitted programs the InferenceEngine serves with.

Active requests own rows of one **slot** KVState of R rows and C slots (R a
power of two at least the active requests, C the capacity bucket of the most
positions any request can reach). A prefill runs alone on a batch-of-one state
of C slots (ModelExecution's program, its window bucketed as
`ModelExecution.window` buckets prompts) and its row is written into the slots; a batched decode step runs the first
`batch_bucket(n)` rows in one call; a serialized step runs one row; a finished
row is extracted (to retain its state) and the last active row moved into it.
Every program takes the slot state donated, so XLA updates it in place, and
selects ids on the device (argmax; when a request of the plan samples, the
decode programs take every row's SelectionRule and the index of the id it selects,
`inference/sampling.py`, so a request draws what `generate` draws). `compile` runs each program of a plan once,
so a run never waits on a compile.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from inference.execution import ModelExecution, advance, bucket, capacity_bucket
from inference.policy import SAMPLE, InferenceRequest
from inference.sampling import SelectionRule, select, select_jit
from jgpt.foundation.limits import check_buffer
from jgpt.model.kv_state import KVState
from kvsim import CONTINUOUS_BATCHING, KVResidencySystemConfig


def batch_bucket(n: int) -> int:
    """Rows a batched decode step runs for n active rows: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


def _row_axes(state: KVState) -> KVState:
    """The row (batch) axis of each leaf."""
    return state.replace(keys=1, values=1, token_ids=0, lengths=0)


def _rows(state: KVState, start, n: int) -> KVState:
    return jax.tree.map(lambda x, axis: jax.lax.dynamic_slice_in_dim(x, start, n, axis), state, _row_axes(state))


def _put_rows(state: KVState, part: KVState, start) -> KVState:
    axes = _row_axes(state)
    return jax.tree.map(lambda x, y, axis: jax.lax.dynamic_update_slice_in_dim(x, y, start, axis), state, part, axes)


@functools.partial(jax.jit, donate_argnames="slots")
def _insert_row(slots, one, row):
    return _put_rows(slots, one, row)


@functools.partial(jax.jit, static_argnames=("architecture", "rows", "unroll", "kernels"), donate_argnames="slots")
def _decode_rows(weights, layer_weights, architecture, slots, ids, counts, rule, steps, *, rows, unroll, kernels):
    """One decode step of the first `rows` rows; rows with count 0 keep their length. rule: None (greedy)
    or the rows' SelectionRule, with `steps` the index of the id each row selects."""
    part = _rows(slots, 0, rows)
    logits, part = advance(weights, architecture, part, ids[:, None], counts, unroll, layer_weights, kernels)
    return select(logits, rule, steps), _put_rows(slots, part, 0)


@functools.partial(jax.jit, static_argnames=("architecture", "unroll", "kernels"), donate_argnames="slots")
def _decode_row(weights, layer_weights, architecture, slots, row, token, rule, step, *, unroll, kernels):
    """One decode step of one row alone (serialized service)."""
    one = jnp.ones((1,), jnp.int32)
    part = _rows(slots, row, 1)
    logits, part = advance(weights, architecture, part, token.reshape(1, 1), one, unroll, layer_weights, kernels)
    return select(logits, rule, step.reshape(1)), _put_rows(slots, part, row)


@jax.jit
def _extract_row(slots, row):
    return _rows(slots, row, 1)


@functools.partial(jax.jit, donate_argnames="slots")
def _move_row(slots, source, target):
    return _put_rows(slots, _rows(slots, source, 1), target)


@dataclasses.dataclass(frozen=True)
class EnginePlan:
    """Every shape a run can need, from its system and requests."""

    slot_rows: int  # R
    slot_capacity: int  # C
    prefill_window_buckets: tuple[int, ...]
    decode_batch_buckets: tuple[int, ...]  # (1,) when serialized: one row decodes alone
    batching: bool
    sampling: bool = False  # some request samples: every selection takes the rows' SelectionRule

    @classmethod
    def of(cls, context: int, system: KVResidencySystemConfig, requests: Sequence[InferenceRequest]):
        """The shapes serving `requests` under `system` can need, for a model of `context` positions."""
        most = max(len(r.prompt_ids) + r.generation.max_new_tokens - 1 for r in requests)
        longest = max(len(r.prompt_ids) for r in requests)
        sampling = any(r.generation.selection == SAMPLE for r in requests)
        return cls.shaped(context, system, most, longest, len(requests), sampling)

    @classmethod
    def for_any_request(cls, context: int, system: KVResidencySystemConfig):
        """The shapes any request `system` admits can need, known before any arrives (live serving): prompts up
        to the context, budgets up to the system's cap, a row for each request it may run at once, sampling."""
        most = context - 1 + system.max_new_tokens_cap
        return cls.shaped(context, system, most, context, system.scheduling.max_active_requests, True)

    @classmethod
    def shaped(cls, context: int, system: KVResidencySystemConfig, most: int, longest: int, count: int, sampling: bool):
        """The plan for `count` requests reaching at most `most` positions, with prompts of at most `longest`."""
        rows = batch_bucket(min(system.scheduling.max_active_requests, count))
        windows = sorted({bucket(n, context) for n in range(1, longest + 1)})
        batching = system.scheduling.policy == CONTINUOUS_BATCHING
        batches = tuple(1 << i for i in range(rows.bit_length())) if batching else (1,)
        return cls(rows, capacity_bucket(min(most, context), context), tuple(windows), batches, batching, sampling)

    def slot_buffer_bytes(self, execution: ModelExecution) -> int:
        return self.slot_rows * self.slot_capacity * execution.costs.kv_bytes_per_position

    def check_memory(self, execution: ModelExecution, system: KVResidencySystemConfig, requests: int) -> None:
        """Refuse, before anything is allocated or compiled, a plan whose KV arrays would pass
        jgpt.foundation.limits.BUFFER_LIMIT: the slot state (its keys, values and ids; a prefill's start state of one row),
        then with it the states the pool may retain (at most its device and host budgets, and at most one
        state of C slots per request)."""
        per_slot = execution.costs.kv_bytes_per_position + 4
        slots = (self.slot_rows + 1) * self.slot_capacity * per_slot
        active = system.scheduling.max_active_requests
        shape = f"a slot state of {self.slot_rows} rows of {self.slot_capacity} slots"
        check_buffer(slots, "scheduling.max_active_requests", f"{active} active requests ({shape})")
        if system.kv_cache.retention_policy == "none":
            return
        device, host = system.kv_cache.device_kv_bytes, system.kv_cache.host_kv_bytes
        retained = min(device + host, requests * self.slot_capacity * execution.costs.kv_bytes_per_position)
        field = f"kv_cache.{'device' if device >= host else 'host'}_kv_bytes"
        what = f"the slot state ({slots:,} bytes) and up to {retained:,} bytes of states retained under both budgets"
        check_buffer(slots + retained, field, what)


@dataclasses.dataclass(frozen=True)
class SlotExecution:
    """One model's slot programs under one plan; every method returns the new slot state."""

    execution: ModelExecution
    plan: EnginePlan

    def _bound(self, program, *args, **static):
        e = self.execution
        return program(e.weights, e.layer_weights, e.architecture, *args, unroll=e.scan_unroll, kernels=e.kernels,
                       **static)  # fmt: skip

    def empty_slots(self) -> KVState:
        return self.execution.empty_state(self.plan.slot_rows, self.plan.slot_capacity)

    def empty_start(self) -> KVState:
        return self.execution.empty_state(1, self.plan.slot_capacity)

    def prefill_into(self, slots, start: KVState, window_ids: np.ndarray, count: int, row: int, rule=None):
        """(first id [1], slots): `count` ids of `window_ids [1, W]` processed after `start`'s prefix, into `row`.

        The prefill is ModelExecution's own program (it depends on the window and C, not on the slot rows);
        the row is written by a second, cheap one. rule: the request's SelectionRule when the plan samples.
        """
        logits, state = self.execution.advance(start, window_ids, np.asarray([count], np.int32))
        slots = _insert_row(slots, state, row)
        if rule is None:
            return np.argmax(np.asarray(logits), axis=-1), slots
        return np.asarray(select_jit(logits, rule, jnp.zeros((1,), jnp.int32))), slots

    def decode_rows(self, slots, ids: np.ndarray, counts: np.ndarray, rule=None, steps=None):
        """(ids [rows], slots): one decode step of the first len(ids) rows (count 0: the row keeps its length);
        rule and steps [rows] when the plan samples."""
        return self._bound(_decode_rows, slots, ids, counts, rule, steps, rows=len(ids))

    def decode_row(self, slots, row: int, token: int, rule=None, step: int = 0):
        """(id [1], slots): one decode step of one row."""
        return self._bound(_decode_row, slots, row, np.int32(token), rule, np.int32(step))

    def rule(self, requests: Sequence[InferenceRequest | None]) -> SelectionRule | None:
        """The SelectionRule of these rows (None: an unused row) when the plan samples, else None."""
        return SelectionRule.of(requests, always=True) if self.plan.sampling else None

    def extract_row(self, slots, row: int) -> KVState:
        return _extract_row(slots, row)

    def move_row(self, slots, source: int, target: int) -> KVState:
        return _move_row(slots, source, target)

    def compile(self, slots: KVState) -> tuple[KVState, int, int]:
        """Run every program of the plan once: (slots, programs, wall microseconds)."""
        plan, started, programs = self.plan, time.monotonic_ns(), 0
        for window in plan.prefill_window_buckets:
            _, slots = self.prefill_into(
                slots, self.empty_start(), np.zeros((1, window), np.int32), 1, 0, self.rule([None])
            )
            programs += 1
        if plan.batching:
            for rows in plan.decode_batch_buckets:
                zeros = np.zeros(rows, np.int32)
                _, slots = self.decode_rows(
                    slots, zeros, zeros, self.rule([None] * rows), None if not plan.sampling else zeros
                )
                programs += 1
        else:
            _, slots = self.decode_row(slots, 0, 0, self.rule([None]))
            programs += 1
        jax.block_until_ready(self.extract_row(slots, 0))
        slots = jax.block_until_ready(self.move_row(slots, 0, 0))
        return slots, programs + 3, (time.monotonic_ns() - started) // 1000  # + insert, extract, move
