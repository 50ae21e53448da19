"""Live traffic: requests arriving while the InferenceEngine runs, and what it publishes back, across two threads.

The RequestEndpoint runs on an asyncio loop; the InferenceEngine runs on a thread of its own, because each
of its works blocks while it computes. They meet here, and nowhere else:

* the endpoint's side, `EngineBridge`: `submit` a request and read what is published for it as an async
  iterator (`Accepted` or at once `Ended` with a rejection; then each `Selected` id as it is decided; then
  `Ended` with the request's outcome, kvsim's fields); `cancel` it; `close` (no more arrivals: the engine
  ends once every request in it has ended) and await the engine's result;
* the engine's side, `LiveTraffic`: `take` the next happening (an arrival or a cancel) with the time it
  happened on the engine's clock, in the order they happened; `publish` into a batch that `flush` hands the
  loop once per happening, so the loop wakes once per decode step however many requests it advanced; and
  `gauges`, the engine's counts and bytes after its last happening, read by the endpoint's metrics.

Cancels the engine took are kept with their times (`actions`), so the run can be written as a measured run
whose customer interaction kvsim replays.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from inference.policy import InferenceRequest
from kvsim import CustomerInteraction, parse_interaction

ARRIVE, CANCEL = "arrive", "cancel"
# While the engine's thread runs beside the event loop, the interpreter hands the GIL over at least this often
# (Python's default is 5 ms). A thread that wants the GIL waits up to the interval while the other runs Python,
# and every engine step wants it back after each jitted call: with 5 ms, a loop busy reading a burst of
# requests stalled the engine's steps (saturated bench/serving.py: HTTP at 0.67 of in-process throughput,
# 0.90 with 1 ms; medians of 5 runs each).
SWITCH_INTERVAL_S = 0.001
_CLOSE = "close"
Result = TypeVar("Result")


@dataclasses.dataclass(frozen=True)
class Accepted:
    """The engine took the request into the system: it waits for admission, then runs."""


@dataclasses.dataclass(frozen=True)
class Selected:
    token_id: int  # one id the request selected, in order (the end of the turn included)


@dataclasses.dataclass(frozen=True)
class Ended:
    outcome: dict  # the request's outcome, kvsim's fields (status, stop_reason, latencies, token counts)


@dataclasses.dataclass(frozen=True)
class Failed:
    reason: str  # the engine stopped with an error: nothing more will be published


Publication = Accepted | Selected | Ended | Failed


@dataclasses.dataclass(frozen=True)
class Gauges:
    """The engine's state after its last happening."""

    waiting: int = 0  # requests in the system not yet admitted
    running: int = 0  # admitted requests not yet ended
    device_kv_bytes: int = 0  # reserved and retained on the device
    host_kv_bytes: int = 0  # retained on the host


class LiveTraffic:
    """The engine's side: happenings in, publications out. Every method but `arrive`, `cancel` and `close` is the
    engine thread's."""

    def __init__(self, deliver: Callable[[list[tuple[str, Publication]]], None]):
        self.inbox: queue.SimpleQueue[tuple[int, str, Any]] = queue.SimpleQueue()
        self.deliver = deliver
        self.batch: list[tuple[str, Publication]] = []
        self.due: deque[tuple[int, str, Any]] = deque()
        self.closed = False
        self.started_ns = 0
        self.actions: list[dict] = []  # each cancel the engine took, a customer action on its clock
        self.gauges = Gauges()

    # -- the endpoint's side (any thread) --------------------------------

    def arrive(self, request: InferenceRequest) -> None:
        self.inbox.put((time.monotonic_ns(), ARRIVE, request))

    def cancel(self, request_id: str) -> None:
        self.inbox.put((time.monotonic_ns(), CANCEL, request_id))

    def close(self) -> None:
        self.inbox.put((time.monotonic_ns(), _CLOSE, None))

    # -- the engine's side -------------------------------------------------

    def start(self, started_ns: int) -> None:
        """The engine's clock starts: times are microseconds after `started_ns` (time.monotonic_ns) from now on."""
        self.started_ns = started_ns

    def upcoming(self, wait: bool) -> int | None:
        """When the next happening happened, or None: none yet (`wait` False), or none ever again (closed, and
        every happening taken). With `wait`, blocks until one comes."""
        while not self.due and not self.closed:
            try:
                self.receive(self.inbox.get(block=wait))
            except queue.Empty:
                break
        while True:  # whatever else has come meanwhile, so the next is the earliest
            try:
                self.receive(self.inbox.get_nowait())
            except queue.Empty:
                break
        return self.microseconds(self.due[0][0]) if self.due else None

    def receive(self, item: tuple[int, str, Any]) -> None:
        if item[1] == _CLOSE:
            self.closed = True
        else:
            self.due.append(item)

    def microseconds(self, monotonic_ns: int) -> int:
        return max(0, (monotonic_ns - self.started_ns) // 1000)

    def take(self) -> tuple[int, str, Any]:
        """The next happening (`upcoming` said there is one): (its time on the engine's clock, ARRIVE or CANCEL,
        the InferenceRequest or the cancel as a customer action)."""
        stamp, what, payload = self.due.popleft()
        at_us = self.microseconds(stamp)
        if what == CANCEL:
            self.actions.append({"kind": "cancel", "at_us": at_us, "request_id": payload})
            payload = parse_interaction({"actions": self.actions[-1:]}).actions[0]
        return at_us, what, payload

    def interaction(self) -> CustomerInteraction | None:
        """The cancels the engine took, as the customer interaction of its run (None: there were none)."""
        return parse_interaction({"actions": self.actions}) if self.actions else None

    def publish(self, request_id: str, publication: Publication) -> None:
        self.batch.append((request_id, publication))

    def flush(self, gauges: Gauges) -> None:
        """Hand over what this happening published, and the engine's state after it."""
        self.gauges = gauges
        if self.batch:
            batch, self.batch = self.batch, []
            self.deliver(batch)


class Publications:
    """What the engine publishes for one request, in order, ending after `Ended` or `Failed`: an async iterator of
    publications, or with `group` everything published for it since the last look. A stream that writes a group
    at a time writes once per look however far the engine got meanwhile (a deque and one waiter: the loop's
    cost per publication is what a stream's throughput pays)."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.ready: deque[Publication] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.over = False  # the last publication has been taken

    def put(self, publication: Publication) -> None:
        """On the loop: one more publication (the bridge's)."""
        self.ready.append(publication)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def arrival(self) -> None:
        while not self.ready:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    def __aiter__(self) -> AsyncIterator[Publication]:
        return self

    async def __anext__(self) -> Publication:
        if self.over:
            raise StopAsyncIteration
        await self.arrival()
        publication = self.ready.popleft()
        self.over = isinstance(publication, (Ended, Failed))
        return publication

    async def group(self) -> list[Publication]:
        """Every publication not taken yet, once there is one; [] once the last has been taken."""
        if self.over:
            return []
        await self.arrival()
        taken, self.ready = list(self.ready), deque()
        self.over = isinstance(taken[-1], (Ended, Failed))
        return taken


class Closed(Exception):
    """The bridge takes no more requests: it is draining, or the engine has stopped."""


class EngineBridge(Generic[Result]):
    """The endpoint's side, on its asyncio loop. `start` runs `serve(traffic)` (the engine's live loop) on its own
    thread; `observe` sees every publication on the loop, before the request's reader does (metrics);
    `on_failure` is called on the loop if the engine stops with an error."""

    def __init__(
        self, observe: Callable[[str, Publication], None] | None = None, on_failure: Callable[[], None] | None = None
    ):
        self.observe, self.on_failure = observe, on_failure
        self.readers: dict[str, Publications] = {}
        self.traffic = LiveTraffic(self.deliver)
        self.result: concurrent.futures.Future[Result] = concurrent.futures.Future()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.failure: str | None = None
        self.switch_interval = sys.getswitchinterval()  # the interpreter's, put back when the engine stops
        self.thread: threading.Thread | None = None  # the engine's, once started

    def start(self, serve: Callable[[LiveTraffic], Result]) -> None:
        self.loop = asyncio.get_running_loop()
        self.switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.thread = threading.Thread(target=self.run, args=(serve,), name="inference-engine", daemon=True)
        self.thread.start()

    def run(self, serve: Callable[[LiveTraffic], Result]) -> None:
        try:
            self.result.set_result(serve(self.traffic))
        except BaseException as error:  # the engine thread ends; the endpoint must learn why, not hang
            self.result.set_exception(error)
            assert self.loop is not None, "started on a loop"
            self.loop.call_soon_threadsafe(self.fail, f"the inference engine stopped: {type(error).__name__}: {error}")

    def submit(self, request: InferenceRequest) -> Publications:
        if self.closed or self.failure is not None:
            raise Closed(self.failure or "the server is shutting down")
        reader = Publications(request.request_id)
        self.readers[request.request_id] = reader
        self.traffic.arrive(request)
        return reader

    def cancel(self, request_id: str) -> None:
        """Cancel a request still running (a client gone): it ends at its next step boundary, its slot freed."""
        reader = self.readers.get(request_id)
        if reader is not None and self.failure is None:
            self.traffic.cancel(request_id)

    @property
    def in_flight(self) -> int:
        return len(self.readers)

    async def stop(self) -> Result:
        """No more requests; the engine's result once every request in it has ended."""
        if not self.closed:
            self.closed = True
            self.traffic.close()
        try:
            return await asyncio.wrap_future(self.result)
        finally:
            sys.setswitchinterval(self.switch_interval)

    def deliver(self, batch: list[tuple[str, Publication]]) -> None:
        """The engine thread's handover: onto the loop in one call."""
        assert self.loop is not None, "started on a loop"
        self.loop.call_soon_threadsafe(self.receive, batch)

    def receive(self, batch: list[tuple[str, Publication]]) -> None:
        for request_id, publication in batch:
            if self.observe is not None:
                self.observe(request_id, publication)
            reader = self.readers.get(request_id)
            if reader is None:
                continue
            reader.put(publication)
            if isinstance(publication, Ended):
                del self.readers[request_id]

    def fail(self, reason: str) -> None:
        self.failure = reason
        for reader in self.readers.values():
            reader.put(Failed(reason))
        self.readers.clear()
        if self.on_failure is not None:
            self.on_failure()
