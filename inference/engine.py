"""InferenceEngine: a Workload served against the wall clock, deciding with kvsim's serving policy.

Admission, retention, eviction and the tier moves are decided by kvsim's
KVResidency policy, the very one kvsim's discrete-event engine drives with its
virtual clock (`kvsim/kv_residency.py`). The engine drives it with the wall
clock and carries out its decisions: it keeps the retained states' arrays (the
`StateManager`), runs model execution and decoding (greedy, or each request's
seeded sampling) against one ModelExecution, and measures every duration: a
work runs when it is dispatched, and its end becomes a happening at the time it
actually ended.

Happenings are taken in (time, sequence number) order, as in kvsim: declared
arrivals and customer actions at their offsets from the run's start (the engine
sleeps until just before the next one when idle), and the ends of works at their measured
times. Live (`InferenceEngine.live`, for `jgpt serve --http`), the same loop takes
arrivals and cancels as they come instead (inference/happenings.py), at the times
they happened, publishes every id as it is selected and each request's outcome
(inference/live_traffic.py), and runs until the traffic is closed and every
request in it has ended; its plan is compiled for any request the system admits.
The engine is synchronous: a work blocks the loop while it runs, so an arrival
that falls inside a work is seen, in its place in the order, as soon as the work
returns. Transfers (offload, reload) run synchronously on the loop too,
one at a time in FIFO order; kvsim's link runs concurrently with compute.

Execution runs on the active requests' rows of one slot state
(`inference/slot_rows.py`) in fixed compiled shapes
(`inference/slot_execution.py`), all compiled before the clock starts; the
engine counts any XLA compilation while the clock runs, and pauses Python's
garbage collector while it runs (live, a server running for long, it only freezes
what existed before).

A little over 500 lines, on purpose: the live loop and the timed one are one loop here, and
`collector_paused` stays beside them because bench/fidelity.py patches it in this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import heapq
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax

from inference.execution import ModelExecution
from inference.generation import stop_codes, stop_reason
from inference.happenings import ACTION, ARRIVE, Declared, Live
from inference.live_traffic import Accepted, Ended, Gauges, LiveTraffic, Selected
from inference.policy import STOP_TURN_END, InferenceRequest, check_prompt
from inference.recorded_computations import read_workload
from inference.slot_execution import EnginePlan
from inference.slot_rows import SlotRows, Work
from inference.state_manager import DeviceArrays, StateManager, check_budget, nbytes
from jgpt.foundation.errors import ApiError
from jgpt.tokenizers.prompt_format import CHAT
from kvsim import (
    DEVICE,
    DEVICE_TO_HOST,
    HOST_TO_DEVICE,
    CustomerInteraction,
    Decision,
    Decisions,
    KVResidency,
    KVResidencySystemConfig,
    RetainedState,
    ScheduledRequest,
    Transfer,
    check_wall_clock,
    parse_interaction,
)

_COMPUTE_END, _TRANSFER_END = ACTION + 1, ACTION + 2  # the loop's own happenings, after arrivals and actions
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


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


class _Request(ScheduledRequest):
    __slots__ = (
        "spec", "arrival", "admitted_us", "first_token_us", "published", "held", "row", "seconds", "stop_reason",
        "outcome",
    )  # fmt: skip
    output_ids: list[int]  # grows as the engine selects ids

    def __init__(self, spec: InferenceRequest, arrival: int):
        super().__init__(spec.request_id, spec.prompt_ids, [], spec.generation.max_new_tokens)
        self.spec = spec
        self.arrival = arrival
        self.admitted_us: int | None = None
        self.first_token_us: int | None = None
        self.published = 0
        self.held: DeviceArrays | None = None  # the reused prefix's (keys, values) until the prefill consumes them
        self.row: int | None = None  # slot row, from the prefill to the end
        self.seconds: list[float] = []
        self.stop_reason: str | None = None
        self.outcome: dict | None = None


_STATUS: dict[str, str] = {Decision.COMPLETE: "completed", Decision.STOP: "stopped", Decision.CANCEL: "cancelled"}


class _Serving:
    """Drives the KVResidency policy with the wall clock: each of its decisions moves arrays or runs the model
    at once, and what it starts ends when it returned."""

    def __init__(
        self, execution: ModelExecution, system: KVResidencySystemConfig, plan: EnginePlan, observe,
        as_fast_as_possible: bool = False,
    ):  # fmt: skip
        self.execution = execution
        self.traffic: LiveTraffic | None = None  # live serving: where arrivals come from and ids are published
        # Nothing waits for a declared time: a happening due later is taken as soon as it is the next one.
        self.as_fast_as_possible = as_fast_as_possible
        self.observe = observe
        self.kv_bytes = execution.costs.kv_bytes_per_position
        self.policy: KVResidency[_Request] = KVResidency(system, self.kv_bytes)
        self.pool = StateManager()
        self.requests: dict[str, _Request] = {}
        self.heap: list[tuple] = []
        self.sequence = 0
        self.now = 0
        self.started_ns = 0
        self.busy_us = 0
        self.works: list[dict] = []
        self.moved = {DEVICE_TO_HOST: 0, HOST_TO_DEVICE: 0}
        self.counts = {"offload": 0, "reload": 0, "drop": 0}
        self.slot_rows = SlotRows(execution, plan)

    # -- the clock -------------------------------------------------------

    def clock(self) -> int:
        return (time.monotonic_ns() - self.started_ns) // 1000

    def schedule(self, time_us: int, what: int, payload) -> None:
        heapq.heappush(self.heap, (time_us, self.sequence, what, payload))
        self.sequence += 1

    # -- main loop -------------------------------------------------------

    def run(self, happenings: Declared | Live) -> None:
        heap, traffic = self.heap, self.traffic
        self.sequence = happenings.sequences
        self.started_ns = time.monotonic_ns()
        happenings.start(self.started_ns)
        while (upcoming := happenings.upcoming(wait=not heap)) is not None or heap:
            if heap and (upcoming is None or heap[0][:2] < upcoming):
                self.now, _, what, payload = heapq.heappop(heap)  # a work's measured end
            else:
                what, payload = happenings.take(self.clock)
                self.now = self.clock()  # when the engine sees it
            if what == _COMPUTE_END:
                self.on_compute_end(payload)
            elif what == ARRIVE:
                self.on_arrival(payload)
            elif what == _TRANSFER_END:
                self.carry_out(self.policy.transfer_ended())
            else:
                self.on_action(payload)
            if self.observe is not None:
                self.observe(self.audit())
            if traffic is not None:
                policy, cache = self.policy, self.policy.cache
                traffic.flush(Gauges(policy.in_system - policy.active, policy.active, cache.device_bytes,
                                     cache.host_retained))  # fmt: skip

    def on_arrival(self, request: _Request) -> None:
        self.requests[request.request_id] = request
        self.carry_out(self.policy.arrive(request))
        if self.traffic is not None and request.outcome is None:  # not rejected: it waits or runs
            self.traffic.publish(request.request_id, Accepted())

    def audit(self) -> tuple[int, int]:
        """The policy's accounts checked against the arrays held; the measured (device, host) bytes."""
        active = []
        for request in self.requests.values():
            if request.admitted_us is None or request.ended:
                continue
            positions = len(request.spec.prompt_ids) + request.step - 1
            held = nbytes(request.held) if request.row is None else positions * self.kv_bytes
            active.append((request.spec.request_id, request.reservation, held))
        return check_budget(self.pool, self.policy.cache, active)

    def on_action(self, action) -> None:
        """A cancel of an arrived request goes to the policy (one not yet arrived is intent without effect); a
        consume waits for nothing, as every id is published as it is selected."""
        request = self.requests.get(action.request_id)
        if action.kind == "cancel" and request is not None:
            self.carry_out(self.policy.cancel(request))

    def on_compute_end(self, work: tuple) -> None:
        batch, chosen, elapsed_us = work
        context, turn_end = self.execution.architecture.context, self.execution.turn_end_id
        step_ended, carry_out = self.policy.step_ended, self.carry_out
        for request, selected in zip(batch, chosen, strict=True):
            spec = request.spec
            request.output_ids.append(selected)
            if self.traffic is not None:
                self.traffic.publish(request.request_id, Selected(selected))
            request.seconds.append(elapsed_us / 1e6)
            request.step += 1
            if request.first_token_us is None:
                request.first_token_us = self.now
            if selected != turn_end:
                request.published += 1
            budget, prompt = spec.generation.max_new_tokens, len(spec.prompt_ids)
            code = stop_codes(_Scalars, selected, request.step, budget, prompt, context, turn_end)
            if code:
                request.stop_reason = reason = stop_reason(code)
                carry_out(step_ended(request, Decision.COMPLETE if reason == STOP_TURN_END else Decision.STOP, reason))
            else:
                carry_out(step_ended(request))
        carry_out(self.policy.work_ended())

    # -- the policy's decisions, carried out -------------------------------

    def carry_out(self, decisions: Decisions[_Request]) -> None:
        for kind, request, subject in decisions:
            _CARRY_OUT[kind](self, request, subject)

    def rejected(self, request: _Request, reason: str) -> None:
        self.ended(request, "rejected", reason)

    def admitted(self, request: _Request, state: RetainedState | None) -> None:
        request.admitted_us = self.now
        if state is not None and request.reuse_tier == DEVICE:
            request.held = self.pool.take(state)

    def count(self, request: _Request, state: RetainedState, what: str) -> None:
        self.counts[what] += 1

    def drop(self, head: _Request, state: RetainedState) -> None:
        self.counts["drop"] += 1
        self.pool.drop(state)

    def start_transfer(self, request: _Request, transfer: Transfer) -> None:
        """A transfer runs synchronously on the serving loop, and the link is busy until its end is taken."""
        state, offload = transfer.state, transfer.direction == DEVICE_TO_HOST
        started = self.clock()
        if offload:
            self.pool.copy_to_host(state)
        else:
            self.pool.copy_to_device(state)
        ended = self.clock()
        self.record_work(("offload" if offload else "reload", 0, 0, 0, 0, 0, 0), [request], state.size, started, ended)
        self.schedule(ended, _TRANSFER_END, None)

    def transfer_ended(self, request: _Request, transfer: Transfer) -> None:
        state = transfer.state
        self.moved[transfer.direction] += state.size
        if transfer.direction == DEVICE_TO_HOST:
            self.pool.offloaded(state)
        else:
            request.held = self.pool.reloaded(state)

    def start_work(self, head: _Request, batch: list[_Request]) -> None:
        """Run the service step the policy dispatched; its end is taken when it returned."""
        started = self.clock()
        chosen, work = self.slot_rows.prefill(head) if head.step == 0 else self.slot_rows.decode(batch)
        ended = self.clock()
        self.busy_us += ended - started
        self.record_work(work, batch, 0, started, ended)
        self.schedule(ended, _COMPUTE_END, (batch, chosen, ended - started))

    def finished(self, request: _Request, reason: str, end: str) -> None:
        self.ended(request, _STATUS[end], reason)

    def ended(self, request: _Request, status: str, reason: str) -> None:
        request.outcome = self.outcome(request, status, reason)
        if self.traffic is not None:
            self.traffic.publish(request.request_id, Ended(request.outcome))

    def retained(self, request: _Request, state: RetainedState) -> None:
        if request.row is None:  # not prefilled: what it computed is the reused prefix it holds
            assert request.held is not None, "an admitted request with reused positions holds them"
            arrays = request.held
        else:
            arrays = self.slot_rows.row_arrays(request.row, state.positions)
        self.pool.retain(state, arrays)

    def left(self, request: _Request, retained: int) -> None:
        request.held = None
        if request.row is not None:
            self.slot_rows.release(request)

    def record_work(self, work: Work, requests: list[_Request], size: int, started: int, ended: int) -> None:
        kind, rows, window, processed, reused, flops, memory = work
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
            "output_ids": list(request.output_ids),
        }


def _nothing(serving: _Serving, request: _Request, subject: Any) -> None:
    """A decision with no arrays to move and nothing to run."""


# How the engine carries out each of the policy's decisions (functions, not bound methods: no reference cycle).
_CARRY_OUT: dict[str, Callable[[_Serving, _Request, Any], None]] = {
    Decision.REJECT: _Serving.rejected, Decision.ADMIT: _Serving.admitted, Decision.RESERVE: _nothing,
    Decision.RELOAD: partial(_Serving.count, what="reload"), Decision.OFFLOAD: partial(_Serving.count, what="offload"),
    Decision.DROP: _Serving.drop, Decision.TRANSFER_START: _Serving.start_transfer,
    Decision.TRANSFER_END: _Serving.transfer_ended, Decision.RUN: _Serving.start_work, Decision.RELEASE: _nothing,
    Decision.RETAIN: _Serving.retained, Decision.RETAIN_SKIP: _nothing, Decision.LEAVE: _Serving.left,
    **{end: partial(_Serving.finished, end=end) for end in (Decision.COMPLETE, Decision.STOP, Decision.CANCEL)},
}  # fmt: skip


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
        compiled = serving.slot_rows.compile()
        ordered = [_Request(r, 0 if as_fast_as_possible else r.arrival_us) for r in requests]
        happenings = Declared(ordered, list(interaction.actions) if interaction else [], as_fast_as_possible)
        with collector_paused():
            return _run(serving, compiled, happenings, ordered)

    def live(self) -> LiveEngine:
        """Compile every program any request the system admits can need; the LiveEngine serves live traffic."""
        plan = EnginePlan.for_any_request(self.execution.architecture.context, self.system)
        plan.check_memory(self.execution, self.system, self.system.max_requests)
        serving = _Serving(self.execution, self.system, plan, None)
        return LiveEngine(serving, serving.slot_rows.compile())


@dataclasses.dataclass(frozen=True)
class LiveEngine:
    """An InferenceEngine compiled for any request, serving requests as they arrive (`serve`, on its own thread).
    One serves one run: `InferenceEngine.live` makes another (its programs are compiled once per process)."""

    serving: _Serving
    compiled: tuple[int, int]  # programs, compile wall us

    def serve(self, traffic: LiveTraffic) -> ServedRun:
        """Serve what arrives, publishing each id as it is selected, until the traffic is closed and every request
        in the system has ended. The collector stays on (a server runs for long), its start-up heap frozen."""
        self.serving.traffic = traffic
        happenings = Live(traffic, _Request)
        with collector_frozen():
            return _run(self.serving, self.compiled, happenings, happenings.requests)


def _run(serving: _Serving, compiled: tuple[int, int], happenings: Declared | Live, requests: list) -> ServedRun:
    """Run the loop over the happenings, counting XLA compiles while the clock runs."""
    compiles: list[str] = []

    def listener(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == COMPILE_EVENT:
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        serving.run(happenings)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    served = tuple(_served(r) for r in requests)
    end_us = max([serving.now, *(w["end_us"] for w in serving.works)])
    return ServedRun(
        serving.slot_rows.plan, *compiled, len(compiles), serving.as_fast_as_possible, served, tuple(serving.works),
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
        request.spec, outcome, tuple(request.output_ids), request.reused, tuple(request.seconds), request.stop_reason
    )


@contextlib.contextmanager
def collector_frozen():
    """What exists before is collected and frozen (no later collection walks it); the collector stays on."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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
    document, tokenizer, execution: ModelExecution, *, prompt_format: str = CHAT
) -> tuple[tuple[InferenceRequest, ...], CustomerInteraction | None]:
    """The requests of a Workload document (their text framed by `prompt_format`) and its optional customer
    interaction, refused where kvsim would refuse them (same field names)."""
    requests = read_workload(document, tokenizer, prompt_format=prompt_format)
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
