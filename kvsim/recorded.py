"""The recorded computation document (version 1): the only interface from inference to kvsim.

`inference` writes it (`jgpt record`, documented in docs/recorded-computations.md);
kvsim reads the counts it needs and nothing else. Other packages may add fields,
so unknown fields in the document are ignored, while the fields kvsim reads are
checked for type and consistency. `document_json` writes back exactly the part
kvsim consumed, which is what a CacheRun record embeds for replay.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from jgpt.errors import ApiError
from kvsim import fields

FORMAT = "jgpt-recorded-computations"
VERSION = 1
TURN_END = 259
# inference.policy's stop reasons (kvsim imports no jax); only the first one completes a request.
STOP_REASONS = ("turn_end", "max_new_tokens", "context")
FIRST_MERGED_ID = 260


# token_key packs ids as 32-bit unsigned integers.
TOKEN_ID_LIMIT = 1 << 32


def _token_ids(value: Any, field: str) -> list[int]:
    ids = fields.integers(value, field)
    if ids and max(ids) >= TOKEN_ID_LIMIT:
        raise ApiError(f"{field}[{ids.index(max(ids))}]", f"token ids are below 2^32, got {max(ids)}")
    return ids


def token_key(ids: Sequence[int]) -> bytes:
    """Token ids as fixed-width bytes: a prefix of ids is a prefix of the key (4 bytes per id)."""
    return array("I", ids).tobytes()


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
    cum_flops: Sequence[int]  # may be longer than the prompt (shared analytic tables)
    cum_bytes: Sequence[int]
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
        if any(i >= FIRST_MERGED_ID for i in self.output_ids):
            raise ApiError(
                f"computations.requests[{self.request_id}].output_token_bytes",
                "needed to consume output of merged token ids (>= 260); the document does not give it",
            )
        return tuple(1 if i < 256 else 0 for i in self.output_ids)


@dataclass(frozen=True)
class RecordedComputations:
    model: dict  # ModelArtifactReference: checkpoint_sha256, tokenizer_sha256, architecture
    kv_bytes_per_position: int
    execution: dict  # {"backend": ExecutionBackend, "provenance": ExecutionProvenance}
    requests: tuple[RecordedRequest, ...]


def parse_document(value: Any, field: str = "computations") -> RecordedComputations:
    top = fields.loose_mapping(
        value, field, {"format", "version", "model", "kv_bytes_per_position", "execution", "requests"}
    )
    if top["format"] != FORMAT:
        raise ApiError(f"{field}.format", f"expected {FORMAT!r}, got {top['format']!r}")
    if top["version"] != VERSION:
        raise ApiError(f"{field}.version", f"kvsim reads version {VERSION}, got {top['version']!r}")
    model = fields.loose_mapping(
        top["model"], f"{field}.model", {"checkpoint_sha256", "tokenizer_sha256", "architecture"}
    )
    fields.string(model["checkpoint_sha256"], f"{field}.model.checkpoint_sha256")
    fields.string(model["tokenizer_sha256"], f"{field}.model.tokenizer_sha256")
    fields.loose_mapping(model["architecture"], f"{field}.model.architecture", set())
    execution = fields.loose_mapping(top["execution"], f"{field}.execution", {"backend", "provenance"})
    fields.loose_mapping(execution["backend"], f"{field}.execution.backend", set())
    fields.loose_mapping(execution["provenance"], f"{field}.execution.provenance", set())
    requests = tuple(
        _parse_request(item, f"{field}.requests[{index}]")
        for index, item in enumerate(fields.array(top["requests"], f"{field}.requests"))
    )
    seen: set[str] = set()
    for index, request in enumerate(requests):
        if request.request_id in seen:
            raise ApiError(f"{field}.requests[{index}].request_id", f"duplicate request id {request.request_id!r}")
        seen.add(request.request_id)
    return RecordedComputations(
        model={k: model[k] for k in ("checkpoint_sha256", "tokenizer_sha256", "architecture")},
        kv_bytes_per_position=fields.integer(top["kv_bytes_per_position"], f"{field}.kv_bytes_per_position", 1),
        execution={"backend": execution["backend"], "provenance": execution["provenance"]},
        requests=requests,
    )


def _parse_request(value: Any, field: str) -> RecordedRequest:
    item = fields.loose_mapping(
        value,
        field,
        {
            "request_id",
            "arrival_us",
            "prompt_ids",
            "max_new_tokens",
            "output_ids",
            "outcome",
            "prefill_costs",
            "decode_steps",
        },
    )
    prompt = _token_ids(item["prompt_ids"], f"{field}.prompt_ids")
    if not prompt:
        raise ApiError(f"{field}.prompt_ids", "a prompt needs at least one id")
    budget = fields.integer(item["max_new_tokens"], f"{field}.max_new_tokens", 1)
    output = _token_ids(item["output_ids"], f"{field}.output_ids")
    if not 1 <= len(output) <= budget:
        raise ApiError(f"{field}.output_ids", f"expected 1 to max_new_tokens={budget} ids, got {len(output)}")
    outcome = _parse_outcome(item["outcome"], f"{field}.outcome", output, budget)
    costs = fields.loose_mapping(
        item["prefill_costs"],
        f"{field}.prefill_costs",
        {"fixed_matmul_flops", "fixed_memory_bytes", "position_matmul_flops", "position_memory_bytes"},
    )
    per_position = []
    for name in ("position_matmul_flops", "position_memory_bytes"):
        values = fields.integers(costs[name], f"{field}.prefill_costs.{name}")
        if len(values) != len(prompt):
            raise ApiError(
                f"{field}.prefill_costs.{name}",
                f"expected {len(prompt)} entries (one per prompt position), got {len(values)}",
            )
        per_position.append(list(accumulate(values, initial=0)))
    steps = fields.array(item["decode_steps"], f"{field}.decode_steps")
    if len(steps) != len(output) - 1:
        raise ApiError(
            f"{field}.decode_steps",
            f"expected {len(output) - 1} steps (one per output id after the first), got {len(steps)}",
        )
    decode = []
    for k, step in enumerate(steps):
        at = f"{field}.decode_steps[{k}]"
        step = fields.loose_mapping(step, at, {"position", "matmul_flops", "logical_memory_bytes"})
        decode.append(
            (
                fields.integer(step["position"], f"{at}.position"),
                fields.integer(step["matmul_flops"], f"{at}.matmul_flops"),
                fields.integer(step["logical_memory_bytes"], f"{at}.logical_memory_bytes"),
            )
        )
    token_bytes = item.get("output_token_bytes")
    if token_bytes is not None:
        token_bytes = tuple(fields.integers(token_bytes, f"{field}.output_token_bytes"))
        if len(token_bytes) != len(output):
            raise ApiError(f"{field}.output_token_bytes", f"expected {len(output)} entries, got {len(token_bytes)}")
    return RecordedRequest(
        request_id=fields.string(item["request_id"], f"{field}.request_id"),
        arrival_us=fields.integer(item["arrival_us"], f"{field}.arrival_us"),
        prompt_ids=tuple(prompt),
        max_new_tokens=budget,
        output_ids=tuple(output),
        outcome=outcome,
        fixed_matmul_flops=fields.integer(costs["fixed_matmul_flops"], f"{field}.prefill_costs.fixed_matmul_flops"),
        fixed_memory_bytes=fields.integer(costs["fixed_memory_bytes"], f"{field}.prefill_costs.fixed_memory_bytes"),
        cum_flops=per_position[0],
        cum_bytes=per_position[1],
        decode_positions=tuple(p for p, _, _ in decode),
        decode_flops=tuple(f for _, f, _ in decode),
        decode_bytes=tuple(b for _, _, b in decode),
        output_token_bytes=token_bytes,
    )


def _parse_outcome(value: Any, field: str, output: list[int], budget: int) -> dict:
    item = fields.loose_mapping(
        value, field, {"selected_tokens", "published_tokens", "unused_budget", "stop_reason", "complete"}
    )
    expected = {
        "selected_tokens": len(output),
        "published_tokens": sum(1 for i in output if i != TURN_END),
        "unused_budget": budget - len(output),
        "complete": output[-1] == TURN_END,
    }
    for name, want in expected.items():
        if item[name] != want or type(item[name]) is not type(want):
            raise ApiError(f"{field}.{name}", f"inconsistent with output_ids: expected {want!r}, got {item[name]!r}")
    reason = fields.string(item["stop_reason"], f"{field}.stop_reason", STOP_REASONS)
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


def _differences(cumulative: Sequence[int], n: int) -> list[int]:
    increments = getattr(cumulative, "increments", None)  # closed-form tables give theirs directly
    if increments is not None:
        return increments(n)
    return [b - a for a, b in zip(cumulative[:n], cumulative[1 : n + 1], strict=True)]
