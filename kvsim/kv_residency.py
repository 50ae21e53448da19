"""KVResidency: the serving policy, written once, that kvsim's engine and the InferenceEngine both decide with.

A state machine over one run's requests and retained states, with the rules of
docs/kvsim.md ("The model"): FIFO admission into active slots under the device
byte budget and rejection at arrival (RequestScheduling), exact whole-prefix
LRU retention, lookup and eviction to the host tier or out (KVCache, kept in
kvsim/kv_cache.py), one serialized FIFO link for offloads and reloads
(StateTransfer), and the ready queue the compute resource serves round-robin,
decode steps batched under continuous batching.

It sees no arrays and no clock, and holds no reference to its driver. A
driver says what happened -- a request arrived (`arrive`), a customer cancelled
one (`cancel`), a work's step ended for each of its requests (`step_ended`,
after the driver has counted the id it selected in `step`) and then the work
itself (`work_ended`), the transfer in flight ended (`transfer_ended`) -- and
each of these returns the policy's decisions as data, an iterable of
`(kind, request, subject)`:

    reject          the arriving request     the reason
    admit           the head of the queue    the retained state it reuses, or None (its reuse_tier says from where)
    reserve         the admitted request     None (its reservation is now held)
    reload          the admitted request     the host state it reuses (a transfer to the device follows)
    offload         the head it makes room   the device state leaving for the host (a transfer follows)
    drop            the head it makes room   the state dropped (its tier: where from)
    transfer_start  the transfer's request   the Transfer, now on the link
    transfer_end    the transfer's request   the Transfer, just ended
    run             the batch's first        the batch (a prefill alone, or decode steps)
    complete, stop, cancel                   the request that ends, and the reason
    release         the request              None (its reservation is released)
    retain          the request              the new device state holding what it computed
    retain_skip     the request              the positions it computed (that sequence is already retained)
    leave           the request              the bytes retained (0: none); admission continues after this

Release to leave follow an end only for a request that was admitted. The
policy decides lazily:
each decision is taken when the driver asks for the next, after it has carried
out the one before -- kvsim's engine records events and schedules virtual
ends, the InferenceEngine moves arrays and runs the model -- so the occupancy a
driver reads from `cache` is the occupancy as of that decision. A driver takes
every decision an input returns before its next input. The policy is the mutable
bookkeeping of one run and never escapes it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any, Generic, NamedTuple, TypeVar

from kvsim.cache_event import TransferDirection
from kvsim.kv_cache import DEVICE, HOST, KVCache, RetainedState
from kvsim.recorded import token_key
from kvsim.system import CONTINUOUS_BATCHING, KVResidencySystemConfig


class Decision(StrEnum):
    """What the policy decides, in the order a request meets them (the table above)."""

    REJECT = "reject"
    ADMIT = "admit"
    RESERVE = "reserve"
    RELOAD = "reload"
    OFFLOAD = "offload"
    DROP = "drop"
    TRANSFER_START = "transfer_start"
    TRANSFER_END = "transfer_end"
    RUN = "run"
    COMPLETE = "complete"
    STOP = "stop"
    CANCEL = "cancel"
    RELEASE = "release"
    RETAIN = "retain"
    RETAIN_SKIP = "retain_skip"
    LEAVE = "leave"


# Bound once as plain strings: an Enum class's attributes are found through a Python-level __getattr__ in 3.11,
# ten times slower than a global, and kvsim's engine takes millions of decisions in a long run.
(REJECT, ADMIT, RESERVE, RELOAD, OFFLOAD, DROP, TRANSFER_START, TRANSFER_END, RUN, COMPLETE, STOP, CANCEL,
 RELEASE, RETAIN, RETAIN_SKIP, LEAVE) = (decision.value for decision in Decision)  # fmt: skip
DEVICE_TO_HOST, HOST_TO_DEVICE = TransferDirection.DEVICE_TO_HOST.value, TransferDirection.HOST_TO_DEVICE.value


class ScheduledRequest:
    """A request as the policy follows it, from its arrival to its end. A driver's own request extends it.

    The driver sets what only it knows: `step` (ids selected so far, counted as each work ends) and
    `output_ids` (at least the first `step` of them: what a retained sequence continues with). The
    policy sets the rest.
    """

    __slots__ = (
        "request_id", "prompt_ids", "output_ids", "key", "max_new_tokens", "reservation", "reused",
        "reuse_tier", "step", "admitted", "cancelling", "ended",
    )  # fmt: skip

    def __init__(self, request_id: str, prompt_ids: Sequence[int], output_ids: Sequence[int], max_new_tokens: int):
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.output_ids = output_ids
        self.key = token_key(prompt_ids)
        self.max_new_tokens = max_new_tokens
        self.reservation = 0  # device bytes the request holds while active: the most positions it can reach
        self.reused = 0  # positions of the retained state it continues
        self.reuse_tier: str | None = None  # where that state was when the request was admitted
        self.step = 0  # 0: prefill next; k: decode step k-1 next (k ids selected)
        self.admitted = False
        self.cancelling = False  # a cancel waits for the running work's or the reload's end
        self.ended = False


R = TypeVar("R", bound=ScheduledRequest)


class Transfer(NamedTuple, Generic[R]):
    direction: str  # DEVICE_TO_HOST (an offload) or HOST_TO_DEVICE (a reload)
    state: RetainedState
    request: R  # the request it is for: the one reloading, or the head an offload makes room for


Decisions = Iterable[tuple[str, R, Any]]  # (kind, request, subject), taken one at a time


class KVResidency(Generic[R]):
    def __init__(self, system: KVResidencySystemConfig, kv_bytes_per_position: int):
        self.system = system
        self.kv_bytes = kv_bytes_per_position
        self.cache = KVCache(system.kv_cache, kv_bytes_per_position)
        self.retain_states = system.kv_cache.retention_policy == "lru"
        self.batching = system.scheduling.policy == CONTINUOUS_BATCHING
        self.max_active = system.scheduling.max_active_requests
        self.waiting: deque[R] = deque()  # arrived, not yet admitted (cancelled ones leave when they reach the head)
        self.in_system = 0  # waiting or active
        self.active = 0
        self.ready: deque[R] = deque()  # active requests whose next work may run, in turn
        self.compute_busy = False
        self.link: deque[Transfer[R]] = deque()  # transfers waiting for the link
        self.in_flight: Transfer[R] | None = None  # the transfer on the link

    # -- what happened ---------------------------------------------------

    def arrive(self, request: R) -> Decisions[R]:
        """Reject the request, or queue it and admit what fits."""
        system, budget = self.system, request.max_new_tokens
        request.reservation = (len(request.prompt_ids) + budget - 1) * self.kv_bytes
        reason = None
        if budget > system.max_new_tokens_cap:
            reason = f"max_new_tokens {budget} > max_new_tokens_cap {system.max_new_tokens_cap}"
        elif self.in_system >= system.max_requests:
            reason = f"max_requests {system.max_requests} already in the system"
        elif request.reservation > system.kv_cache.device_kv_bytes:
            reason = f"reservation {request.reservation} bytes > device_kv_bytes {system.kv_cache.device_kv_bytes}"
        if reason is not None:
            request.ended = True
            yield REJECT, request, reason
            return
        self.in_system += 1
        self.waiting.append(request)
        yield from self.admit()
        yield from self.dispatch()

    def cancel(self, request: R) -> Decisions[R]:
        """A customer cancels an arrived request: it ends at its next step boundary (at once between works)."""
        if request.ended or request.cancelling:
            return  # already over or already cancelling: intent without effect
        if not request.admitted:
            self.in_system -= 1
            yield from self.finish(request, CANCEL, "cancelled while waiting")
            yield from self.admit()
        elif request in self.ready:
            self.ready.remove(request)
            yield from self.finish(request, CANCEL, "cancelled between steps")
        else:
            request.cancelling = True  # running or reloading
        yield from self.dispatch()

    def step_ended(self, request: R, end: str | None = None, reason: str = "") -> Decisions[R]:
        """The running work's step for `request` ended; `end` (COMPLETE or STOP, with its reason) if that was its
        last. The driver has counted the id selected in `request.step`."""
        if end is not None:
            return self.finish(request, end, reason)
        if request.cancelling:
            return self.finish(request, CANCEL, "cancelled at step boundary")
        self.ready.append(request)
        return ()  # decided without a generator: most steps end so, millions in a long run

    def work_ended(self) -> Decisions[R]:
        """The running work ended (after `step_ended` for each of its requests): the compute is free."""
        self.compute_busy = False
        return self.dispatch()

    def transfer_ended(self) -> Decisions[R]:
        """The transfer in flight ended: the next one starts; a reloaded request is ready, an offload's bytes free."""
        transfer = self.in_flight
        assert transfer is not None, "a transfer ends only after it started"
        direction, state, request = transfer
        if direction == DEVICE_TO_HOST:
            self.cache.end_offload(state)
        else:
            self.cache.end_reload(state)
        yield TRANSFER_END, request, transfer
        self.in_flight = None
        if self.link:
            yield from self.start_transfer()
        if direction == HOST_TO_DEVICE:
            if request.cancelling:
                yield from self.finish(request, CANCEL, "cancelled at reload end")
            else:
                self.ready.append(request)
        else:
            yield from self.admit()
        yield from self.dispatch()

    # -- admission and residency ------------------------------------------

    def admit(self) -> Decisions[R]:
        """FIFO admission of waiting requests while slots and device bytes allow."""
        return self.admitting() if self.waiting else ()  # most ends find nobody waiting: no generator then

    def admitting(self) -> Decisions[R]:
        cache = self.cache
        while self.waiting and self.active < self.max_active:
            request = self.waiting[0]
            if request.ended:
                self.waiting.popleft()
                continue
            state = cache.lookup(request.key) if self.retain_states else None
            credit = state.size if state is not None and state.tier == DEVICE else 0
            need = request.reservation - credit
            if need > cache.device_free():
                shortfall = need - cache.device_free() - cache.offloading_bytes
                evictable = cache.device_lru_bytes - credit
                if shortfall <= 0 or evictable < shortfall:
                    return  # wait for offloads in flight, or for active requests to release
                yield from self.evict(shortfall, state, request)
                continue
            self.waiting.popleft()
            self.active += 1
            request.admitted = True
            if state is not None:
                request.reused, request.reuse_tier = state.positions, HOST if state.tier != DEVICE else DEVICE
            yield ADMIT, request, state
            if state is not None:
                cache.take(state)
            cache.reserved += request.reservation
            yield RESERVE, request, None
            if state is not None and request.reuse_tier == HOST:
                yield RELOAD, request, state
                yield from self.enqueue(Transfer(HOST_TO_DEVICE, state, request))
            else:
                self.ready.append(request)

    def evict(self, shortfall: int, keep: RetainedState | None, head: R) -> Decisions[R]:
        """Move least recently used device states out until `shortfall` bytes will be free for `head`."""
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
                    yield DROP, head, victim
                cache.begin_offload(state)
                yield OFFLOAD, head, state
                yield from self.enqueue(Transfer(DEVICE_TO_HOST, state, head))
            else:
                cache.drop_from_device(state)
                yield DROP, head, state

    def enqueue(self, transfer: Transfer[R]) -> Decisions[R]:
        self.link.append(transfer)
        if self.in_flight is None:
            yield from self.start_transfer()

    def start_transfer(self) -> Decisions[R]:
        self.in_flight = transfer = self.link.popleft()
        yield TRANSFER_START, transfer.request, transfer

    # -- service ---------------------------------------------------------

    def dispatch(self) -> Decisions[R]:
        """Run the next service step if the compute resource is idle (round-robin over ready requests). Its one
        decision, if any, is returned as a tuple: a generator would cost more, on every work of a run."""
        if self.compute_busy or not self.ready:
            return ()
        head = self.ready.popleft()
        if self.batching and head.step > 0:
            batch = [head, *(r for r in self.ready if r.step > 0)]
            self.ready = deque(r for r in self.ready if r.step == 0)
        else:
            batch = [head]
        self.compute_busy = True
        return ((RUN, head, batch),)

    def finish(self, request: R, end: str, reason: str) -> Decisions[R]:
        """The request ends exactly once: release its reservation and retain what it computed."""
        cache = self.cache
        request.ended = True
        yield end, request, reason
        if not request.admitted:
            return
        self.active -= 1
        self.in_system -= 1
        cache.reserved -= request.reservation
        yield RELEASE, request, None
        computed = len(request.prompt_ids) + request.step - 1 if request.step > 0 else request.reused
        retained = 0
        if self.retain_states and computed > 0:
            key = token_key((*request.prompt_ids, *request.output_ids)[:computed])
            if cache.has(key):
                yield RETAIN_SKIP, request, computed
            else:
                state = cache.retain(key, request.request_id)
                yield RETAIN, request, state
                retained = state.size
        yield LEAVE, request, retained
        yield from self.admit()
