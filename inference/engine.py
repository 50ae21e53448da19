"""InferenceEngine: a Workload served against the wall clock, with kvsim's scheduling and KV pool rules.

The engine composes request scheduling, the KV state pool (`StateManager`),
model execution and decoding (greedy, or each request's seeded sampling) against one ModelExecution. It takes the
same decisions kvsim's discrete-event engine takes (`kvsim/engine.py`, laid out
here handler by handler so the two read side by side), but every duration is
measured: a work runs when it is dispatched, and its end becomes a happening at
the time it actually ended.

Happenings are taken in (time, sequence number) order, as in kvsim: declared
arrivals and customer actions at their offsets from the run's start (the engine
sleeps until just before the next one when idle), and the ends of works at their measured
times. The engine is synchronous: a work blocks the loop while it runs, so an
arrival that falls inside a work is seen, in its place in the order, as soon as
the work returns. Transfers (offload, reload) run synchronously on the loop too,
one at a time in FIFO order; kvsim's link runs concurrently with compute.

Execution uses fixed compiled shapes (`inference/slot_execution.py`), all
compiled before the clock starts; the engine counts any XLA compilation while
the clock runs, and pauses Python's garbage collector while it runs. Retained
states move between the slot rows and their
exact-length arrays through host numpy slicing and padding, which compiles
nothing per length.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import heapq
import time
from collections import deque
from collections.abc import Callable, Sequence

import jax
import numpy as np

from inference.execution import ModelExecution, bucket
from inference.generation import stop_codes, stop_reason
from inference.policy import STOP_TURN_END, InferenceRequest, check_prompt
from inference.recorded_computations import read_workload
from inference.slot_execution import EnginePlan, SlotExecution, batch_bucket
from inference.state_manager import (
    DEVICE,
    HOST,
    RetainedState,
    StateManager,
    check_budget,
    nbytes,
    to_device,
    to_host,
    token_key,
)
from jgpt.foundation.errors import ApiError
from jgpt.model.kv_state import KVState
from kvsim import CustomerInteraction, KVResidencySystemConfig, check_wall_clock, parse_interaction

_ARRIVE, _ACTION, _COMPUTE_END, _TRANSFER_END = range(4)
DEVICE_TO_HOST, HOST_TO_DEVICE = "device_to_host", "host_to_device"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# The last stretch before a declared happening is waited for busily: a sleep to the happening itself
# overslept by 130-170 us (median; up to 3.6 ms) on the quiet 2-core machine, and the engine is the
# instrument that says when the happening was seen.
SPIN_US = 2000


class _Scalars:
    """`stop_codes` over plain ints: numpy's `where` costs ~20 us a call, per row per step."""

    where = staticmethod(lambda condition, chosen, otherwise: chosen if condition else otherwise)


# -- what a run returns -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ServedRequest:
    request: InferenceRequest
    outcome: dict  # kvsim's outcome keys
    output_ids: tuple[int, ...]
    reused: int
    work_seconds: tuple[float, ...]  # the wall time of each work the request took part in (prefill, decodes)
    stop_reason: str | None  # the generation's stop reason, when it ran to one


@dataclasses.dataclass(frozen=True)
class ServedRun:
    plan: EnginePlan
    compiled_programs: int
    compile_wall_us: int
    compiles_during_run: int
    as_fast_as_possible: bool
    requests: tuple[ServedRequest, ...]  # in arrival order
    works: tuple[dict, ...]
    busy_us: int
    end_us: int
    moved: dict  # bytes per direction
    counts: dict  # offload, reload, drop


# -- the serving loop -----------------------------------------------------------------------------------------


class _Request:
    __slots__ = (
        "spec", "arrival", "key", "reservation", "reused", "reuse_tier", "step", "cancel", "ended",
        "admitted_us", "first_token_us", "published", "output", "held", "row", "seconds", "stop_reason", "outcome",
    )  # fmt: skip

    def __init__(self, spec: InferenceRequest, arrival: int):
        self.spec = spec
        self.arrival = arrival
        self.key = token_key(spec.prompt_ids)
        self.reservation = 0
        self.reused = 0
        self.reuse_tier: str | None = None
        self.step = 0  # 0: prefill next; k: decode step k-1 next (k ids selected)
        self.cancel = False  # a cancel waits for the next step boundary
        self.ended = False
        self.admitted_us: int | None = None
        self.first_token_us: int | None = None
        self.published = 0
        self.output: list[int] = []
        self.held: tuple | None = None  # the reused prefix's (keys, values) until the prefill consumes them
        self.row: int | None = None  # slot row, from the prefill to the end
        self.seconds: list[float] = []
        self.stop_reason: str | None = None
        self.outcome: dict | None = None


# A work as recorded, before its start and end: kind, requests, executed rows, window, processed and reused
# positions, matmul flops, logical memory bytes, bytes moved.
_Work = tuple[str, list[_Request], int, int, int, int, int, int, int]


class _Serving:
    def __init__(
        self, execution: ModelExecution, system: KVResidencySystemConfig, plan: EnginePlan, observe,
        as_fast_as_possible: bool = False,
    ):  # fmt: skip
        self.execution = execution
        # Nothing waits for a declared time: a happening due later is taken as soon as it is the next one.
        self.as_fast_as_possible = as_fast_as_possible
        self.system = system
        self.plan = plan
        self.observe = observe
        self.retain_states = system.kv_cache.retention_policy == "lru"
        self.batching = plan.batching
        self.kv_bytes = execution.costs.kv_bytes_per_position
        self.pool = StateManager(system.kv_cache, self.kv_bytes)
        self.requests: dict[str, _Request] = {}
        self.heap: list[tuple] = []
        self.sequence = 0
        self.now = 0
        self.started_ns = 0
        self.waiting: deque[_Request] = deque()
        self.in_system = 0
        self.active = 0
        self.ready: deque[_Request] = deque()
        self.compute_busy = False
        self.busy_us = 0
        self.link: deque[tuple] = deque()  # (direction, state, request)
        self.link_busy = False
        self.works: list[dict] = []
        self.moved = {DEVICE_TO_HOST: 0, HOST_TO_DEVICE: 0}
        self.counts = {"offload": 0, "reload": 0, "drop": 0}
        self.rows: list[_Request] = []  # slot row -> its request; active rows are [0, len)
        self.programs = SlotExecution(execution, plan)
        self.slots = self.programs.empty_slots()
        self.empty_start = self.programs.empty_start()

    # -- the clock -------------------------------------------------------

    def clock(self) -> int:
        return (time.monotonic_ns() - self.started_ns) // 1000

    def schedule(self, time_us: int, what: int, payload) -> None:
        heapq.heappush(self.heap, (time_us, self.sequence, what, payload))
        self.sequence += 1

    # -- main loop -------------------------------------------------------

    def run(self, requests: list[_Request], actions: list) -> None:
        declared = [(r.arrival, i, _ARRIVE, r) for i, r in enumerate(requests)]
        declared += [(a.at_us, len(declared) + j, _ACTION, a) for j, a in enumerate(actions)]
        declared.sort()
        self.sequence = len(declared)
        heap, position = self.heap, 0
        self.started_ns = time.monotonic_ns()
        while position < len(declared) or heap:
            if heap and (position == len(declared) or heap[0] < declared[position]):
                self.now, _, what, payload = heapq.heappop(heap)  # a work's measured end
            else:
                at, _, what, payload = declared[position]
                position += 1
                while not self.as_fast_as_possible and (late := at - self.clock()) > 0:
                    if late > SPIN_US:
                        time.sleep((late - SPIN_US) / 1e6)
                self.now = self.clock()  # when the engine sees it
            if what == _COMPUTE_END:
                self.on_compute_end(payload)
            elif what == _ARRIVE:
                self.on_arrival(payload)
            elif what == _TRANSFER_END:
                self.on_transfer_end(payload)
            else:
                self.on_action(payload)
            if self.observe is not None:
                self.observe(self.audit())

    def audit(self) -> tuple[int, int]:
        """The pool's invariants checked against the arrays held; the measured (device, host) bytes."""
        active = []
        for request in self.requests.values():
            if request.admitted_us is None or request.ended:
                continue
            positions = len(request.spec.prompt_ids) + request.step - 1
            held = nbytes(request.held) if request.row is None else positions * self.kv_bytes
            active.append((request.spec.request_id, request.reservation, held))
        return check_budget(self.pool, active)

    def on_arrival(self, request: _Request) -> None:
        spec, system = request.spec, self.system
        self.requests[spec.request_id] = request
        budget = spec.generation.max_new_tokens
        request.reservation = (len(spec.prompt_ids) + budget - 1) * self.kv_bytes
        reason = None
        if budget > system.max_new_tokens_cap:
            reason = f"max_new_tokens {budget} > max_new_tokens_cap {system.max_new_tokens_cap}"
        elif self.in_system >= system.max_requests:
            reason = f"max_requests {system.max_requests} already in the system"
        elif request.reservation > system.kv_cache.device_kv_bytes:
            reason = f"reservation {request.reservation} bytes > device_kv_bytes {system.kv_cache.device_kv_bytes}"
        if reason is not None:
            request.ended = True
            request.outcome = self.outcome(request, "rejected", reason)
            return
        self.in_system += 1
        self.waiting.append(request)
        self.admit()
        self.dispatch()

    def on_action(self, action) -> None:
        if action.kind != "cancel":
            return  # consume: the engine publishes every id as it is selected; nothing to wait for
        request = self.requests.get(action.request_id)
        if request is None or request.ended or request.cancel:
            return  # not yet arrived, already over, or already cancelling: intent without effect
        if request.admitted_us is None:
            self.in_system -= 1
            self.finish(request, "cancel", "cancelled while waiting", admitted=False)
            self.admit()
        elif request in self.ready:
            self.ready.remove(request)
            self.finish(request, "cancel", "cancelled between steps")
        else:
            request.cancel = True  # running or reloading: honoured at the next step boundary
        self.dispatch()

    # -- admission and residency ------------------------------------------

    def admit(self) -> None:
        """FIFO admission of waiting requests while slots and device bytes allow."""
        pool = self.pool
        while self.waiting and self.active < self.system.scheduling.max_active_requests:
            request = self.waiting[0]
            if request.ended:
                self.waiting.popleft()
                continue
            state = pool.lookup(request.key) if self.retain_states else None
            credit = state.size if state is not None and state.tier == DEVICE else 0
            need = request.reservation - credit
            if need > pool.device_free():
                shortfall = need - pool.device_free() - pool.offloading_bytes
                evictable = pool.device_lru_bytes - credit
                if shortfall <= 0 or evictable < shortfall:
                    return  # wait for offloads in flight, or for active requests to release
                self.evict(shortfall, state, request)
                continue
            self.waiting.popleft()
            self.active += 1
            request.admitted_us = self.now
            if state is not None:
                request.reused, request.reuse_tier = state.positions, HOST if state.tier != DEVICE else DEVICE
                pool.take(state)
            pool.reserved += request.reservation
            if request.reuse_tier == HOST:
                assert state is not None, "a reuse tier is set only where a state was taken"
                self.enqueue_transfer(HOST_TO_DEVICE, state, request)
            else:
                request.held = None if state is None else state.device
                self.ready.append(request)

    def evict(self, shortfall: int, keep: RetainedState | None, request: _Request) -> None:
        """Move least recently used device states out until `shortfall` bytes will be free."""
        pool = self.pool
        while shortfall > 0:
            oldest = iter(pool.device_lru.values())
            state = next(oldest)
            if state is keep:
                state = next(oldest)
            shortfall -= state.size
            kept_on_host = keep.size if keep is not None and keep.tier == HOST else 0
            if state.size <= pool.host_free() + pool.host_lru_bytes - kept_on_host:
                while pool.host_free() < state.size:  # least recently used host states make room
                    pool.drop_from_host(next(s for s in pool.host_lru.values() if s is not keep))
                    self.counts["drop"] += 1
                pool.begin_offload(state)
                self.counts["offload"] += 1
                self.enqueue_transfer(DEVICE_TO_HOST, state, request)
            else:
                pool.drop_from_device(state)
                self.counts["drop"] += 1

    def enqueue_transfer(self, direction: str, state: RetainedState, request: _Request) -> None:
        self.link.append((direction, state, request))
        if direction == HOST_TO_DEVICE:
            self.counts["reload"] += 1
        if not self.link_busy:
            self.start_transfer()

    def start_transfer(self) -> None:
        direction, state, request = transfer = self.link.popleft()
        started = self.clock()
        if direction == DEVICE_TO_HOST:
            state.host = to_host(state.device)
        else:
            state.device = jax.block_until_ready(to_device(state.host))
        ended = self.clock()
        self.link_busy = True
        kind = "offload" if direction == DEVICE_TO_HOST else "reload"
        self.record_work(kind, [request], 0, 0, 0, 0, 0, 0, state.size, started, ended)
        self.schedule(ended, _TRANSFER_END, transfer)

    def on_transfer_end(self, transfer: tuple) -> None:
        direction, state, request = transfer
        self.moved[direction] += state.size
        if direction == DEVICE_TO_HOST:
            self.pool.end_offload(state)
        else:
            request.held = self.pool.end_reload(state)
        self.link_busy = False
        if self.link:
            self.start_transfer()
        if direction == HOST_TO_DEVICE:
            if request.cancel:
                self.finish(request, "cancel", "cancelled at reload end")
            else:
                self.ready.append(request)
        else:
            self.admit()
        self.dispatch()

    # -- service ---------------------------------------------------------

    def dispatch(self) -> None:
        """Run the next service step if the compute resource is idle (round-robin over ready requests)."""
        if self.compute_busy or not self.ready:
            return
        head = self.ready.popleft()
        if self.batching and head.step > 0:
            batch = [head, *(r for r in self.ready if r.step > 0)]
            self.ready = deque(r for r in self.ready if r.step == 0)
        else:
            batch = [head]
        started = self.clock()
        if head.step == 0:
            chosen, work = self.prefill(head)
        else:
            chosen, work = self.decode(batch)
        ended = self.clock()
        self.compute_busy = True
        self.busy_us += ended - started
        self.record_work(*work, started=started, ended=ended)
        self.schedule(ended, _COMPUTE_END, (batch, chosen, ended - started))

    def prefill(self, request: _Request) -> tuple[list[int], _Work]:
        e, prompt, reused = self.execution, request.spec.prompt_ids, request.reused
        start = self.empty_start if request.held is None else self.start_state(request, request.held)
        count = len(prompt) - reused
        window = np.zeros((1, bucket(count, e.architecture.context)), np.int32)
        window[0, :count] = prompt[reused:]
        request.row = len(self.rows)
        self.rows.append(request)
        rule = self.programs.rule([request.spec])
        chosen, self.slots = self.programs.prefill_into(self.slots, start, window, count, request.row, rule)
        request.held = None
        costs = e.costs
        work = ("prefill", [request], 1, window.shape[1], count, reused, costs.matmul_flops(reused, len(prompt)),
                costs.memory_bytes(reused, len(prompt)), 0)  # fmt: skip
        return [int(np.asarray(chosen)[0])], work

    def start_state(self, request: _Request, held: tuple) -> KVState:
        """The reused prefix in a batch-of-one state of C slots, assembled on the host (no per-length compile)."""
        n, template = request.reused, self.empty_start
        keys, values = (np.zeros(template.keys.shape, template.keys.dtype) for _ in range(2))
        keys[:, 0, :, :n], values[:, 0, :, :n] = (np.asarray(x) for x in held)
        token_ids = np.zeros((1, self.plan.slot_capacity), np.int32)
        token_ids[0, :n] = request.spec.prompt_ids[:n]
        lengths = np.asarray([n], np.int32)
        return template.replace(**jax.device_put(dict(keys=keys, values=values, token_ids=token_ids, lengths=lengths)))

    def decode(self, batch: list[_Request]) -> tuple[list[int], _Work]:
        costs = self.execution.costs
        positions = [len(r.spec.prompt_ids) + r.step - 1 for r in batch]
        if self.batching:
            rows = batch_bucket(len(self.rows))
            ids, counts, steps = np.zeros(rows, np.int32), np.zeros(rows, np.int32), np.zeros(rows, np.int32)
            specs: list[InferenceRequest | None] = [None] * rows
            for request in batch:
                assert request.row is not None, "a request decodes in the row its prefill gave it"
                ids[request.row], counts[request.row], steps[request.row] = request.output[-1], 1, request.step
                specs[request.row] = request.spec
            rule = self.programs.rule(specs)
            chosen, self.slots = self.programs.decode_rows(
                self.slots, ids, counts, rule, None if rule is None else steps
            )
            chosen = np.asarray(chosen)  # the one host read of the step
            selected = [int(chosen[r.row]) for r in batch]
        else:
            (request,) = batch
            rows = 1
            assert request.row is not None, "a request decodes in the row its prefill gave it"
            rule = self.programs.rule([request.spec])
            chosen, self.slots = self.programs.decode_row(
                self.slots, request.row, request.output[-1], rule, request.step
            )
            selected = [int(np.asarray(chosen)[0])]
        # A batch reads the fixed bytes of a work (the weights) once, not once per request.
        memory = sum(costs.memory_bytes(p, p + 1) for p in positions) - costs.fixed_memory_bytes * (len(batch) - 1)
        flops = sum(costs.matmul_flops(p, p + 1) for p in positions)
        return selected, ("decode", batch, rows, 1, len(batch), sum(positions), flops, memory, 0)

    def on_compute_end(self, work: tuple) -> None:
        batch, chosen, elapsed_us = work
        self.compute_busy = False
        context, turn_end = self.execution.architecture.context, self.execution.turn_end_id
        for request, selected in zip(batch, chosen, strict=True):
            spec = request.spec
            request.output.append(selected)
            request.seconds.append(elapsed_us / 1e6)
            request.step += 1
            if request.first_token_us is None:
                request.first_token_us = self.now
            if selected != turn_end:
                request.published += 1
            budget, prompt = spec.generation.max_new_tokens, len(spec.prompt_ids)
            code = stop_codes(_Scalars, selected, request.step, budget, prompt, context, turn_end)
            if code:
                request.stop_reason = stop_reason(code)
                self.finish(
                    request, "complete" if request.stop_reason == STOP_TURN_END else "stop", request.stop_reason
                )
            elif request.cancel:
                self.finish(request, "cancel", "cancelled at step boundary")
            else:
                self.ready.append(request)
        self.dispatch()

    def finish(self, request: _Request, kind: str, reason: str, admitted: bool = True) -> None:
        """The request ends exactly once: release its reservation and retain what it computed."""
        spec, pool = request.spec, self.pool
        request.ended = True
        request.outcome = self.outcome(
            request, {"complete": "completed", "stop": "stopped"}.get(kind, "cancelled"), reason
        )
        if not admitted:
            return
        self.active -= 1
        self.in_system -= 1
        pool.reserved -= request.reservation
        computed = len(spec.prompt_ids) + request.step - 1 if request.step > 0 else request.reused
        if self.retain_states and computed > 0:
            key = token_key((*spec.prompt_ids, *request.output)[:computed])
            if not pool.has(key):
                if request.row is None:  # not prefilled: what it computed is the reused prefix it holds
                    assert request.held is not None, "an admitted request with reused positions holds them"
                    arrays = request.held
                else:
                    arrays = self.row_arrays(request.row, computed)
                pool.retain(key, spec.request_id, arrays)
        request.held = None
        if request.row is not None:
            self.release_row(request)
        self.admit()

    def row_arrays(self, row: int, positions: int) -> tuple[jax.Array, jax.Array]:
        """A row's first `positions` slots as exact-length device arrays [layers, kv_heads, positions, head_dim]."""
        one = self.programs.extract_row(self.slots, row)
        keys, values = (np.asarray(x)[:, 0, :, :positions] for x in (one.keys, one.values))
        return to_device((keys, values))

    def release_row(self, request: _Request) -> None:
        """Keep the active rows compacted: the last active row moves into the freed one."""
        last = self.rows.pop()
        if last is not request:
            assert last.row is not None and request.row is not None, "both are active rows"
            self.slots = self.programs.move_row(self.slots, last.row, request.row)
            last.row = request.row
            self.rows[request.row] = last
        request.row = None

    def record_work(self, kind, requests, rows, window, processed, reused, flops, memory, size, started, ended) -> None:
        self.works.append({
            "work_id": len(self.works), "kind": kind, "request_ids": [r.spec.request_id for r in requests],
            "rows": len(requests), "executed_rows": rows, "window": window, "processed_positions": processed,
            "reused_positions": reused, "matmul_flops": flops, "logical_memory_bytes": memory, "bytes": size,
            "start_us": started, "end_us": ended, "wall_us": ended - started,
        })  # fmt: skip

    def outcome(self, request: _Request, status: str, reason: str) -> dict:
        spec, now = request.spec, self.now
        selected, first = request.step, request.first_token_us
        tpot = None
        if selected >= 2:
            assert first is not None, "the first selected id set first_token_us"
            tpot = round((now - first) / (selected - 1), 3)
        return {
            "status": status,
            "stop_reason": reason,
            "arrival_us": request.arrival,
            "admitted_us": request.admitted_us,
            "first_token_us": first,
            "end_us": now,
            "queueing_us": None if request.admitted_us is None else request.admitted_us - request.arrival,
            "ttft_us": None if first is None else first - request.arrival,
            "tpot_us": tpot,
            "e2e_us": now - request.arrival,
            "prompt_positions": len(spec.prompt_ids),
            "reuse_positions": request.reused,
            "reuse_tier": request.reuse_tier,
            "selected_tokens": selected,
            "published_tokens": request.published,
            "unused_budget": spec.generation.max_new_tokens - selected,
            "complete": status == "completed",
            "output_ids": list(request.output),
        }


@dataclasses.dataclass(frozen=True)
class InferenceEngine:
    """Serves Workloads for one ModelExecution under one KVResidencySystemConfig."""

    execution: ModelExecution
    system: KVResidencySystemConfig

    def serve(
        self,
        requests: Sequence[InferenceRequest],
        interaction: CustomerInteraction | None = None,
        *,
        as_fast_as_possible: bool = False,
        observe: Callable[[tuple[int, int]], None] | None = None,
    ) -> ServedRun:
        """Compile every program the run can need, then serve the requests against the wall clock.

        observe: called after every happening with the measured (device, host) KV bytes, once the
        pool's invariants have been checked against the arrays it holds (an AssertionError if not).
        """
        check_declared_times(requests, interaction)
        plan = EnginePlan.of(self.execution.architecture.context, self.system, requests)
        plan.check_memory(self.execution, self.system, len(requests))
        serving = _Serving(self.execution, self.system, plan, observe, as_fast_as_possible)
        serving.slots, compiled, compile_wall_us = serving.programs.compile(serving.slots)
        ordered = [_Request(r, 0 if as_fast_as_possible else r.arrival_us) for r in requests]
        compiles: list[str] = []

        def listener(event: str, duration_secs: float, **kwargs: str | int) -> None:
            if event == COMPILE_EVENT:
                compiles.append(event)

        jax.monitoring.register_event_duration_secs_listener(listener)
        try:
            with collector_paused():
                serving.run(ordered, list(interaction.actions) if interaction else [])
        finally:
            jax.monitoring.unregister_event_duration_listener(listener)
        served = tuple(_served(r) for r in ordered)
        end_us = max([serving.now, *(w["end_us"] for w in serving.works)])
        return ServedRun(
            plan, compiled, compile_wall_us, len(compiles), as_fast_as_possible, served, tuple(serving.works),
            serving.busy_us, end_us, dict(serving.moved), dict(serving.counts),
        )  # fmt: skip


def check_declared_times(requests: Sequence[InferenceRequest], interaction: CustomerInteraction | None) -> None:
    """Refuse an arrival or action the wall clock would wait for past kvsim.workload.WALL_CLOCK_LIMIT_US
    (whatever read the workload: `serve` reads a schema that already bounds them, a lab its own)."""
    for request in requests:
        check_wall_clock(request.arrival_us, f"request {request.request_id!r}: arrival_us")
    for index, action in enumerate(interaction.actions if interaction else ()):
        check_wall_clock(action.at_us, f"customer_interaction.actions[{index}].at_us")


def _served(request: _Request) -> ServedRequest:
    outcome = request.outcome
    assert outcome is not None, "a run ends once every request has ended, each with its outcome"
    return ServedRequest(
        request.spec, outcome, tuple(request.output), request.reused, tuple(request.seconds), request.stop_reason
    )


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while the clock runs, as servers run it: a collection would
    stall whichever work it fell in. What exists before is collected and frozen (kept out of every later
    collection); the run's own cycles wait for the collector's return (reference counting frees the rest)."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def read_served_workload(
    document, tokenizer, execution: ModelExecution
) -> tuple[tuple[InferenceRequest, ...], CustomerInteraction | None]:
    """The requests of a Workload document and its optional customer interaction, refused where kvsim
    would refuse them (same field names)."""
    requests = read_workload(document, tokenizer)
    a = execution.architecture
    for request in requests:
        check_prompt(request.prompt_ids, a.vocabulary, a.context, f"request {request.request_id!r}: prompt_ids")
    if document.get("customer_interaction") is None:
        return requests, None
    interaction = parse_interaction(document["customer_interaction"])
    known = {r.request_id for r in requests}
    for index, action in enumerate(interaction.actions):
        if action.kind == "submit":
            raise ApiError(
                "customer_interaction.actions", "give arrivals either as a workload or as submit actions, not both"
            )
        if action.request_id not in known:
            raise ApiError(
                f"customer_interaction.actions[{index}].request_id", f"unknown request {action.request_id!r}"
            )
    return requests, interaction
