"""CacheRun: simulate a declaration, write the record as JSON, and replay a record exactly.

The record is self-contained: its declaration (KVRunBinding plus the optional
customer interaction and resource graph), the consumed part of the recorded
computation document and its ExecutionProvenance are enough to run the
simulation again. `record_json` is deterministic, so a replay is a byte
comparison.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from jgpt.errors import ApiError
from jgpt.json_input import parse_json
from jgpt.ontology import ONTOLOGY_BINDING, OntologyBinding
from jgpt.validation import LIMIT, Integer, ListOf, MapOf, Nullable, Object, String
from kvsim import engine
from kvsim.outcomes import TOTALS, totals
from kvsim.record_view import EVENT, OUTCOME
from kvsim.recorded import MODEL_REFERENCE, REQUEST, RecordedComputations, parse_document, request_json
from kvsim.resource_graph import RESOURCE_GRAPH, ResourceGraph, parse_resource_graph, resource_graph_json
from kvsim.system import SYSTEM, KVResidencySystemConfig, parse_system, system_json
from kvsim.workload import (
    INTERACTION,
    WORKLOAD,
    CustomerInteraction,
    Workload,
    interaction_json,
    parse_interaction,
    parse_workload,
    resolve_workload,
    workload_json,
)

MODEL_VERSION = "kvsim-1"
EVIDENCE = (
    f"{MODEL_VERSION}: discrete-event residency and service model over recorded computation counts; "
    "times are virtual microseconds under the declared rates, not measurements"
)
DEFAULT_BINDING = {
    "primary": "KVCache",
    "related": ["InferenceSystem", "RequestScheduling", "StateTransfer", "ComputeService"],
}

_OPEN = Object({}, open=True)
DECLARATION = Object(
    {"model": MODEL_REFERENCE, "system": SYSTEM, "workload": WORKLOAD, "ontology_binding": ONTOLOGY_BINDING,
     "customer_interaction": Nullable(INTERACTION), "resource_graph": Nullable(RESOURCE_GRAPH)},
    about="KVRunBinding plus the optional customer interaction and resource graph: what a replay simulates again.",
)  # fmt: skip
MEASUREMENT = Object({"event_id": String(), "kind": String(), "elapsed_us": Integer(), "bytes": Integer()})
RECORD = Object(
    {"id": String(), "declaration": DECLARATION,
     "checkpoint": Object({"kv_bytes_per_position": Integer(1)}, open=True),
     "provenance": Object({"backend": _OPEN}, open=True), "events": ListOf(EVENT), "computations": ListOf(REQUEST),
     "measurements": ListOf(MEASUREMENT), "outcomes": Object({"requests": MapOf(OUTCOME), "totals": TOTALS}),
     "states": _OPEN, "evidence": String()},
    open=True,
    about="CacheRun record: a declaration, the consumed computations, events with causes, outcomes (docs/kvsim.md).",
)  # fmt: skip


@dataclass(frozen=True)
class CacheRun:
    declaration: dict  # KVRunBinding (+ customer_interaction, resource_graph)
    computations: RecordedComputations
    result: engine.EngineResult
    outcomes: dict  # {"requests": {request_id: outcome}, "totals": {...}}
    measurements: list[tuple]


def simulate(
    system: KVResidencySystemConfig,
    computations: RecordedComputations,
    workload: Workload | None = None,
    interaction: CustomerInteraction | None = None,
    resource_graph: ResourceGraph | None = None,
    ontology_binding: OntologyBinding | dict | None = None,
) -> CacheRun:
    """Run the residency and service model once; pure in its inputs."""
    if not isinstance(ontology_binding, OntologyBinding):
        ontology_binding = OntologyBinding.from_json(DEFAULT_BINDING if ontology_binding is None else ontology_binding)
    workload = resolve_workload(computations, workload, interaction)
    result = engine.run(system, computations, workload, interaction)
    if result.end_us > LIMIT:  # every input is within the limit, but a tiny rate stretches time past it
        raise ApiError("system", f"the run's virtual time reaches 10^{len(str(result.end_us)) - 1} us, past 2^53 (285 years): "
                                 f"a rate is too small for the work")
    declaration = {
        "model": computations.model,
        "system": system_json(system),
        "workload": workload_json(workload),
        "ontology_binding": ontology_binding.to_json(),
        "customer_interaction": None if interaction is None else interaction_json(interaction),
        "resource_graph": None if resource_graph is None else resource_graph_json(resource_graph),
    }
    measurements = result.measurements + _consumption(result, interaction)
    return CacheRun(declaration, computations, result, _outcomes(result, computations, workload), measurements)


def _consumption(result: engine.EngineResult, interaction: CustomerInteraction | None) -> list[tuple]:
    """How long each consume action waited until the published output covered it."""
    if interaction is None:
        return []
    logs = {o["request_id"]: o["publish_log"] for o in result.outcomes}
    measurements = []
    for event in result.events:
        if event[3] != "consume":
            continue
        wanted, log = event[5], logs[event[1]]
        met = next((time for time, total in log if total >= wanted), None)
        if met is not None:
            measurements.append((event[0], "consume_wait", max(0, met - event[2]), wanted))
    return measurements


def _outcomes(result: engine.EngineResult, computations: RecordedComputations, workload: Workload) -> dict:
    specs = {r.request_id: r for r in computations.requests}
    requests, saved_flops = {}, 0
    for arrival, outcome in zip(workload.requests, result.outcomes, strict=True):
        item = {k: v for k, v in outcome.items() if k not in ("publish_log", "request_id")}
        item["end_event"] = f"e{outcome['end_event']}"
        requests[arrival.request_id] = item
        if outcome["admitted_us"] is not None and outcome["selected_tokens"] > 0 and outcome["reuse_positions"] > 0:
            spec = specs[arrival.request_id]
            saved_flops += spec.prefill_cost(0)[0] - spec.prefill_cost(outcome["reuse_positions"])[0]
    moved = {engine.DEVICE_TO_HOST: 0, engine.HOST_TO_DEVICE: 0}
    counts = {"offload": 0, "reload": 0, "drop": 0}
    for event in result.events:
        kind = event[3]
        if kind == "transfer_end":
            moved[event[11]] += event[5]
        elif kind in counts:
            counts[kind] += 1
    summary = totals(
        result.outcomes, saved_matmul_flops=saved_flops, moved=moved, counts=counts,
        busy_us=result.busy_us, end_us=result.end_us, events=len(result.events),
    )  # fmt: skip
    return {"requests": requests, "totals": summary}


@dataclass(frozen=True)
class _Array:
    """A JSON array written in batches as it is produced (records of 100,000 requests are gigabytes)."""

    items: Callable[[], Iterable[Any]]


def _inputs(run: CacheRun) -> dict:
    """The parts of a record that a replay reads, in record order."""
    computations = run.computations
    provenance = dict(computations.execution["provenance"])
    provenance.setdefault("backend", computations.execution["backend"])
    return {
        "declaration": run.declaration,
        "checkpoint": {**computations.model, "kv_bytes_per_position": computations.kv_bytes_per_position},
        "provenance": provenance,
        "computations": _Array(lambda: map(request_json, computations.requests)),
    }


def run_id(run: CacheRun) -> str:
    """Names the simulated question: a hash of everything a replay reads, nothing it produces."""
    digest = hashlib.sha256()
    for chunk in _object(_inputs(run)):
        digest.update(chunk)
    return f"kv-{digest.hexdigest()[:16]}"


def record_chunks(run: CacheRun) -> Iterator[bytes]:
    """The record's canonical JSON bytes, in pieces, fields in the ontology's CacheRun order."""
    inputs = _inputs(run)
    events, measurements = run.result.events, run.measurements
    yield from _object(
        {
            "id": run_id(run),
            "declaration": inputs["declaration"],
            "checkpoint": inputs["checkpoint"],
            "provenance": inputs["provenance"],
            "events": _Array(lambda: _events_json(events)),
            "computations": inputs["computations"],
            "measurements": _Array(
                lambda: (
                    {"event_id": f"e{e}", "kind": kind, "elapsed_us": elapsed, "bytes": size}
                    for e, kind, elapsed, size in measurements
                )
            ),
            "outcomes": run.outcomes,
            "states": dict(run.result.states),
            "evidence": EVIDENCE,
        }
    )
    yield b"\n"


def record_json(run: CacheRun) -> bytes:
    return b"".join(record_chunks(run))


def record_value(run: CacheRun) -> dict:
    """The record as JSON values (for tests and small runs; large ones stream `record_chunks`)."""
    return json.loads(record_json(run))


def _events_json(events: list[tuple]) -> Iterator[dict]:
    for event_id, request_id, time_us, kind, state_id, size, device, host, detail, causes, phase, direction in events:
        yield {
            "event_id": f"e{event_id}",
            "request_id": request_id,
            "time_us": time_us,
            "kind": kind,
            "state_id": state_id,
            "bytes": size,
            "device_reserved_bytes": device,
            "host_retained_bytes": host,
            "detail": detail,
            "causes": [f"e{c}" for c in causes],
            "phase": phase,
            "transfer_direction": direction,
        }


def _object(fields: dict[str, Any]) -> Iterator[bytes]:
    """Exactly the bytes `_dumps(fields)` would give, with _Array values streamed."""
    separator = b"{"
    for key, value in fields.items():
        yield separator + _dumps(key) + b":"
        separator = b","
        if isinstance(value, _Array):
            yield from _array(value.items())
        else:
            yield _dumps(value)
    yield b"}" if separator == b"," else b"{}"


def _array(items: Iterable[Any], batch: int = 4096) -> Iterator[bytes]:
    yield b"["
    items, separator = iter(items), b""
    while chunk := list(islice(items, batch)):
        yield separator + _dumps(chunk)[1:-1]
        separator = b","
    yield b"]"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def load_json(data: bytes, field: str) -> Any:
    return parse_json(data, field)


def read_record(data: bytes) -> dict:
    record = RECORD.keys(load_json(data, "record"), "record")
    if not str(record["evidence"]).startswith(f"{MODEL_VERSION}:"):
        raise ApiError("record.evidence", f"not a {MODEL_VERSION} record")
    return record


def rerun(record: dict) -> CacheRun:
    """Simulate the declaration a record carries."""
    declaration = DECLARATION.keys(record["declaration"], "record.declaration")
    checkpoint = dict(RECORD.required["checkpoint"].keys(record["checkpoint"], "record.checkpoint"))
    provenance = RECORD.required["provenance"].keys(record["provenance"], "record.provenance")
    document = {
        "format": "jgpt-recorded-computations",
        "version": 1,
        "model": declaration["model"],
        "kv_bytes_per_position": checkpoint["kv_bytes_per_position"],
        "execution": {"backend": provenance["backend"], "provenance": provenance},
        "requests": record["computations"],
    }
    interaction = declaration["customer_interaction"]
    interaction = (
        None if interaction is None else parse_interaction(interaction, "record.declaration.customer_interaction")
    )
    submitted = interaction is not None and any(a.kind == "submit" for a in interaction.actions)
    graph = declaration["resource_graph"]
    return simulate(
        parse_system(declaration["system"], "record.declaration.system"),
        parse_document(document, "record.computations"),
        None if submitted else parse_workload(declaration["workload"], "record.declaration.workload"),
        interaction,
        None if graph is None else parse_resource_graph(graph, "record.declaration.resource_graph"),
        declaration["ontology_binding"],
    )


def first_difference(old: dict, new: dict) -> str:
    """A line naming the first differing event, or else the first differing field."""
    for index, (a, b) in enumerate(zip(old.get("events", []), new["events"], strict=False)):
        if a != b:
            return f"first differing event at index {index}:\n  recorded: {json.dumps(a)}\n  replayed: {json.dumps(b)}"
    if len(old.get("events", [])) != len(new["events"]):
        return f"event counts differ: recorded {len(old.get('events', []))}, replayed {len(new['events'])}"
    for name in new:
        if old.get(name) != new[name]:
            return f"events agree; field {name!r} differs"
    return "records differ only in formatting (the recorded bytes are not kvsim's canonical JSON)"
