"""Workload (ordered RequestArrivals) and CustomerInteraction (submit, consume, cancel actions).

Array order breaks equal-time ties in both. A request's ids and work counts come
from the recorded computation document; a Workload only says which of its
requests arrive and when. Submissions in a CustomerInteraction declare arrivals
too, so a scenario gives arrivals either as a workload or as submissions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import Description, Integer, ListOf, Object, String, Tagged
from kvsim.recorded import RecordedComputations

CLOCK = "virtual_us"
# The latest declared time (an arrival, an action) a run on the wall clock waits for: one day after its start.
# kvsim's virtual clock takes any time up to 2^53 us; the InferenceEngine (`jgpt serve`, a lab's engine arms)
# sleeps until each, and one of 2^53 us (285 years) held `serve` for ever, `--as-fast-as-possible` too.
WALL_CLOCK_LIMIT_US = 86_400_000_000


class ActionKind(StrEnum):
    SUBMIT = "submit"  # the request arrives
    CONSUME = "consume"  # the customer reads the output up to output_bytes
    CANCEL = "cancel"


ACTION_KINDS = tuple(ActionKind)

ARRIVAL = Object({"request_id": String(), "arrival_us": Integer()})
WORKLOAD = Object({"kind": String(), "requests": ListOf(ARRIVAL)}, about="Workload: ordered RequestArrivals.")


def _interaction(at_us: Integer) -> Object:
    action: dict[str, Description] = {"kind": String(ACTION_KINDS), "at_us": at_us, "request_id": String()}
    tagged = Tagged("kind", {kind: Object(action | ({"output_bytes": Integer()} if kind == "consume" else {}))
                             for kind in ACTION_KINDS})  # fmt: skip
    return Object(
        {"actions": ListOf(tagged)}, {"clock": String((CLOCK,))}, about="CustomerInteraction: submit, consume, cancel."
    )


INTERACTION = _interaction(Integer())
# A served workload's actions (`jgpt serve`): on the wall clock, so at most WALL_CLOCK_LIMIT_US.
SERVED_INTERACTION = _interaction(Integer(maximum=WALL_CLOCK_LIMIT_US))


@dataclass(frozen=True)
class RequestArrival:
    request_id: str
    arrival_us: int


@dataclass(frozen=True)
class Workload:
    kind: str
    requests: tuple[RequestArrival, ...]


@dataclass(frozen=True)
class CustomerAction:
    kind: ActionKind
    at_us: int
    request_id: str
    output_bytes: int = 0  # consume: cumulative application-output bytes wanted


@dataclass(frozen=True)
class CustomerInteraction:
    clock: str
    actions: tuple[CustomerAction, ...]


def check_wall_clock(time_us: int, field: str) -> None:
    """Refuse, naming `field`, a declared time past WALL_CLOCK_LIMIT_US: no run on the wall clock waits for it."""
    if time_us > WALL_CLOCK_LIMIT_US:
        raise ApiError(
            field,
            f"{time_us} us is past {WALL_CLOCK_LIMIT_US} us (one day), the latest time a wall-clock run waits for",
        )


def recorded_workload(computations: RecordedComputations) -> Workload:
    """The arrivals the document itself declares, in document order."""
    return Workload("recorded", tuple(RequestArrival(r.request_id, r.arrival_us) for r in computations.requests))


def parse_workload(value: Any, field: str = "workload") -> Workload:
    top = WORKLOAD.read(value, field)
    arrivals = (RequestArrival(item["request_id"], item["arrival_us"]) for item in top["requests"])
    return Workload(top["kind"], tuple(arrivals))


def parse_interaction(value: Any, field: str = "customer_interaction") -> CustomerInteraction:
    top = INTERACTION.read(value, field)
    actions = (
        CustomerAction(ActionKind(a["kind"]), a["at_us"], a["request_id"], a.get("output_bytes", 0))
        for a in top["actions"]
    )
    return CustomerInteraction(top.get("clock", CLOCK), tuple(actions))


def resolve_workload(
    computations: RecordedComputations,
    workload: Workload | None,
    interaction: CustomerInteraction | None,
) -> Workload:
    """The arrivals a run uses, checked against the document and the customer's actions."""
    submissions = [a for a in interaction.actions if a.kind == "submit"] if interaction else []
    if submissions and workload is not None:
        raise ApiError(
            "customer_interaction.actions", "give arrivals either as a workload or as submit actions, not both"
        )
    if submissions:
        workload = Workload("customer_interaction", tuple(RequestArrival(a.request_id, a.at_us) for a in submissions))
    elif workload is None:
        workload = recorded_workload(computations)
    known = {r.request_id for r in computations.requests}
    arrived: set[str] = set()
    for index, arrival in enumerate(workload.requests):
        if arrival.request_id not in known:
            raise ApiError(
                f"workload.requests[{index}].request_id", f"no recorded computations for request {arrival.request_id!r}"
            )
        if arrival.request_id in arrived:
            raise ApiError(f"workload.requests[{index}].request_id", f"request {arrival.request_id!r} arrives twice")
        arrived.add(arrival.request_id)
    for index, action in enumerate(interaction.actions if interaction else ()):
        if action.request_id not in arrived:
            raise ApiError(
                f"customer_interaction.actions[{index}].request_id", f"unknown request {action.request_id!r}"
            )
    return workload


def workload_json(workload: Workload) -> dict:
    return {
        "kind": workload.kind,
        "requests": [{"request_id": a.request_id, "arrival_us": a.arrival_us} for a in workload.requests],
    }


def interaction_json(interaction: CustomerInteraction) -> dict:
    return {
        "clock": interaction.clock,
        "actions": [
            {"kind": a.kind, "at_us": a.at_us, "request_id": a.request_id}
            | ({"output_bytes": a.output_bytes} if a.kind == "consume" else {})
            for a in interaction.actions
        ],
    }
