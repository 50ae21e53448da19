"""The discrete-event engine: the KVResidency serving policy driven by a virtual clock, with ComputeService.

The policy (kvsim/kv_residency.py, the one the InferenceEngine decides with too)
takes the admission, retention, eviction and transfer decisions; the engine
records each as events and gives each work and transfer its duration from the
compute service and the link. Virtual time is an integer number of
microseconds. Happenings are taken in (time, sequence number) order, so equal
times keep the order in which they were scheduled: arrivals and customer actions
first, in array order, then work and transfers in the order they started.
Arrivals are pulled one at a time, so a workload can be a stream
(kvsim.recorded.StreamedComputations) that is never held whole. Every recorded
event names the events that made it happen (`causes`); nothing is inferred from
adjacency.

The mutable state below lives only for one call of `run`; what leaves it is
typed values: CacheEvents and Measurements (as Rows), RequestOutcomes, and what
became of each retained state. A streamed run hands them over in batches and
keeps nothing per finished request.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from kvsim.cache_event import CacheEvent, EventKind, Measurement, MeasurementKind, Phase, Rows, TransferDirection
from kvsim.compute_service import TRANSFER
from kvsim.kv_cache import HOST, RetainedState
from kvsim.kv_residency import Decision, Decisions, KVResidency, ScheduledRequest, Transfer
from kvsim.outcomes import RequestOutcome, Status
from kvsim.recorded import RecordedComputations, RecordedRequest
from kvsim.system import CONTINUOUS_BATCHING, KVResidencySystemConfig
from kvsim.workload import CustomerInteraction, Workload

# Scheduled happenings, in the heap as small ints.
_COMPUTE_END, _TRANSFER_END = range(2)
# The kinds the engine writes into its plain tuples are the enum members' values, plain strings: the collector
# stops tracking a tuple of ints and strings, but never one that holds an enum member (an object with a
# __dict__), and traversing every event of a run at each older-generation collection costs a sizeable share
# of the run. Rows hands the members back to a reader. Bound once as globals: Python 3.11 finds an Enum class's
# attributes through a Python-level __getattr__, ten times slower than a global.
DEVICE_TO_HOST, HOST_TO_DEVICE = TransferDirection.DEVICE_TO_HOST.value, TransferDirection.HOST_TO_DEVICE.value
PREFILL, DECODE = Phase.PREFILL.value, Phase.DECODE.value
_MEASURED = {PREFILL: MeasurementKind.COMPUTE_PREFILL.value, DECODE: MeasurementKind.COMPUTE_DECODE.value,
             DEVICE_TO_HOST: MeasurementKind.TRANSFER_DEVICE_TO_HOST.value,
             HOST_TO_DEVICE: MeasurementKind.TRANSFER_HOST_TO_DEVICE.value}  # fmt: skip
(ARRIVAL, REJECT, ADMIT, LOOKUP_MISS, LOOKUP_HIT, RESERVE, OFFLOAD, RELOAD, DROP, TRANSFER_START, TRANSFER_END,
 COMPUTE_START, COMPUTE_END, PUBLISH, CONSUME, CANCEL_REQUEST, COMPLETE, STOP, CANCEL, RELEASE, RETAIN,
 RETAIN_SKIP) = (kind.value for kind in EventKind)  # fmt: skip
_STATUS = {COMPLETE: Status.COMPLETED, STOP: Status.STOPPED, CANCEL: Status.CANCELLED}
# Fates after which nothing more happens to a retained state (the others: "on device", "on host").
_SETTLED = ("reused by", "dropped from")
# A streamed run hands what it produced over once this many events have accumulated.
HAND_OVER_EVENTS = 1 << 16
Arrival = tuple[int, int, RecordedRequest]  # (arrival_us, position in the workload, the request)


@dataclass(frozen=True)
class Batch:
    """What a streamed run hands over: events and measurements so far, the outcomes of the requests that
    ended (in the order they ended) and the retained states whose fate is settled (in that order)."""

    events: Rows[CacheEvent]
    measurements: Rows[Measurement]
    outcomes: list[tuple[str, RequestOutcome]]  # (request_id, outcome)
    states: list[tuple[str, dict]]  # (state_id, what became of it)


HandOver = Callable[[Batch], None]


@dataclass(frozen=True)
class EngineResult:
    events: Rows[CacheEvent]  # empty when a hand-over streamed them
    measurements: Rows[Measurement]
    outcomes: list[RequestOutcome]  # one per arrival, in workload order (empty when handed over)
    publish_logs: dict[str, list[tuple[int, int]]]  # (time, cumulative published bytes) of consumed requests
    states: list[tuple[str, dict]]  # (state_id, what became of it), in creation order (handed over: unsettled ones)
    busy_us: int  # compute busy time
    end_us: int  # time of the last event
    saved_matmul_flops: int  # prefill FLOPs the reused positions saved


class _Request(ScheduledRequest):
    __slots__ = (
        "spec", "arrival", "index", "arrival_event", "boundary", "cancel", "admitted_us", "first_token_us",
        "published", "publish_log", "token_bytes",
    )  # fmt: skip

    def __init__(self, spec: RecordedRequest, arrival: int, index: int, consumed: bool):
        super().__init__(spec.request_id, spec.prompt_ids, spec.output_ids, spec.max_new_tokens)
        self.spec = spec
        self.arrival = arrival
        self.index = index  # position in the workload
        self.arrival_event = -1
        self.boundary = -1  # the event after which this request's next work may start
        self.cancel = -1  # the cancel_request event that ends it, or -1
        self.admitted_us: int | None = None
        self.first_token_us: int | None = None
        self.published = 0
        # (time, cumulative published bytes), kept only for requests whose output a customer consumes
        self.publish_log = [(arrival, 0)] if consumed else None
        self.token_bytes = spec.published_bytes() if consumed else ()


class _Engine:
    """Drives the KVResidency policy with the virtual clock: each of its decisions becomes events, and the
    works and transfers it starts end after the durations the compute service and the link give them."""

    def __init__(
        self,
        system: KVResidencySystemConfig,
        kv_bytes_per_position: int,
        acted: dict[str, _Request],
        hand_over: HandOver | None,
    ):
        self.compute = system.compute_service
        self.transfer = system.transfer
        self.batching = system.scheduling.policy == CONTINUOUS_BATCHING
        self.kv_bytes = kv_bytes_per_position
        self.policy: KVResidency[_Request] = KVResidency(system, kv_bytes_per_position)
        self.cache = self.policy.cache
        self.acted = acted  # requests a customer action names: kept from before they arrive to the end
        self.requests = dict(acted)  # those and the requests in the system
        self.events: list[tuple] = []  # plain CacheEvent tuples (kvsim.cache_event.Rows)
        self.measurements: list[tuple] = []
        self.ended: list[tuple[int, str, RequestOutcome]] = []  # (workload position, request_id, outcome)
        self.settled: list[tuple[str, dict]] = []  # retained states whose fate will not change
        self.hand_over = hand_over  # takes what was produced so far, which then leaves the engine
        self.next_event = 0  # the next event's id (the events handed over and those in `events`)
        self.heap: list[tuple] = []
        self.sequence = 0
        self.now = 0
        # The event the policy's next decisions follow from: the arrival, cancel, transfer end or release after
        # which it admits (and evicts for the head).
        self.trigger = -1
        self.admission = (-1, -1)  # the admit event of the request being admitted and its lookup's event
        self.finish_event = -1  # the complete, stop or cancel event of the request ending
        self.link_decisions: deque[int] = deque()  # the offload and reload events of the transfers on the link
        self.in_flight = (-1, 0)  # the transfer on the link: its transfer_start event and its start time
        self.compute_free_event = -1
        self.busy_us = 0
        self.link_free_event = -1
        # An engine that copies states on its one serving thread runs every work and transfer there, one
        # after another in the order they start: each begins when the thread is free (`thread_free`).
        self.one_thread = system.transfer.blocks_compute
        self.thread_free = 0
        self.last_end = -1  # when the last work or transfer started so far ends: later, the engine is idle
        self.last_started: str | None = None  # what was started last: PREFILL, DECODE or TRANSFER (None: nothing)
        self.saved_flops = 0
        self.state_fate: dict[str, dict] = {}  # retained states whose fate may still change

    # -- recording -------------------------------------------------------

    def emit(self, request_id, kind, causes=(), state_id=None, size=0, detail="", phase=None, direction=None) -> int:
        event_id = self.next_event
        self.next_event = event_id + 1
        cache = self.cache
        self.events.append((
            event_id, request_id, self.now, kind, state_id, size, cache.reserved + cache.device_retained,
            cache.host_retained, detail, causes, phase, direction))  # fmt: skip
        return event_id

    def schedule(self, time: int, what: int, payload) -> None:
        heapq.heappush(self.heap, (time, self.sequence, what, payload))
        self.sequence += 1

    # -- main loop -------------------------------------------------------

    def run(self, arrivals: Iterator[Arrival], actions: Iterable) -> None:
        """Arrivals (in (time, position) order) and actions come before completions scheduled for the same
        time, an arrival before an action; they stay out of the heap, which holds only the (at most two)
        pending completions."""
        heap, pending = self.heap, deque(sorted(actions, key=lambda a: a.at_us))  # stable: array order on ties
        arrival = next(arrivals, None)
        declared = _first(arrival, pending)  # when the next arrival or action happens
        while heap or declared < math.inf:
            if heap and heap[0][0] < declared:
                self.now, _, what, payload = heapq.heappop(heap)
                if what == _COMPUTE_END:
                    self.on_compute_end(payload)
                else:
                    self.carry_out(self.policy.transfer_ended())
            else:
                if arrival is not None and arrival[0] == declared:
                    self.now = arrival[0]
                    self.on_arrival(arrival)
                    arrival = next(arrivals, None)
                else:  # the declared time is the next action's
                    action = pending.popleft()
                    self.now = action.at_us
                    self.on_action(action)
                declared = _first(arrival, pending)
            if self.hand_over is not None and len(self.events) >= HAND_OVER_EVENTS:
                self.pass_on(self.hand_over)
        if self.hand_over is not None:
            self.pass_on(self.hand_over)

    def pass_on(self, hand_over: HandOver) -> None:
        outcomes = [(request_id, outcome) for _, request_id, outcome in self.ended]
        hand_over(Batch(Rows(CacheEvent, self.events), Rows(Measurement, self.measurements), outcomes, self.settled))
        self.events, self.measurements, self.ended, self.settled = [], [], [], []

    def on_arrival(self, arrival: Arrival) -> None:
        arrival_us, index, spec = arrival
        request = self.acted.get(spec.request_id) or _Request(spec, arrival_us, index, False)
        self.requests[spec.request_id] = request
        detail = f"prompt={len(spec.prompt_ids)}"
        request.arrival_event = self.trigger = self.emit(spec.request_id, ARRIVAL, detail=detail)
        self.carry_out(self.policy.arrive(request))

    def on_action(self, action) -> None:
        request = self.requests[action.request_id]
        if action.kind == "consume":
            detail = f"published_bytes={request.publish_log[-1][1] if request.publish_log else 0}"
            self.emit(action.request_id, CONSUME, (), size=action.output_bytes, detail=detail)
            return
        event = self.emit(action.request_id, CANCEL_REQUEST, ())
        if request.arrival > self.now:
            return  # not yet arrived: intent without effect
        if request.cancel < 0:
            request.cancel = event
        self.trigger = event
        self.carry_out(self.policy.cancel(request))

    def on_compute_end(self, work: tuple) -> None:
        batch, starts, memory, started = work
        elapsed, step_ended, carry_out = self.now - started, self.policy.step_ended, self.carry_out
        for request, start in zip(batch, starts, strict=True):
            spec = request.spec
            phase = PREFILL if request.step == 0 else DECODE
            end = self.emit(spec.request_id, COMPUTE_END, (start,), phase=phase)
            self.measurements.append((end, _MEASURED[phase], elapsed, memory))
            selected = spec.output_ids[request.step]
            request.step += 1
            request.boundary = end
            if request.first_token_us is None:
                request.first_token_us = self.now
            if request.step <= spec.outcome["published_tokens"]:  # a selected turn end is last, unpublished
                request.published += 1
                request.boundary = self.emit(spec.request_id, PUBLISH, (end,), detail=f"token={selected}")
                if request.publish_log is not None:
                    total = request.publish_log[-1][1] + request.token_bytes[request.step - 1]
                    request.publish_log.append((self.now, total))
            if request.step == len(spec.output_ids):
                outcome = spec.outcome
                carry_out(step_ended(request, COMPLETE if outcome["complete"] else STOP, outcome["stop_reason"]))
            elif decisions := step_ended(request):  # most steps decide nothing
                carry_out(decisions)
        self.compute_free_event = end  # the batch's last compute_end
        carry_out(self.policy.work_ended())

    # -- the policy's decisions, carried out -------------------------------

    def carry_out(self, decisions: Decisions[_Request]) -> None:
        for kind, request, subject in decisions:
            _CARRY_OUT[kind](self, request, subject)

    def rejected(self, request: _Request, reason: str) -> None:
        end = self.emit(request.request_id, REJECT, (request.arrival_event,), detail=reason)
        self.end(request, Status.REJECTED, reason, end)

    def admitted(self, request: _Request, state: RetainedState | None) -> None:
        request_id, arrival, trigger = request.request_id, request.arrival_event, self.trigger
        request.admitted_us = self.now
        admitted = self.emit(request_id, ADMIT, (arrival,) if trigger == arrival else (arrival, trigger))
        if state is None:
            self.admission = admitted, self.emit(request_id, LOOKUP_MISS, (admitted,))
        else:
            hit = self.emit(request_id, LOOKUP_HIT, (admitted,), state.state_id, state.size, request.reuse_tier)
            self.admission = admitted, hit
            self.fate(state.state_id, f"reused by {request_id}")

    def reserved(self, request: _Request, _: None) -> None:
        request.boundary = self.emit(request.request_id, RESERVE, (self.admission[0],), size=request.reservation)

    def reload(self, request: _Request, state: RetainedState) -> None:
        causes = (self.admission[1],)  # the hit
        reload = self.emit(request.request_id, RELOAD, causes, state.state_id, state.size, direction=HOST_TO_DEVICE)
        self.link_decisions.append(reload)

    def offload(self, head: _Request, state: RetainedState) -> None:
        causes = (head.arrival_event, self.trigger)
        offload = self.emit(head.request_id, OFFLOAD, causes, state.state_id, state.size, direction=DEVICE_TO_HOST)
        self.link_decisions.append(offload)

    def drop(self, head: _Request, state: RetainedState) -> None:
        self.fate(state.state_id, f"dropped from {state.tier}")
        self.emit(head.request_id, DROP, (head.arrival_event, self.trigger), state.state_id, state.size, state.tier)

    def start_transfer(self, request: _Request, transfer: Transfer) -> None:
        direction, state = transfer.direction, transfer.state
        decision = self.link_decisions.popleft()
        causes = (decision,) if self.link_free_event < 0 else (decision, self.link_free_event)
        start = self.emit(request.request_id, TRANSFER_START, causes, state.state_id, state.size, direction=direction)
        self.last_started = TRANSFER
        self.in_flight = start, self.now
        duration = self.transfer.transfer_us(direction, state.size)
        self.schedule(self.occupy(duration, True), _TRANSFER_END, None)

    def transfer_ended(self, request: _Request, transfer: Transfer) -> None:
        direction, state = transfer.direction, transfer.state
        if direction == DEVICE_TO_HOST and state.tier == HOST:
            self.fate(state.state_id, "on host")
        start, started = self.in_flight
        end = self.emit(request.request_id, TRANSFER_END, (start,), state.state_id, state.size, direction=direction)
        self.measurements.append((end, _MEASURED[direction], self.now - started, state.size))
        self.link_free_event = self.trigger = end
        if direction == HOST_TO_DEVICE:
            request.boundary = end

    def start_work(self, head: _Request, batch: list[_Request]) -> None:
        flops, memory = self.work_cost(head)
        for request in batch[1:]:
            f, b = self.work_cost(request)
            # A batch reads the fixed bytes of a work (the weights) once, not once per request.
            flops, memory = flops + f, memory + b - min(request.spec.fixed_memory_bytes, b)
        # The step overhead (host time before the work) delays the work but does not busy the compute.
        phase, idle_us = (PREFILL if head.step == 0 else DECODE), max(0, self.now - self.last_end)
        # The work is named by its first compute_start's id (a spread's draw).
        positions, work = len(head.spec.prompt_ids) - head.reused, self.next_event
        overhead, busy = self.compute.work_us(
            phase, positions, len(batch), flops, memory, idle_us, work, self.last_started
        )
        self.last_started = phase
        duration = overhead + busy
        starts, free, detail = [], self.compute_free_event, f"batch={len(batch)}" if self.batching else ""
        for request in batch:
            causes = (request.boundary,) if free < 0 else (request.boundary, free)
            phase = PREFILL if request.step == 0 else DECODE
            starts.append(self.emit(request.request_id, COMPUTE_START, causes, phase=phase, detail=detail))
        self.busy_us += busy
        self.schedule(self.occupy(duration), _COMPUTE_END, (batch, starts, memory, self.now))

    def occupy(self, duration: int, transfer: bool = False) -> int:
        """When something started now for `duration` ends: after what the serving thread runs first (a compute
        work always waits for the thread's host time after a finish; a transfer only on one thread)."""
        if self.one_thread or not transfer:
            self.thread_free = end = max(self.now, self.thread_free) + duration
        else:
            end = self.now + duration
        self.last_end = max(self.last_end, end)
        return end

    def work_cost(self, request: _Request) -> tuple[int, int]:
        spec = request.spec
        if request.step == 0:
            return spec.prefill_cost(request.reused)
        return spec.decode_flops[request.step - 1], spec.decode_bytes[request.step - 1]

    def finished(self, request: _Request, reason: str, kind: str) -> None:
        # A cancel follows the cancel_request and the arrival (while waiting) or the last step boundary.
        last = request.boundary if request.admitted else request.arrival_event
        causes = (request.boundary,) if kind != CANCEL else (request.cancel, last)
        self.finish_event = end = self.emit(request.request_id, kind, causes, detail=reason)
        self.end(request, _STATUS[kind], reason, end)

    def released(self, request: _Request, _: None) -> None:
        self.trigger = self.emit(request.request_id, RELEASE, (self.finish_event,), size=request.reservation)

    def retained(self, request: _Request, state: RetainedState) -> None:
        origin = {"request_id": request.request_id, "positions": state.positions, "bytes": state.size}
        self.state_fate[state.state_id] = origin | {"fate": "on device"}
        self.emit(request.request_id, RETAIN, (self.trigger,), state.state_id, state.size)

    def retain_skipped(self, request: _Request, positions: int) -> None:
        size = positions * self.kv_bytes
        self.emit(request.request_id, RETAIN_SKIP, (self.trigger,), size=size, detail="already retained")

    def left(self, request: _Request, retained: int) -> None:
        """Host time on the serving thread after a request that ran ends: what it runs next starts later, and
        no compute is busy. Idle time is still counted from the end of the last work or transfer."""
        duration = self.compute.finish_us(retained) if request.step > 0 else 0
        if duration:
            self.thread_free = max(self.now, self.thread_free) + duration

    def fate(self, state_id: str, fate: str) -> None:
        if fate.startswith(_SETTLED):
            self.settled.append((state_id, {**self.state_fate.pop(state_id), "fate": fate}))
        else:
            self.state_fate[state_id]["fate"] = fate

    def end(self, request: _Request, status: Status, reason: str, end_event: int) -> None:
        """Record the request's outcome; only a request a customer action names stays known after this."""
        spec = request.spec
        self.ended.append((request.index, spec.request_id, self.outcome(request, status, reason, end_event)))
        if request.step > 0 and request.reused > 0:
            self.saved_flops += spec.prefill_cost(0)[0] - spec.prefill_cost(request.reused)[0]
        if spec.request_id not in self.acted:
            del self.requests[spec.request_id]

    def outcome(self, request: _Request, status: Status, reason: str, end_event: int) -> RequestOutcome:
        spec, now, selected, first = request.spec, self.now, request.step, request.first_token_us
        return RequestOutcome(
            status=status,
            stop_reason=reason,
            end_event=end_event,
            arrival_us=request.arrival,
            admitted_us=request.admitted_us,
            first_token_us=first,
            end_us=now,
            queueing_us=None if request.admitted_us is None else request.admitted_us - request.arrival,
            ttft_us=None if first is None else first - request.arrival,
            tpot_us=None if first is None or selected < 2 else round((now - first) / (selected - 1), 3),
            e2e_us=now - request.arrival,
            prompt_positions=len(spec.prompt_ids),
            reuse_positions=request.reused,
            reuse_tier=request.reuse_tier,
            selected_tokens=selected,
            published_tokens=request.published,
            unused_budget=spec.max_new_tokens - selected,
            complete=status == Status.COMPLETED,
        )


# How the engine carries out each of the policy's decisions (functions, not bound methods: the engine makes no
# reference cycles). A decision that ends a request is recorded as the event of the same name
# (Decision.COMPLETE is "complete", as EventKind.COMPLETE is).
_CARRY_OUT: dict[str, Callable[[_Engine, _Request, Any], None]] = {
    Decision.REJECT: _Engine.rejected, Decision.ADMIT: _Engine.admitted, Decision.RESERVE: _Engine.reserved,
    Decision.RELOAD: _Engine.reload, Decision.OFFLOAD: _Engine.offload, Decision.DROP: _Engine.drop,
    Decision.TRANSFER_START: _Engine.start_transfer, Decision.TRANSFER_END: _Engine.transfer_ended,
    Decision.RUN: _Engine.start_work, Decision.RELEASE: _Engine.released, Decision.RETAIN: _Engine.retained,
    Decision.RETAIN_SKIP: _Engine.retain_skipped, Decision.LEAVE: _Engine.left,
    **{end: partial(_Engine.finished, kind=end) for end in (COMPLETE, STOP, CANCEL)},
}  # fmt: skip


def run(
    system: KVResidencySystemConfig,
    computations: RecordedComputations,
    workload: Workload,
    interaction: CustomerInteraction | None,
    hand_over: HandOver | None = None,
) -> EngineResult:
    """Simulate a workload held in memory (any order: sorted here by arrival, ties in workload order)."""
    specs = {r.request_id: r for r in computations.requests}
    actions = interaction.actions if interaction else ()
    consumed = {a.request_id for a in actions if a.kind == "consume"}
    named = {a.request_id for a in actions}
    arrivals = sorted((a.arrival_us, i, specs[a.request_id]) for i, a in enumerate(workload.requests))
    acted = {spec.request_id: _Request(spec, at, i, spec.request_id in consumed)
             for at, i, spec in arrivals if spec.request_id in named}  # fmt: skip
    return run_arrivals(system, computations.kv_bytes_per_position, iter(arrivals), acted, actions, hand_over)


def run_arrivals(
    system: KVResidencySystemConfig,
    kv_bytes_per_position: int,
    arrivals: Iterator[Arrival],
    acted: dict[str, _Request],
    actions: Iterable,
    hand_over: HandOver | None,
) -> EngineResult:
    """Simulate arrivals pulled one at a time in (time, position) order; `acted`: the requests actions name."""
    engine = _Engine(system, kv_bytes_per_position, acted, hand_over)
    with _collector_paused():
        engine.run(arrivals, [a for a in actions if a.kind != "submit"])
    ended, states = sorted(engine.ended), sorted(engine.settled + list(engine.state_fate.items()), key=_created)
    return EngineResult(
        events=Rows(CacheEvent, engine.events),
        measurements=Rows(Measurement, engine.measurements),
        outcomes=[outcome for _, _, outcome in ended],
        publish_logs={r.spec.request_id: r.publish_log for r in acted.values() if r.publish_log is not None},
        states=states,
        busy_us=engine.busy_us,
        end_us=engine.now,
        saved_matmul_flops=engine.saved_flops,
    )


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The engine makes no reference cycles, so in a run the garbage collector frees nothing, yet it traverses
    the events the run holds again at every older-generation collection, a sizeable share of a long run's
    time. It is paused while the engine runs (and resumed after, error or not, if
    it was on); what the run keeps is then traversed once, at the next collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _first(arrival: Arrival | None, actions: deque) -> float:
    return min(math.inf if arrival is None else arrival[0], actions[0].at_us if actions else math.inf)


def _created(state: tuple[str, dict]) -> int:
    return int(state[0][1:])  # state ids are "s<n>", numbered as they are created
