"""The customer input of a lab: request arrivals, each a conversation to continue.

A lab file declares its workload in one of two forms (both with `kind`):

* `requests`: explicit arrivals, each `{request_id, arrival_us, turns}`; the
  prompt is the turns framed by the tokenizer with an open assistant turn.
* `conversations`: multi-turn chats, each `{id, arrival_us, turn_gap_us, turns}`
  where `turns` are the client's (an optional leading system turn, then user
  turns). Every user turn issues one request, arriving `turn_gap_us` after the
  previous one, that continues the previous request: its prompt is that
  request's prompt, the model's own reply (closed with TURN_END) and the new
  turn, as a chat client resends the history. Each prompt therefore extends the
  previous request's whole sequence, which is what exact prefix reuse can exploit.

Both expand to a LabWorkload: ordered LabRequests (equal arrival times keep
declaration order), each a request of the spec's Workload with the turns it adds
and the request it continues; `arrivals()` is kvsim's Workload of it (which
requests arrive and when). An optional `actions` list adds the customer's cancel
and consume actions (kvsim's CustomerInteraction) on the same virtual clock.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import Integer, ListOf, Object, String, Tagged, Text
from jgpt.tokenizers.framing import Turn, turns_from_json
from kvsim import CustomerInteraction, RequestArrival, Workload, interaction_json, parse_interaction

KINDS = ("requests", "conversations")

# Turns are read by jgpt.tokenizers.framing.turns_from_json and actions by kvsim.parse_interaction, not from these.
_TURNS = ListOf(Object({}, open=True, about="a Turn: {role, text} (jgpt.tokenizers.framing.turns_from_json)"), 1)
_ACTIONS = ListOf(Object({}, open=True, about="a cancel or consume action of kvsim's CustomerInteraction"))
_REQUEST = Object({"request_id": Text(), "arrival_us": Integer(), "turns": _TURNS})
_CONVERSATION = Object({"id": Text(), "arrival_us": Integer(), "turn_gap_us": Integer(), "turns": _TURNS})
WORKLOAD = Tagged(
    "kind",
    {"requests": Object({"kind": String(KINDS), "requests": ListOf(_REQUEST, 1)}, {"actions": _ACTIONS}),
     "conversations": Object({"kind": String(KINDS), "conversations": ListOf(_CONVERSATION, 1)}, {"actions": _ACTIONS})},
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class LabRequest:
    """One request of the workload: identity, declared arrival, and the conversation it continues."""

    request_id: str
    arrival_us: int
    turns: tuple[Turn, ...]  # the turns this request adds to the conversation
    continues: str | None = None  # the request whose prompt and reply come first

    @property
    def text(self) -> str:
        """The user text this request asks (its last user turn)."""
        return next(turn.text for turn in reversed(self.turns) if turn.role == "user")


@dataclasses.dataclass(frozen=True)
class LabWorkload:
    kind: str
    requests: tuple[LabRequest, ...]
    interaction: CustomerInteraction | None = None
    source: Any = dataclasses.field(default=None, compare=False)  # the declaration it was read from

    def to_json(self, generation: dict[str, Any]) -> dict[str, Any]:
        """The spec's Workload document: RequestArrivals with InferenceRequest text, turns and policy."""
        return {
            "kind": self.kind,
            "requests": [
                {
                    "request_id": r.request_id,
                    "arrival_us": r.arrival_us,
                    "request": {
                        "text": r.text,
                        "turns": [{"role": t.role, "text": t.text} for t in r.turns],
                        "continues": r.continues,
                        "generation": generation,
                    },
                }
                for r in self.requests
            ],
        } | ({"customer_interaction": interaction_json(self.interaction)} if self.interaction else {})

    def arrivals(self) -> Workload:
        """kvsim's Workload of this one: which requests arrive and when (the recorded document holds the rest)."""
        return Workload(self.kind, tuple(RequestArrival(r.request_id, r.arrival_us) for r in self.requests))


def read_workload(value: Any, field: str = "workload") -> LabWorkload:
    WORKLOAD.read(value, field)
    kind, entries = value["kind"], value[value["kind"]]
    if kind == "requests":
        requests = [_request(entry, f"{field}.requests[{i}]") for i, entry in enumerate(entries)]
    else:
        requests = [r for i, entry in enumerate(entries) for r in _conversation(entry, f"{field}.conversations[{i}]")]
    seen: dict[str, int] = {}
    for i, request in enumerate(requests):
        if request.request_id in seen:
            raise ApiError(f"{field}.{kind}", f"request id {request.request_id!r} is declared twice")
        seen[request.request_id] = i
    ordered = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_us, i))
    interaction = _interaction(value["actions"], seen, f"{field}.actions") if "actions" in value else None
    return LabWorkload(kind, tuple(requests[i] for i in ordered), interaction, value)


def _interaction(value: Any, request_ids: dict[str, int], field: str) -> CustomerInteraction:
    """Cancel and consume actions; arrivals come from the requests, so submit is not an action here."""
    interaction = parse_interaction({"actions": value}, field.removesuffix(".actions"))
    for i, action in enumerate(interaction.actions):
        if action.kind == "submit":
            raise ApiError(f"{field}[{i}].kind", "arrivals are the workload's requests; actions cancel or consume")
        if action.request_id not in request_ids:
            raise ApiError(f"{field}[{i}].request_id", f"no request {action.request_id!r} in this workload")
    return interaction


def _request(value: Any, field: str) -> LabRequest:
    turns = turns_from_json(value["turns"], f"{field}.turns")  # at least one: WORKLOAD checked
    if turns[-1].role != "user":
        raise ApiError(f"{field}.turns[{len(turns) - 1}].role", "a request's last turn is the user's")
    return LabRequest(value["request_id"], value["arrival_us"], turns)


def _conversation(value: Any, field: str) -> list[LabRequest]:
    conversation_id, start, gap = value["id"], value["arrival_us"], value["turn_gap_us"]
    turns = turns_from_json(value["turns"], f"{field}.turns")  # at least one: WORKLOAD checked
    for i, turn in enumerate(turns):
        if turn.role == "assistant" or (turn.role == "system" and i > 0):
            raise ApiError(
                f"{field}.turns[{i}].role",
                "a conversation lists the client's turns (an optional first system turn, then user turns); "
                "the model writes the assistant's",
            )
    lead = 1 if turns[0].role == "system" else 0
    if len(turns) == lead:
        raise ApiError(f"{field}.turns", "a conversation has at least one user turn")
    requests: list[LabRequest] = []
    for n, turn in enumerate(turns[lead:]):
        added = turns[: lead + 1] if n == 0 else (turn,)
        previous = requests[-1].request_id if requests else None
        requests.append(LabRequest(f"{conversation_id}.{n}", start + n * gap, added, previous))
    return requests
