"""The discrete-event engine: RequestScheduling, ComputeService and StateTransfer on one clock.

Virtual time is an integer number of microseconds. Happenings are taken in
(time, sequence number) order, so equal times keep the order in which they were
scheduled: arrivals and customer actions first, in array order, then work and
transfers in the order they started. Arrivals are pulled one at a time, so a
workload can be a stream (kvsim.recorded.StreamedComputations) that is never held whole. Every recorded event names the events
that made it happen (`causes`); nothing is inferred from adjacency.

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

from kvsim.cache_event import CacheEvent, EventKind, Measurement, MeasurementKind, Phase, Rows, TransferDirection
from kvsim.compute_service import TRANSFER
from kvsim.kv_cache import DEVICE, HOST, Residency, RetainedState
from kvsim.outcomes import RequestOutcome, Status
from kvsim.recorded import RecordedComputations, RecordedRequest, token_key
from kvsim.system import CONTINUOUS_BATCHING, KVResidencySystemConfig
from kvsim.workload import CustomerInteraction, Workload

# Scheduled happenings, in the heap as small ints.
_COMPUTE_END, _TRANSFER_END = range(2)
# The kinds the engine writes into its plain tuples are the enum members' values, plain strings: the collector
# stops tracking a tuple of ints and strings, but never one that holds an enum member (an object with a
# __dict__), and traversing 35 events a request at every older-generation collection cost a tenth of the
# run. Rows hands the members back to a reader. Bound once as globals: Python 3.11 finds an Enum class's
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


class _Request:
    __slots__ = (
        "spec", "arrival", "index", "arrival_event", "reservation", "reused", "reuse_tier", "step",
        "boundary", "cancel", "ended", "admitted_us", "first_token_us", "published", "publish_log", "key",
        "token_bytes",
    )  # fmt: skip

    def __init__(self, spec: RecordedRequest, arrival: int, index: int, consumed: bool):
        self.spec = spec
        self.arrival = arrival
        self.index = index  # position in the workload
        self.arrival_event = -1
        self.key = token_key(spec.prompt_ids)
        self.reservation = 0
        self.reused = 0
        self.reuse_tier: str | None = None
        self.step = 0  # 0: prefill next; k: decode step k-1 next
        self.boundary = -1  # the event after which this request's next work may start
        self.cancel = -1  # pending cancel_request event, or -1
        self.ended = False
        self.admitted_us: int | None = None
        self.first_token_us: int | None = None
        self.published = 0
        # (time, cumulative published bytes), kept only for requests whose output a customer consumes
        self.publish_log = [(arrival, 0)] if consumed else None
        self.token_bytes = spec.published_bytes() if consumed else ()


class _Engine:
    def __init__(
        self,
        system: KVResidencySystemConfig,
        kv_bytes_per_position: int,
        acted: dict[str, _Request],
        hand_over: HandOver | None,
    ):
        self.system = system
        self.compute = system.compute_service
        self.transfer = system.transfer
        self.retain_states = system.kv_cache.retention_policy == "lru"
        self.batching = system.scheduling.policy == CONTINUOUS_BATCHING
        self.kv_bytes = kv_bytes_per_position
        self.cache = Residency(system.kv_cache, self.kv_bytes)
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
        self.waiting: deque[_Request] = deque()
        self.in_system = 0
        self.active = 0
        self.ready: deque[_Request] = deque()
        self.compute_busy = False
        self.compute_free_event = -1
        self.busy_us = 0
        self.link: deque[tuple] = deque()  # (direction, state, request_id, decision event)
        self.link_busy = False
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
                    self.on_transfer_end(payload)
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
        system = self.system
        request = self.acted.get(spec.request_id) or _Request(spec, arrival_us, index, False)
        self.requests[spec.request_id] = request
        request.arrival_event = event = self.emit(spec.request_id, ARRIVAL, detail=f"prompt={len(spec.prompt_ids)}")
        request.reservation = (len(spec.prompt_ids) + spec.max_new_tokens - 1) * self.kv_bytes
        reason = None
        if spec.max_new_tokens > system.max_new_tokens_cap:
            reason = f"max_new_tokens {spec.max_new_tokens} > max_new_tokens_cap {system.max_new_tokens_cap}"
        elif self.in_system >= system.max_requests:
            reason = f"max_requests {system.max_requests} already in the system"
        elif request.reservation > system.kv_cache.device_kv_bytes:
            reason = f"reservation {request.reservation} bytes > device_kv_bytes {system.kv_cache.device_kv_bytes}"
        if reason is not None:
            request.ended = True
            end = self.emit(spec.request_id, REJECT, (event,), detail=reason)
            self.end(request, Status.REJECTED, reason, end)
            return
        self.in_system += 1
        self.waiting.append(request)
        self.admit(event)
        self.dispatch()

    def on_action(self, action) -> None:
        request = self.requests[action.request_id]
        if action.kind == "consume":
            detail = f"published_bytes={request.publish_log[-1][1] if request.publish_log else 0}"
            self.emit(action.request_id, CONSUME, (), size=action.output_bytes, detail=detail)
            return
        event = self.emit(action.request_id, CANCEL_REQUEST, ())
        if request.ended or request.cancel >= 0 or request.arrival > self.now:
            return  # already over, already cancelling, or not yet arrived: intent without effect
        if request.admitted_us is None:
            self.in_system -= 1
            self.finish(request, CANCEL, "cancelled while waiting", (event, request.arrival_event), admitted=False)
            self.admit(event)
        elif request in self.ready:
            self.ready.remove(request)
            self.finish(request, CANCEL, "cancelled between steps", (event, request.boundary))
        else:
            request.cancel = event  # running or reloading: honoured at the next step boundary
        self.dispatch()

    # -- admission and residency ------------------------------------------

    def admit(self, trigger: int) -> None:
        """FIFO admission of waiting requests while slots and device bytes allow."""
        cache = self.cache
        while self.waiting and self.active < self.system.scheduling.max_active_requests:
            request = self.waiting[0]
            if request.ended:
                self.waiting.popleft()
                continue
            spec = request.spec
            state = cache.lookup(request.key) if self.retain_states else None
            credit = state.size if state is not None and state.tier == DEVICE else 0
            need = request.reservation - credit
            if need > cache.device_free():
                shortfall = need - cache.device_free() - cache.offloading_bytes
                evictable = cache.device_lru_bytes - credit
                if shortfall <= 0 or evictable < shortfall:
                    return  # wait for offloads in flight, or for active requests to release
                self.evict(shortfall, state, spec.request_id, (request.arrival_event, trigger))
                continue
            self.waiting.popleft()
            self.active += 1
            request.admitted_us = self.now
            causes = (request.arrival_event,) if trigger == request.arrival_event else (request.arrival_event, trigger)
            admitted = self.emit(spec.request_id, ADMIT, causes)
            if state is None:
                self.emit(spec.request_id, LOOKUP_MISS, (admitted,))
            else:
                tier = HOST if state.tier != DEVICE else DEVICE
                request.reused, request.reuse_tier = state.positions, tier
                hit = self.emit(spec.request_id, LOOKUP_HIT, (admitted,), state.state_id, state.size, tier)
                cache.take(state)
                self.fate(state.state_id, f"reused by {spec.request_id}")
            cache.reserved += request.reservation
            reserved = self.emit(spec.request_id, RESERVE, (admitted,), size=request.reservation)
            if state is not None and request.reuse_tier == HOST:  # only a hit has a reuse tier
                request.boundary = -1
                reload = self.emit(
                    spec.request_id, RELOAD, (hit,), state.state_id, state.size, direction=HOST_TO_DEVICE
                )
                self.enqueue_transfer(HOST_TO_DEVICE, state, spec.request_id, reload)
            else:
                request.boundary = reserved
                self.ready.append(request)

    def evict(self, shortfall: int, keep: RetainedState | None, request_id: str, causes: tuple) -> None:
        """Move least recently used device states out until `shortfall` bytes will be free."""
        cache = self.cache
        while shortfall > 0:
            oldest = iter(cache.device_lru.values())
            state = next(oldest)
            if state is keep:
                state = next(oldest)
            shortfall -= state.size
            kept_on_host = keep.size if keep is not None and keep.tier == HOST else 0
            if state.size <= cache.host_free() + cache.host_lru_bytes - kept_on_host:
                while cache.host_free() < state.size:  # least recently used host states make room
                    victim = next(s for s in cache.host_lru.values() if s is not keep)
                    cache.drop_from_host(victim)
                    self.fate(victim.state_id, "dropped from host")
                    self.emit(request_id, DROP, causes, victim.state_id, victim.size, HOST)
                cache.begin_offload(state)
                offload = self.emit(request_id, OFFLOAD, causes, state.state_id, state.size, direction=DEVICE_TO_HOST)
                self.enqueue_transfer(DEVICE_TO_HOST, state, request_id, offload)
            else:
                cache.drop_from_device(state)
                self.fate(state.state_id, "dropped from device")
                self.emit(request_id, DROP, causes, state.state_id, state.size, DEVICE)

    def enqueue_transfer(self, direction: str, state: RetainedState, request_id: str, decision: int) -> None:
        self.link.append((direction, state, request_id, decision))
        if not self.link_busy:
            self.start_transfer()

    def start_transfer(self) -> None:
        direction, state, request_id, decision = transfer = self.link.popleft()
        causes = (decision,) if self.link_free_event < 0 else (decision, self.link_free_event)
        start = self.emit(request_id, TRANSFER_START, causes, state.state_id, state.size, direction=direction)
        self.link_busy = True
        self.last_started = TRANSFER
        duration = self.transfer.transfer_us(direction, state.size)
        self.schedule(self.occupy(duration, True), _TRANSFER_END, (*transfer, start, self.now))

    def on_transfer_end(self, transfer: tuple) -> None:
        direction, state, request_id, _, start, started = transfer
        cache = self.cache
        if direction == DEVICE_TO_HOST:
            cache.end_offload(state)
            if state.tier == HOST:
                self.fate(state.state_id, "on host")
        else:
            cache.end_reload(state)
        end = self.emit(request_id, TRANSFER_END, (start,), state.state_id, state.size, direction=direction)
        elapsed = self.now - started
        self.measurements.append((end, _MEASURED[direction], elapsed, state.size))
        self.link_busy = False
        self.link_free_event = end
        if self.link:
            self.start_transfer()
        if direction == HOST_TO_DEVICE:
            request = self.requests[request_id]
            request.boundary = end
            if request.cancel >= 0:
                self.finish(request, CANCEL, "cancelled at reload end", (request.cancel, end))
            else:
                self.ready.append(request)
        else:
            self.admit(end)
        self.dispatch()

    # -- service ---------------------------------------------------------

    def dispatch(self) -> None:
        """Start the next service step if the compute resource is idle (round-robin over ready requests)."""
        if self.compute_busy or not self.ready:
            return
        head = self.ready.popleft()
        if self.batching and head.step > 0:
            batch = [head, *(r for r in self.ready if r.step > 0)]
            self.ready = deque(r for r in self.ready if r.step == 0)
        else:
            batch = [head]
        flops, memory = self.work_cost(head)
        for request in batch[1:]:
            f, b = self.work_cost(request)
            # A batch reads the fixed bytes of a work (the weights) once, not once per request.
            flops, memory = flops + f, memory + b - min(request.spec.fixed_memory_bytes, b)
        # The step overhead (host time before the work) delays the work but does not busy the compute.
        phase, idle_us = (PREFILL if head.step == 0 else DECODE), max(0, self.now - self.last_end)
        overhead, busy = self.compute.work_us(  # the work named by its first compute_start's id (a spread's draw)
            phase,
            len(head.spec.prompt_ids) - head.reused,
            len(batch),
            flops,
            memory,
            idle_us,
            self.next_event,
            self.last_started,
        )
        self.last_started = phase
        duration = overhead + busy
        starts, free, detail = [], self.compute_free_event, f"batch={len(batch)}" if self.batching else ""
        for request in batch:
            causes = (request.boundary,) if free < 0 else (request.boundary, free)
            phase = PREFILL if request.step == 0 else DECODE
            starts.append(self.emit(request.spec.request_id, COMPUTE_START, causes, phase=phase, detail=detail))
        self.compute_busy = True
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

    def on_compute_end(self, work: tuple) -> None:
        batch, starts, memory, started = work
        elapsed = self.now - started
        self.compute_busy = False
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
                kind = COMPLETE if spec.outcome["complete"] else STOP
                self.finish(request, kind, spec.outcome["stop_reason"], (request.boundary,))
            elif request.cancel >= 0:
                self.finish(request, CANCEL, "cancelled at step boundary", (request.cancel, request.boundary))
            else:
                self.ready.append(request)
        self.compute_free_event = end  # the batch's last compute_end
        self.dispatch()

    def finish(self, request: _Request, kind: str, reason: str, causes: tuple, admitted: bool = True) -> None:
        """The request ends exactly once: release its reservation and retain what it computed."""
        spec, cache = request.spec, self.cache
        request.ended = True
        end = self.emit(spec.request_id, kind, causes, detail=reason)
        self.end(request, _STATUS[kind], reason, end)
        if not admitted:
            return
        self.active -= 1
        self.in_system -= 1
        cache.reserved -= request.reservation
        released = self.emit(spec.request_id, RELEASE, (end,), size=request.reservation)
        computed = len(spec.prompt_ids) + request.step - 1 if request.step > 0 else request.reused
        retained = 0
        if self.retain_states and computed > 0:
            key = token_key((*spec.prompt_ids, *spec.output_ids)[:computed])
            if cache.has(key):
                self.emit(
                    spec.request_id,
                    RETAIN_SKIP,
                    (released,),
                    size=computed * self.kv_bytes,
                    detail="already retained",
                )
            else:
                state = cache.retain(key, spec.request_id)
                self.state_fate[state.state_id] = {
                    "request_id": spec.request_id,
                    "positions": state.positions,
                    "bytes": state.size,
                    "fate": "on device",
                }
                self.emit(spec.request_id, RETAIN, (released,), state.state_id, state.size)
                retained = state.size
        if request.step > 0:
            self.hold_thread(self.compute.finish_us(retained))
        self.admit(released)

    def hold_thread(self, duration: int) -> None:
        """Host time on the serving thread (after a request that ran ends): what it runs next starts later,
        and no compute is busy. Idle time is still counted from the end of the last work or transfer."""
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
        spec, now = request.spec, self.now
        selected = request.step
        first = request.first_token_us
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
    the events the run holds again at every older-generation collection: 15% of a 20,000-request run's time,
    9% in the oldest generation alone. It is paused while the engine runs (and resumed after, error or not, if
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
