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

from jgpt.errors import ApiError
from jgpt.validation import Description, Integer, ListOf, Object, String, Tagged
from kvsim.recorded import RecordedComputations

CLOCK = "virtual_us"


class ActionKind(StrEnum):
    SUBMIT = "submit"  # the request arrives
    CONSUME = "consume"  # the customer reads the output up to output_bytes
    CANCEL = "cancel"


ACTION_KINDS = tuple(ActionKind)

ARRIVAL = Object({"request_id": String(), "arrival_us": Integer()})
WORKLOAD = Object({"kind": String(), "requests": ListOf(ARRIVAL)}, about="Workload: ordered RequestArrivals.")
_ACTION: dict[str, Description] = {"kind": String(ACTION_KINDS), "at_us": Integer(), "request_id": String()}
ACTION = Tagged("kind", {kind: Object(_ACTION | ({"output_bytes": Integer()} if kind == "consume" else {}))
                         for kind in ACTION_KINDS})  # fmt: skip
INTERACTION = Object(
    {"actions": ListOf(ACTION)}, {"clock": String((CLOCK,))}, about="CustomerInteraction: submit, consume, cancel."
)


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
