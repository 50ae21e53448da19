"""The recorded computation document: a Workload run through the model, every work counted.

`read_workload` reads the spec's Workload document (ordered RequestArrivals, each
with an InferenceRequest); `record` runs its requests in arrival order under the
reuse rule kvsim and the InferenceEngine share (each continues the longest
retained state that is a proper prefix of its prompt), and returns the versioned
JSON document kvsim consumes (`docs/recorded-computations.md` describes every field).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inference.backend import ExecutionBackend, ExecutionProvenance
from inference.execution import ModelExecution
from inference.generation import check_generation, generate_stepwise
from inference.policy import GenerationPolicy, InferenceRequest, check_prompt
from inference.response import InferenceResponse
from jgpt.foundation import progress
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import write_atomically
from jgpt.foundation.validation import Integer, Integers, ListOf, Object, String
from jgpt.model.kv_state import KVState
from jgpt.tokenizers.framing import Turn, turns_from_json
from jgpt.tokenizers.prompt_format import CHAT, framed
from jgpt.tokenizers.tokenizer import Tokenizer
from kvsim import SERVED_INTERACTION, WALL_CLOCK_LIMIT_US

FORMAT = "jgpt-recorded-computations"
VERSION = 1

# Turns are read by jgpt.tokenizers.framing.turns_from_json and the policy by GenerationPolicy.from_json, not from these.
_BODY = Object(
    {},
    {"text": String(), "turns": ListOf(Object({}, open=True, about="a Turn: {role, text}")), "prompt_ids": Integers(),
     "generation": Object({}, open=True, about="GenerationPolicy (docs/inference.md)")},
    about="InferenceRequest: its input as turns (with an optional text), text, or prompt_ids.",
)  # fmt: skip
# Declared times are on the wall clock `serve` runs against: at most a day (kvsim.workload.WALL_CLOCK_LIMIT_US).
ARRIVAL = Object(
    {"request_id": String(non_empty=True), "arrival_us": Integer(maximum=WALL_CLOCK_LIMIT_US), "request": _BODY}
)
WORKLOAD = Object(
    {"kind": String(non_empty=True), "requests": ListOf(ARRIVAL, 1)},
    {"customer_interaction": SERVED_INTERACTION},
    about="Workload: ordered RequestArrivals, each with an InferenceRequest (`jgpt record`, `jgpt serve`).",
)  # fmt: skip


def read_workload(
    document: Any, tokenizer: Tokenizer, field: str = "workload", *, prompt_format: str = CHAT
) -> tuple[InferenceRequest, ...]:
    """The requests of a Workload document, in arrival order (array order breaks ties).

    Each request gives its input as `turns` (a conversation; the prompt opens the
    assistant's turn after it), as `text` (one user turn), or as raw `prompt_ids`;
    turns and text are framed by `prompt_format` (jgpt/tokenizers/prompt_format.py: a
    plain model's text is its ids as they stand, and it has no turns).
    """
    top = WORKLOAD.read(document, field)
    requests, seen = [], set()
    for i, entry in enumerate(top["requests"]):
        at = f"{field}.requests[{i}]"
        request_id, arrival, body = entry["request_id"], entry["arrival_us"], entry["request"]
        if request_id in seen:
            raise ApiError(f"{at}.request_id", f"request {request_id!r} is declared twice")
        seen.add(request_id)
        prompt_ids, text = _prompt(body, tokenizer, prompt_format, f"{at}.request")
        generation = GenerationPolicy.from_json(body.get("generation", {}), f"{at}.request.generation")
        requests.append(InferenceRequest(request_id, prompt_ids, generation, arrival, text))
    return tuple(sorted(requests, key=lambda r: r.arrival_us))  # sorted() is stable: ties keep array order


def record(
    execution: ModelExecution,
    requests: Sequence[InferenceRequest],
    *,
    tokenizer: Tokenizer | None = None,
    reference: bool = True,
    kind: str = "requests",
) -> dict[str, Any]:
    """Run every request (one at a time, in order) and return the recorded computation document.

    With the tokenizer, each request also records `output_token_bytes`: the text bytes of each output id.
    """
    a = execution.architecture
    for request in requests:  # refuse a bad workload before running any of it
        at = f"request {request.request_id!r}"
        check_prompt(request.prompt_ids, a.vocabulary, a.context, f"{at}: prompt_ids")
        check_generation(execution, [request], reference, reference, f"{at}: generation.max_new_tokens")
    backend = ExecutionBackend.current(execution.identity.precision)
    # The reuse rule (docs/kvsim.md): an ended request retains one state, every position it computed,
    # unless that very sequence is already retained; a hit takes the state. Keyed by its token ids.
    retained: dict[tuple[int, ...], KVState] = {}
    documents = []
    for request in progress.tracked(requests, "recording requests", unit="request"):
        reused = _longest_proper_prefix(retained, request.prompt_ids)
        prefix = None if reused is None else retained.pop(reused)
        generation = generate_stepwise(execution, [request], prefix, reference=reference)
        (response,) = generation.responses
        (computed,) = generation.state.prefixes()
        retained.setdefault(computed, generation.state)
        document = request_document(execution, request, response)
        if tokenizer is not None:
            document["output_token_bytes"] = [len(tokenizer.pieces[t]) for t in response.output_ids]
        documents.append(document)
    identity = execution.identity
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": {
            "checkpoint_sha256": identity.checkpoint_sha256,
            "tokenizer_sha256": identity.tokenizer_sha256,
            "architecture": execution.architecture.to_json(),
        },
        "kv_bytes_per_position": execution.costs.kv_bytes_per_position,
        "execution": {
            "backend": backend.to_json(),
            "kernels": execution.kernels.to_json(),
            "provenance": ExecutionProvenance.current(backend).to_json(),
        },
        "workload": {"kind": kind},
        "requests": documents,
    }


def write_document(document: Mapping[str, Any], path: str | Path) -> None:
    """Write the document as JSON, atomically (never a half-written file)."""
    write_atomically(Path(path), (json.dumps(document, indent=1) + "\n").encode())


def request_document(execution: ModelExecution, request: InferenceRequest, response: InferenceResponse) -> dict:
    costs = execution.costs
    prompt, output = list(request.prompt_ids), list(response.output_ids)
    decode_positions = range(len(prompt), len(prompt) + len(output) - 1)
    return {
        "request_id": request.request_id,
        "arrival_us": request.arrival_us,
        "prompt_ids": prompt,
        "max_new_tokens": request.generation.max_new_tokens,
        "output_ids": output,
        "outcome": response.outcome.to_json(),
        "prefill_costs": {
            "fixed_matmul_flops": 0,
            "fixed_memory_bytes": costs.fixed_memory_bytes,
            "position_matmul_flops": [costs.position_matmul_flops(p) for p in range(len(prompt))],
            "position_memory_bytes": [costs.position_memory_bytes(p) for p in range(len(prompt))],
        },
        "decode_steps": [
            {
                "position": p,
                "matmul_flops": costs.matmul_flops(p, p + 1),
                "logical_memory_bytes": costs.memory_bytes(p, p + 1),
            }
            for p in decode_positions
        ],
        "computations": [c.to_json() for c in response.computations],
        "published_ids": list(response.published_ids),
        "work": response.work.to_json(),
    }


def _longest_proper_prefix(
    retained: Mapping[tuple[int, ...], KVState], prompt: Sequence[int]
) -> tuple[int, ...] | None:
    """The token ids of the longest retained state that is a proper prefix of the prompt (strictly
    shorter: the prefill must process at least the last prompt position, for its logits)."""
    prompt = tuple(prompt)
    return next((prompt[:n] for n in range(len(prompt) - 1, 0, -1) if prompt[:n] in retained), None)


def _prompt(
    body: Mapping[str, Any], tokenizer: Tokenizer, prompt_format: str, field: str
) -> tuple[tuple[int, ...], str | None]:
    given = [name for name in ("turns", "prompt_ids") if name in body] or (["text"] if "text" in body else [])
    if len(given) != 1:
        raise ApiError(field, "gives its input as exactly one of turns (with an optional text), text, or prompt_ids")
    if "prompt_ids" in body:
        return tuple(body["prompt_ids"]), body.get("text")
    if "turns" in body:
        turns = turns_from_json(body["turns"], f"{field}.turns")
        if not turns:
            raise ApiError(f"{field}.turns", "a request has at least one turn")
    else:
        turns = (Turn("user", body["text"]),)
    text = body.get("text", next((t.text for t in reversed(turns) if t.role == "user"), None))
    return tuple(framed(tokenizer, prompt_format, turns, f"{field}.turns")), text
