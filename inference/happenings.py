"""What the InferenceEngine's loop takes besides the ends of its own works: arrivals and customer actions.

Two sources, one loop: a Workload's declared arrivals and its customer interaction, each taken at its
declared time (`InferenceEngine.serve`), or live traffic, each arrival and cancel taken as it comes, at
the time it happened (`LiveEngine.serve`). Either way a happening is ordered by (time, sequence) against
the works' ends the loop schedules: a declared one is numbered before every scheduled end, a live one
sorts first among equal times, so both come before any work's end after them, as in kvsim.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from inference.live_traffic import ARRIVE as LIVE_ARRIVAL
from inference.live_traffic import LiveTraffic
from inference.policy import InferenceRequest

ARRIVE, ACTION = 0, 1  # what a happening is, in the engine's numbering of happenings
# The last stretch before a declared happening is waited for busily: a sleep to the happening itself
# oversleeps by a tenth of a millisecond or more, and the engine is the instrument that says when the
# happening was seen.
SPIN_US = 2000


class Arriving(Protocol):
    arrival: int  # microseconds on the engine's clock


R = TypeVar("R", bound=Arriving)


class Declared(Generic[R]):
    """A Workload's arrivals and its customer's actions, each taken at its declared time (waited for, unless as
    fast as possible)."""

    def __init__(self, requests: Sequence[R], actions: Sequence, as_fast_as_possible: bool):
        declared = [(r.arrival, i, ARRIVE, r) for i, r in enumerate(requests)]
        declared += [(a.at_us, len(declared) + j, ACTION, a) for j, a in enumerate(actions)]
        declared.sort()
        self.declared, self.position, self.as_fast_as_possible = declared, 0, as_fast_as_possible
        self.sequences = len(declared)  # a work's end scheduled at a declared time comes after it

    def start(self, started_ns: int) -> None:
        pass

    def upcoming(self, wait: bool) -> tuple[int, int] | None:
        """(time, sequence) of the next happening, or None when all are taken."""
        return self.declared[self.position][:2] if self.position < len(self.declared) else None

    def take(self, clock: Callable[[], int]) -> tuple[int, Any]:
        """The next happening, (ARRIVE, request) or (ACTION, customer action), once its time has come."""
        at, _, what, payload = self.declared[self.position]
        self.position += 1
        while not self.as_fast_as_possible and (late := at - clock()) > 0:
            if late > SPIN_US:
                time.sleep((late - SPIN_US) / 1e6)
        return what, payload


class Live(Generic[R]):
    """Arrivals and cancels as they come (LiveTraffic), each at the time it happened; `arrived` makes the engine's
    request of an InferenceRequest and its arrival time."""

    sequences = 0

    def __init__(self, traffic: LiveTraffic, arrived: Callable[[InferenceRequest, int], R]):
        self.traffic, self.arrived = traffic, arrived
        self.requests: list[R] = []  # in arrival order

    def start(self, started_ns: int) -> None:
        self.traffic.start(started_ns)

    def upcoming(self, wait: bool) -> tuple[int, int] | None:
        """(time, -1) of the next happening; None when none has come (or, with `wait`, none ever will)."""
        at = self.traffic.upcoming(wait)
        return None if at is None else (at, -1)

    def take(self, clock: Callable[[], int]) -> tuple[int, Any]:
        at, what, payload = self.traffic.take()
        if what != LIVE_ARRIVAL:
            return ACTION, payload
        request = self.arrived(dataclasses.replace(payload, arrival_us=at), at)
        self.requests.append(request)
        return ARRIVE, request
