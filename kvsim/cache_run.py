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

import orjson

from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import parse_json
from jgpt.foundation.ontology import ONTOLOGY_BINDING, OntologyBinding
from jgpt.foundation.validation import LIMIT, Integer, ListOf, MapOf, Nullable, Object, String
from kvsim import engine
from kvsim.cache_event import (
    BYTES,
    DIRECTION,
    KIND,
    CacheEvent,
    EventKind,
    Measurement,
    MeasurementKind,
    Rows,
    event_json,
    measurement_json,
)
from kvsim.outcomes import TOTALS, OutcomeTally
from kvsim.record_view import EVENT, OUTCOME
from kvsim.recorded import (
    MODEL_REFERENCE,
    REQUEST,
    RecordedComputations,
    StreamedComputations,
    parse_document,
    request_json,
)
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
CHECKPOINT = Object({"kv_bytes_per_position": Integer(1)}, open=True)
PROVENANCE = Object({"backend": _OPEN}, open=True)
RECORD = Object(
    {"id": String(), "declaration": DECLARATION, "checkpoint": CHECKPOINT, "provenance": PROVENANCE, "events": ListOf(EVENT), "computations": ListOf(REQUEST),
     "measurements": ListOf(MEASUREMENT), "outcomes": Object({"requests": MapOf(OUTCOME), "totals": TOTALS}),
     "states": _OPEN, "evidence": String()},
    open=True,
    about="CacheRun record: a declaration, the consumed computations, events with causes, outcomes (docs/kvsim-record.md).",
)  # fmt: skip


@dataclass(frozen=True)
class CacheRun:
    declaration: dict  # KVRunBinding (+ customer_interaction, resource_graph)
    computations: RecordedComputations
    result: engine.EngineResult
    outcomes: dict  # the record's outcomes: {"requests": {request_id: RequestOutcome JSON}, "totals": {...}}
    measurements: Rows[Measurement]  # the engine's, then the consume waits


def simulate(
    system: KVResidencySystemConfig,
    computations: RecordedComputations,
    workload: Workload | None = None,
    interaction: CustomerInteraction | None = None,
    resource_graph: ResourceGraph | None = None,
    ontology_binding: OntologyBinding | dict | None = None,
) -> CacheRun:
    """Run the residency and service model once; pure in its inputs."""
    declaration, workload = declare(system, computations, workload, interaction, resource_graph, ontology_binding)
    result = checked(engine.run(system, computations, workload, interaction))
    tally = Tally()
    tally.add(result.events.rows)
    measurements = Rows(Measurement, [*result.measurements.rows, *tally.consume_waits(result.publish_logs)])
    return CacheRun(
        declaration, computations, result, record_outcomes(result, computations, workload, tally), measurements
    )


def declare(
    system: KVResidencySystemConfig,
    computations: RecordedComputations,
    workload: Workload | None,
    interaction: CustomerInteraction | None,
    resource_graph: ResourceGraph | None,
    ontology_binding: OntologyBinding | dict | None,
) -> tuple[dict, Workload]:
    """The record's declaration (KVRunBinding plus the optional parts) and the arrivals the run uses."""
    workload = resolve_workload(computations, workload, interaction)
    declared = declaration(
        system, computations.model, workload_json(workload), interaction, resource_graph, ontology_binding
    )
    return declared, workload


def declaration(
    system: KVResidencySystemConfig,
    model: dict,
    workload: dict,  # as the record writes it
    interaction: CustomerInteraction | None,
    resource_graph: ResourceGraph | None,
    ontology_binding: OntologyBinding | dict | None,
) -> dict:
    if not isinstance(ontology_binding, OntologyBinding):
        ontology_binding = OntologyBinding.from_json(DEFAULT_BINDING if ontology_binding is None else ontology_binding)
    return {
        "model": model,
        "system": system_json(system),
        "workload": workload,
        "ontology_binding": ontology_binding.to_json(),
        "customer_interaction": None if interaction is None else interaction_json(interaction),
        "resource_graph": None if resource_graph is None else resource_graph_json(resource_graph),
    }


def checked(result: engine.EngineResult) -> engine.EngineResult:
    if result.end_us > LIMIT:  # every input is within the limit, but a tiny rate stretches time past it
        raise ApiError("system", f"the run's virtual time reaches 10^{len(str(result.end_us)) - 1} us, past 2^53 "
                                 f"(285 years): a rate is too small for the work")  # fmt: skip
    return result


class Tally:
    """What a run's totals and consume waits read from its events, folded one batch at a time (a streamed
    run keeps no event log). It lives for one run, like the engine's state."""

    def __init__(self) -> None:
        self.events = 0
        self.moved = {engine.DEVICE_TO_HOST: 0, engine.HOST_TO_DEVICE: 0}
        self.counts: dict[str, int] = {EventKind.OFFLOAD: 0, EventKind.RELOAD: 0, EventKind.DROP: 0}
        self.consumes: list[tuple] = []  # a customer's consume actions (few: one per action)

    def add(self, events: list[tuple]) -> None:
        """Fold a batch of the engine's plain event tuples (the Rows' `rows`: read by position, as fast as
        the engine writes them)."""
        self.events += len(events)
        moved, counts, transfer_end, consume = self.moved, self.counts, EventKind.TRANSFER_END, EventKind.CONSUME
        for event in events:
            kind = event[KIND]
            if kind == transfer_end:
                moved[event[DIRECTION]] += event[BYTES]
            elif kind in counts:
                counts[kind] += 1
            elif kind == consume:
                self.consumes.append(event)

    def consume_waits(self, publish_logs: dict[str, list[tuple[int, int]]]) -> list[Measurement]:
        """How long each consume action waited until the published output covered it."""
        measurements = []
        for event in Rows(CacheEvent, self.consumes):
            wanted = event.bytes
            met = next((time for time, total in publish_logs[event.request_id] if total >= wanted), None)
            if met is not None:
                waited = max(0, met - event.time_us)
                measurements.append(Measurement(event.event_id, MeasurementKind.CONSUME_WAIT, waited, wanted))
        return measurements


def record_outcomes(
    result: engine.EngineResult, computations: RecordedComputations, workload: Workload, tally: Tally | None = None
) -> dict:
    if tally is None:
        tally = Tally()
        tally.add(result.events.rows)
    requests = {arrival.request_id: o.to_json() for arrival, o in zip(workload.requests, result.outcomes, strict=True)}
    outcomes = OutcomeTally()
    for outcome in result.outcomes:
        outcomes.add(outcome)
    return {"requests": requests, "totals": run_totals(result, tally, outcomes)}


def run_totals(result: engine.EngineResult, tally: Tally, outcomes: OutcomeTally) -> dict:
    return outcomes.totals(
        saved_matmul_flops=result.saved_matmul_flops, moved=tally.moved, counts=tally.counts,
        busy_us=result.busy_us, end_us=result.end_us, events=tally.events,
    )  # fmt: skip


@dataclass(frozen=True)
class Array:
    """A JSON array written in batches as it is produced (records of 100,000 requests are gigabytes); its items
    hold no float (they are encoded by `dumps_without_floats`)."""

    items: Callable[[], Iterable[Any]]


class Lazy(dict):
    """A JSON object some of whose values are written as they are produced (an Array, or another Lazy)."""


def record_inputs(declaration: dict, computations: RecordedComputations | StreamedComputations) -> dict:
    """The parts of a record that a replay reads besides the computations, in record order."""
    provenance = dict(computations.execution["provenance"])
    provenance.setdefault("backend", computations.execution["backend"])
    return {
        "declaration": declaration,
        "checkpoint": {**computations.model, "kv_bytes_per_position": computations.kv_bytes_per_position},
        "provenance": provenance,
    }


def input_digest(inputs: dict, requests: Iterable[bytes]) -> str:
    """run_id from the record's inputs and its computations' requests, each given as its JSON bytes: the hash
    of the canonical JSON of {declaration, checkpoint, provenance, computations}."""
    digest = InputDigest()
    for _ in digest.inputs(inputs):
        pass
    return digest.requests(requests)


class InputDigest:
    """run_id hashed as the inputs and then the requests are encoded (a streamed record writes the same chunks)."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def inputs(self, inputs: dict) -> Iterator[bytes]:
        """The chunks of the inputs' JSON object, hashed as they are yielded, without its closing brace."""
        closing = b""
        for chunk in object_chunks(inputs):
            if closing:
                self.digest.update(closing)
                yield closing
            closing = chunk

    def requests(self, requests: Iterable[bytes]) -> str:
        self.digest.update(b',"computations":[')
        separator = b""
        for request in requests:
            self.digest.update(separator + request)
            separator = b","
        self.digest.update(b"]}")
        return f"kv-{self.digest.hexdigest()[:16]}"


def run_id(run: CacheRun) -> str:
    """Names the simulated question: a hash of everything a replay reads, nothing it produces."""
    requests = (dumps_without_floats(request_json(r)) for r in run.computations.requests)
    return input_digest(record_inputs(run.declaration, run.computations), requests)


def record_chunks(run: CacheRun) -> Iterator[bytes]:
    """The record's canonical JSON bytes, in pieces, fields in the ontology's CacheRun order."""
    inputs = record_inputs(run.declaration, run.computations)
    events, measurements, requests = run.result.events, run.measurements, run.computations.requests
    yield from object_chunks(
        {
            "id": run_id(run),
            **inputs,
            "events": Array(lambda: map(event_json, events)),
            "computations": Array(lambda: map(request_json, requests)),
            "measurements": Array(lambda: map(measurement_json, measurements)),
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


def object_chunks(fields: dict[str, Any]) -> Iterator[bytes]:
    """Exactly the bytes `dumps(fields)` would give, with Array and Lazy values streamed."""
    separator = b"{"
    for key, value in fields.items():
        yield separator + dumps(key) + b":"
        separator = b","
        if isinstance(value, Array):
            yield from _array(value.items())
        elif isinstance(value, Lazy):
            yield from object_chunks(value)
        else:
            yield dumps(value)
    yield b"}" if separator == b"," else b"{}"


def _array(items: Iterable[Any], batch: int = 4096) -> Iterator[bytes]:
    yield b"["
    items, separator = iter(items), b""
    while chunk := list(islice(items, batch)):
        yield separator + dumps_without_floats(chunk)[1:-1]
        separator = b","
    yield b"]"


def dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


# One encoder for every call: json.dumps with options builds a new JSONEncoder each time.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def dumps_without_floats(value: Any) -> bytes:
    """`dumps(value)` for a value that holds no float (events, measurements, computations, arrivals: the bulk of
    a record), encoded by orjson five to ten times faster where the two agree byte for byte: compact, keys in
    order, integers in decimal, and every string plain printable ASCII with no quote or backslash (json escapes
    anything else as \\uXXXX; orjson writes UTF-8, or escapes it otherwise). Floats are left out because the
    two format some differently (1e+16 and 1e16)."""
    try:
        encoded = orjson.dumps(value)
    except orjson.JSONEncodeError:  # an integer past 64 bits, a lone surrogate
        return dumps(value)
    if encoded.isascii() and b"\\" not in encoded and b"\x7f" not in encoded:
        return encoded
    return dumps(value)


def load_json(data: bytes, field: str) -> Any:
    return parse_json(data, field)


def read_record(data: bytes) -> dict:
    record = RECORD.keys(load_json(data, "record"), "record")
    if not str(record["evidence"]).startswith(f"{MODEL_VERSION}:"):
        raise ApiError("record.evidence", f"not a {MODEL_VERSION} record")
    return record


def rerun(record: dict) -> CacheRun:
    """Simulate the declaration a record carries."""
    return simulate(**rerun_inputs(record))


def rerun_inputs(record: dict) -> dict:
    """`simulate`'s arguments from a record's declaration, checkpoint, provenance and computations."""
    declaration = DECLARATION.keys(record["declaration"], "record.declaration")
    checkpoint = dict(CHECKPOINT.keys(record["checkpoint"], "record.checkpoint"))
    provenance = PROVENANCE.keys(record["provenance"], "record.provenance")
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
    return {
        "system": parse_system(declaration["system"], "record.declaration.system"),
        "computations": parse_document(document, "record.computations"),
        "workload": None if submitted else parse_workload(declaration["workload"], "record.declaration.workload"),
        "interaction": interaction,
        "resource_graph": None if graph is None else parse_resource_graph(graph, "record.declaration.resource_graph"),
        "ontology_binding": declaration["ontology_binding"],
    }


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
