"""The recorded computation document (version 1): the only interface from inference to kvsim.

`inference` writes it (`jgpt record`, documented in docs/recorded-computations.md);
kvsim reads the counts it needs and nothing else. Other packages may add fields,
so unknown fields in the document are ignored, while the fields kvsim reads are
checked for type and consistency. `document_json` writes back exactly the part
kvsim consumed, which is what a CacheRun record embeds for replay.

kvsim assumes no tokenizer: the turn end is the id the document's complete
requests end with, and `output_token_bytes` says how many text bytes each output
id spells (without it, ids below 256 are read as single bytes).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Protocol

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import Boolean, Const, Integer, Integers, ListOf, Nullable, Object, String

FORMAT = "jgpt-recorded-computations"
VERSION = 1
# inference.policy's stop reasons (kvsim imports no jax); only the first one completes a request.
STOP_REASONS = ("turn_end", "max_new_tokens", "context")
# A document without output_token_bytes is read as byte-level: an id below this spells one byte.
BYTE_IDS = 256


# token_key packs ids as 32-bit unsigned integers.
TOKEN_ID_LIMIT = 1 << 32

# The fields kvsim reads (other packages may add more: every object is open). `parse_document`
# reads with these, and `jgpt schema recorded-computations` writes them as a JSON Schema.
_OPEN = Object({}, open=True)
TOKEN_IDS = Integers(maximum=TOKEN_ID_LIMIT - 1)
OUTCOME = Object(
    {"selected_tokens": Integer(), "published_tokens": Integer(), "unused_budget": Integer(),
     "stop_reason": String(STOP_REASONS), "complete": Boolean()},
    open=True,
)  # fmt: skip
PREFILL_COSTS = Object(
    {"fixed_matmul_flops": Integer(), "fixed_memory_bytes": Integer(), "position_matmul_flops": Integers(),
     "position_memory_bytes": Integers()},
    open=True,
)  # fmt: skip
DECODE_STEP = Object({"position": Integer(), "matmul_flops": Integer(), "logical_memory_bytes": Integer()}, open=True)
REQUEST = Object(
    {"request_id": String(), "arrival_us": Integer(), "prompt_ids": TOKEN_IDS, "max_new_tokens": Integer(1),
     "output_ids": TOKEN_IDS, "outcome": OUTCOME, "prefill_costs": PREFILL_COSTS, "decode_steps": ListOf(DECODE_STEP)},
    {"output_token_bytes": Nullable(Integers())},
    open=True,
)  # fmt: skip
MODEL_REFERENCE = Object(
    {"checkpoint_sha256": String(), "tokenizer_sha256": String(), "architecture": _OPEN}, open=True
)
DOCUMENT = Object(
    {"format": Const(FORMAT), "version": Const(VERSION), "model": MODEL_REFERENCE, "kv_bytes_per_position": Integer(1),
     "execution": Object({"backend": _OPEN, "provenance": _OPEN}, open=True), "requests": ListOf(REQUEST)},
    open=True,
    about="The recorded computation document (docs/recorded-computations.md): the only interface from inference to kvsim.",
)  # fmt: skip


def token_key(ids: Sequence[int]) -> bytes:
    """Token ids as fixed-width bytes: a prefix of ids is a prefix of the key (4 bytes per id)."""
    return array("I", ids).tobytes()


class ClosedFormCosts(Protocol):
    """A prefix-cost table in closed form (kvsim.analytic): cum[i] for any i, and its first n increments."""

    def __getitem__(self, i: int, /) -> int: ...

    def increments(self, n: int) -> list[int]: ...


PrefixCosts = Sequence[int] | ClosedFormCosts  # a document's prefix sums, or a closed form


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request's ids and work counts; `cum_*[i]` is the cost of prompt positions [0, i)."""

    request_id: str
    arrival_us: int
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    output_ids: tuple[int, ...]
    outcome: dict
    fixed_matmul_flops: int
    fixed_memory_bytes: int
    cum_flops: PrefixCosts  # may be longer than the prompt (shared analytic tables)
    cum_bytes: PrefixCosts
    decode_positions: tuple[int, ...]
    decode_flops: tuple[int, ...]
    decode_bytes: tuple[int, ...]
    output_token_bytes: tuple[int, ...] | None = None

    def prefill_cost(self, reused: int) -> tuple[int, int]:
        """(matmul_flops, memory_bytes) of a prefill that reuses the first `reused` prompt positions."""
        n = len(self.prompt_ids)
        return (
            self.fixed_matmul_flops + self.cum_flops[n] - self.cum_flops[reused],
            self.fixed_memory_bytes + self.cum_bytes[n] - self.cum_bytes[reused],
        )

    def published_bytes(self) -> tuple[int, ...]:
        """Application-output bytes each selected id contributes when published."""
        if self.output_token_bytes is not None:
            return self.output_token_bytes
        published = self.outcome["published_tokens"]  # all but a turn end, which is last
        if any(i >= BYTE_IDS for i in self.output_ids[:published]):
            raise ApiError(
                f"computations.requests[{self.request_id}].output_token_bytes",
                f"needed to consume output of ids that are not bytes (>= {BYTE_IDS}); the document does not give it",
            )
        return (1,) * published + (0,) * (len(self.output_ids) - published)


@dataclass(frozen=True)
class RecordedComputations:
    model: dict  # ModelArtifactReference: checkpoint_sha256, tokenizer_sha256, architecture
    kv_bytes_per_position: int
    execution: dict  # {"backend": ExecutionBackend, "provenance": ExecutionProvenance}
    requests: tuple[RecordedRequest, ...]


@dataclass(frozen=True)
class StreamedComputations:
    """A recorded computation document too large to hold (a million requests): each call of `requests` makes
    its requests anew, in arrival order, and they arrive when the document says (its recorded workload).
    `kvsim.record_lines.write_lines` simulates it into a streamed record; replaying that record gives the
    same record from the document held in memory."""

    model: dict
    kv_bytes_per_position: int
    execution: dict
    requests: Callable[[], Iterator[RecordedRequest]]


def parse_document(value: Any, field: str = "computations") -> RecordedComputations:
    top = DOCUMENT.read(value, field)
    requests = tuple(parse_request(item, f"{field}.requests[{index}]") for index, item in enumerate(top["requests"]))
    seen: set[str] = set()
    for index, request in enumerate(requests):
        if request.request_id in seen:
            raise ApiError(f"{field}.requests[{index}].request_id", f"duplicate request id {request.request_id!r}")
        seen.add(request.request_id)
    _check_turn_end(requests, field)
    model, execution = top["model"], top["execution"]
    return RecordedComputations(
        model={k: model[k] for k in ("checkpoint_sha256", "tokenizer_sha256", "architecture")},
        kv_bytes_per_position=top["kv_bytes_per_position"],
        execution={"backend": execution["backend"], "provenance": execution["provenance"]},
        requests=requests,
    )


def _check_turn_end(requests: tuple[RecordedRequest, ...], field: str) -> None:
    """The document's turn end is the id its complete requests end with (kvsim assumes no tokenizer):
    one id, never selected before the end of any output (generation stops at the first)."""
    complete = [(index, request) for index, request in enumerate(requests) if request.outcome["complete"]]
    if not complete:
        return
    first, turn_end = complete[0][0], complete[0][1].output_ids[-1]
    for index, request in complete:
        check_complete_end(request, turn_end, f"{field}.requests[{index}]", f" (as requests[{first}] does)")
    for index, request in enumerate(requests):
        check_stops_at_turn_end(request, turn_end, f"{field}.requests[{index}]")


def check_complete_end(request: RecordedRequest, turn_end: int | None, field: str, source: str = "") -> None:
    """A complete request ends with the document's turn end (`source` says where that was read)."""
    if request.outcome["complete"] and request.output_ids[-1] != turn_end:
        raise ApiError(
            f"{field}.output_ids",
            f"a complete request ends with the turn end {turn_end}{source}, got {request.output_ids[-1]}",
        )


def check_stops_at_turn_end(request: RecordedRequest, turn_end: int | None, field: str) -> None:
    """No published id is the turn end: generation stops at the first."""
    published = request.output_ids[: request.outcome["published_tokens"]]
    if turn_end in published:
        raise ApiError(
            f"{field}.output_ids[{published.index(turn_end)}]",
            f"is the turn end {turn_end} complete requests end with; generation stops at the first",
        )


def parse_request(item: dict, field: str) -> RecordedRequest:
    """One request that REQUEST has read: its counts checked against each other."""
    prompt, budget, output = item["prompt_ids"], item["max_new_tokens"], item["output_ids"]
    if not prompt:
        raise ApiError(f"{field}.prompt_ids", "a prompt needs at least one id")
    if not 1 <= len(output) <= budget:
        raise ApiError(f"{field}.output_ids", f"expected 1 to max_new_tokens={budget} ids, got {len(output)}")
    outcome = _parse_outcome(item["outcome"], f"{field}.outcome", output, budget)
    costs = item["prefill_costs"]
    per_position = []
    for name in ("position_matmul_flops", "position_memory_bytes"):
        values = costs[name]
        if len(values) != len(prompt):
            raise ApiError(
                f"{field}.prefill_costs.{name}",
                f"expected {len(prompt)} entries (one per prompt position), got {len(values)}",
            )
        per_position.append(list(accumulate(values, initial=0)))
    steps = item["decode_steps"]
    if len(steps) != len(output) - 1:
        raise ApiError(
            f"{field}.decode_steps",
            f"expected {len(output) - 1} steps (one per output id after the first), got {len(steps)}",
        )
    decode = tuple(zip(*((s["position"], s["matmul_flops"], s["logical_memory_bytes"]) for s in steps))) or ((), (), ())
    token_bytes = item.get("output_token_bytes")
    if token_bytes is not None:
        token_bytes = tuple(token_bytes)
        if len(token_bytes) != len(output):
            raise ApiError(f"{field}.output_token_bytes", f"expected {len(output)} entries, got {len(token_bytes)}")
    return RecordedRequest(
        request_id=item["request_id"],
        arrival_us=item["arrival_us"],
        prompt_ids=tuple(prompt),
        max_new_tokens=budget,
        output_ids=tuple(output),
        outcome=outcome,
        fixed_matmul_flops=costs["fixed_matmul_flops"],
        fixed_memory_bytes=costs["fixed_memory_bytes"],
        cum_flops=per_position[0],
        cum_bytes=per_position[1],
        decode_positions=decode[0],
        decode_flops=decode[1],
        decode_bytes=decode[2],
        output_token_bytes=token_bytes,
    )


def _parse_outcome(item: dict, field: str, output: list[int], budget: int) -> dict:
    expected = {
        "selected_tokens": len(output),
        "published_tokens": len(output) - item["complete"],  # all but the turn end that completes it
        "unused_budget": budget - len(output),
        "complete": item["complete"],
    }
    for name, want in expected.items():
        if item[name] != want or type(item[name]) is not type(want):
            raise ApiError(f"{field}.{name}", f"inconsistent with output_ids: expected {want!r}, got {item[name]!r}")
    reason = item["stop_reason"]
    if (reason == STOP_REASONS[0]) != expected["complete"]:
        raise ApiError(f"{field}.stop_reason", f"{reason!r} disagrees with complete={expected['complete']}")
    return {**expected, "stop_reason": reason}


def document_json(computations: RecordedComputations) -> dict:
    """The consumed part of the document, in its own field names (replay reads it back)."""
    document = {
        "format": FORMAT,
        "version": VERSION,
        "model": computations.model,
        "kv_bytes_per_position": computations.kv_bytes_per_position,
        "execution": computations.execution,
        "requests": [request_json(r) for r in computations.requests],
    }
    return document


def request_json(request: RecordedRequest) -> dict:
    n = len(request.prompt_ids)
    item = {
        "request_id": request.request_id,
        "arrival_us": request.arrival_us,
        "prompt_ids": list(request.prompt_ids),
        "max_new_tokens": request.max_new_tokens,
        "output_ids": list(request.output_ids),
        "outcome": {
            k: request.outcome[k]
            for k in ("selected_tokens", "published_tokens", "unused_budget", "stop_reason", "complete")
        },
        "prefill_costs": {
            "fixed_matmul_flops": request.fixed_matmul_flops,
            "fixed_memory_bytes": request.fixed_memory_bytes,
            "position_matmul_flops": _differences(request.cum_flops, n),
            "position_memory_bytes": _differences(request.cum_bytes, n),
        },
        "decode_steps": [
            {"position": p, "matmul_flops": f, "logical_memory_bytes": b}
            for p, f, b in zip(request.decode_positions, request.decode_flops, request.decode_bytes, strict=True)
        ],
    }
    if request.output_token_bytes is not None:
        item["output_token_bytes"] = list(request.output_token_bytes)
    return item


def _differences(cumulative: PrefixCosts, n: int) -> list[int]:
    # Closed-form tables give theirs directly. Told apart by the method: an isinstance check against the
    # Sequence ABC took a sixth of request_json's time.
    if hasattr(cumulative, "increments"):
        return cumulative.increments(n)
    return [b - a for a, b in zip(cumulative[:n], cumulative[1 : n + 1], strict=True)]
