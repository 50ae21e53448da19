"""The CacheRun record as JSON Lines: written while the simulation runs, read back one line at a time.

A million requests make some 35 million events: the whole-JSON record (`record_json`) of such a run
is gigabytes that a reader must load whole. The streamed record holds the same content, one entry a
line, in an order a reader can use without looking ahead (docs/kvsim-record.md, "The streamed record"):

    {"format": "jgpt-kvsim-record-lines", "version": 2, "declaration": ..., "checkpoint": ...,
     "provenance": ..., "evidence": ..., "fields": {"event": [...], "measurement": [...]}}
    {"computation": {...}}            one per request: what a replay simulates again
    then, a batch of about 65,536 events at a time, as the run goes:
    {"event": [0, "c0t0", 0, "arrival", null, ...]}   a CacheEvent's fields in order; ids are ints
    {"measurement": [5, "compute_prefill", 120, 4096]}   after the event that ends what it measured
    {"outcome": {"request_id": "c0t0", "status": ...}}   a request's, once it has ended
    {"state": {"state_id": "s0", ...}}                   a retained state's, once its fate is settled
    and last the consume waits (measurements), the states still retained, and
    {"totals": {...}}
    {"end": {"id": "kv-...", "lines": N}}                the run's id, and how many lines the record has

JSON Lines keeps every entry a JSON value a person can read and `jq` can filter, each error names a
line, and a truncated file is told from a whole one by its end line. The id is written last: it
hashes the computations, which are only encoded once, as they are written. Nothing is kept per
finished request, so a StreamedComputations document of a million requests runs in bounded memory.
kvsim.streamed_replay replays such a record.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import READ_LIMIT
from jgpt.foundation.json_input import parse_json
from jgpt.foundation.ontology import OntologyBinding
from jgpt.foundation.validation import LIMIT, Const, Object, String
from kvsim import engine
from kvsim.cache_event import CacheEvent, EventKind, Measurement, MeasurementKind, Phase, TransferDirection
from kvsim.cache_run import (
    CHECKPOINT,
    DECLARATION,
    EVIDENCE,
    PROVENANCE,
    Array,
    InputDigest,
    Lazy,
    Tally,
    checked,
    declaration,
    declare,
    dumps,
    dumps_without_floats,
    record_inputs,
    run_totals,
)
from kvsim.outcomes import TOTALS, OutcomeTally, RequestOutcome
from kvsim.record_view import OUTCOME
from kvsim.recorded import (
    RecordedComputations,
    RecordedRequest,
    StreamedComputations,
    request_json,
)
from kvsim.resource_graph import ResourceGraph
from kvsim.system import KVResidencySystemConfig
from kvsim.workload import CustomerInteraction, Workload

FORMAT, VERSION = "jgpt-kvsim-record-lines", 2
HEAD = Object(
    {"format": Const(FORMAT), "version": Const(VERSION), "declaration": DECLARATION,
     "checkpoint": CHECKPOINT, "provenance": PROVENANCE,
     "evidence": String(), "fields": Object({}, open=True)},
    about="The first line of a streamed CacheRun record (docs/kvsim-record.md).",
)  # fmt: skip
# The order of a record's lines: each line's section is at or after the one before it.
SECTIONS = {"computation": 1, "event": 2, "measurement": 2, "outcome": 2, "state": 2, "totals": 3, "end": 4}
ONCE = ("totals", "end")
_OUTCOME_KEYS = ("request_id", *RequestOutcome._fields)  # an outcome line's object
_CHUNK_BYTES = 1 << 16  # computation lines are written in chunks of about this size
Write = Callable[[bytes], object]


@dataclass(frozen=True)
class StreamedRun:
    """What `write_lines` tells its caller once the record is written."""

    id: str
    outcomes: dict  # {"totals": ...}: what the summary table reads
    lines: int


def write_lines(
    write: Write,
    system: KVResidencySystemConfig,
    computations: RecordedComputations | StreamedComputations,
    workload: Workload | None = None,
    interaction: CustomerInteraction | None = None,
    resource_graph: ResourceGraph | None = None,
    ontology_binding: OntologyBinding | dict | None = None,
) -> StreamedRun:
    """Simulate once, handing the streamed record to `write` as it is produced (chunks of about 65,536 events).
    A StreamedComputations document is made three times (for the arrivals in the head, the computation lines,
    the run) and never held."""
    if isinstance(computations, StreamedComputations):
        if workload is not None or interaction is not None:
            raise ApiError("workload", "a streamed document's requests arrive when it says: no workload or customer "
                                       "interaction")  # fmt: skip
        source = computations.requests
        arrivals = Array(lambda: ({"request_id": r.request_id, "arrival_us": r.arrival_us} for r in source()))
        declared: dict = Lazy(declaration(system, computations.model, Lazy({"kind": "recorded", "requests": arrivals}),
                                          None, resource_graph, ontology_binding))  # fmt: skip
        requests: Callable[[], Iterator[RecordedRequest]] = source

        def simulated(hand_over: engine.HandOver) -> engine.EngineResult:
            arriving = _in_arrival_order(source())
            return engine.run_arrivals(system, computations.kv_bytes_per_position, arriving, {}, (), hand_over)
    else:
        declared, workload = declare(system, computations, workload, interaction, resource_graph, ontology_binding)
        requests = lambda: iter(computations.requests)  # noqa: E731
        simulated = lambda hand_over: engine.run(system, computations, workload, interaction, hand_over)  # noqa: E731
    digest, fields = InputDigest(), {"event": CacheEvent._fields, "measurement": Measurement._fields}
    write(b'{"format":%b,"version":%d' % (dumps(FORMAT), VERSION))
    opening = b","  # the head holds the inputs a run id hashes: their object's members, after the version
    for chunk in digest.inputs(record_inputs(declared, computations)):
        write(opening + chunk[len(opening) :])
        opening = b""
    write(b',"evidence":%b,"fields":%b}\n' % (dumps(EVIDENCE), dumps(fields)))
    lines = [1]
    run_id = digest.requests(_written_requests(write, requests(), lines))
    tally, outcomes = Tally(), OutcomeTally()

    def hand_over(batch: engine.Batch) -> None:
        tally.add(batch.events.rows)
        for _, outcome in batch.outcomes:
            outcomes.add(outcome)
        lines[0] += len(batch.events) + len(batch.measurements) + len(batch.outcomes) + len(batch.states)
        write(_rows(b"event", batch.events.rows) + _rows(b"measurement", batch.measurements.rows)
              + b"".join(_line("outcome", dict(zip(_OUTCOME_KEYS, (r, *o)))) for r, o in batch.outcomes)
              + _states(batch.states))  # fmt: skip

    result = checked(simulated(hand_over))
    waits = tally.consume_waits(result.publish_logs)
    totals = run_totals(result, tally, outcomes)
    write(_rows(b"measurement", waits) + _states(result.states) + _line("totals", totals))
    lines[0] += len(waits) + len(result.states) + 2
    write(_line("end", {"id": run_id, "lines": lines[0]}))
    return StreamedRun(run_id, {"totals": totals}, lines[0])


def _in_arrival_order(requests: Iterator[RecordedRequest]) -> Iterator[engine.Arrival]:
    last = 0
    for index, request in enumerate(requests):
        if request.arrival_us < last:
            raise ApiError(f"computations.requests[{index}].arrival_us", f"a streamed document's requests come in "
                           f"arrival order: {request.arrival_us} after {last}")  # fmt: skip
        last = request.arrival_us
        yield last, index, request


def _states(states: list[tuple[str, dict]]) -> bytes:
    return b"".join(_line("state", {"state_id": state_id, **fate}) for state_id, fate in states)


def _written_requests(write: Write, requests: Iterator[RecordedRequest], lines: list[int]) -> Iterator[bytes]:
    """Each request's JSON, written as a computation line (counted in `lines`) as it is handed on to the
    run's digest."""
    pending = bytearray()
    for request in requests:
        lines[0] += 1
        item = dumps_without_floats(request_json(request))
        pending += b'{"computation":%b}\n' % item
        if len(pending) >= _CHUNK_BYTES:
            write(bytes(pending))
            pending.clear()
        yield item
    write(bytes(pending))


def _line(section: str, value: Any) -> bytes:
    return dumps({section: value}) + b"\n"


def _rows(section: bytes, rows: list) -> bytes:
    """`rows` (flat tuples of no float but for a list that is never followed by another) as lines
    {"section":[...]}, encoded with one call: between rows, and only there, the encoding has "],[" unless a
    string holds it."""
    if not rows:
        return b""
    encoded = dumps_without_floats(rows)
    if encoded.count(b"],[") != len(rows) - 1:  # some string holds "],[": encode row by row
        return b"".join(b'{"%b":%b}\n' % (section, dumps_without_floats(row)) for row in rows)
    return b'{"%b":%b}\n' % (section, encoded[1:-1].replace(b"],[", b']}\n{"%b":[' % section))


def pulled(produce: Callable[[Write], object]) -> Iterator[bytes]:
    """The chunks `produce` writes, as an iterator `write_atomically` can pull (the engine pushes its events
    through a callback): `produce` runs on a thread, at most a few chunks ahead; its error is raised here."""
    chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
    failure: list[BaseException] = []
    stop = threading.Event()

    def put(chunk: bytes) -> None:
        while not stop.is_set():
            try:
                return chunks.put(chunk, timeout=0.1)
            except queue.Full:
                continue
        raise _Stopped

    def work() -> None:
        try:
            produce(put)
        except _Stopped:
            pass
        except BaseException as error:  # handed to the reader, which raises it
            failure.append(error)
        finally:
            chunks.put(None)

    thread = threading.Thread(target=work, name="kvsim-record", daemon=True)
    thread.start()
    try:
        while (chunk := chunks.get()) is not None:
            yield chunk
    finally:
        stop.set()
        while thread.is_alive():  # let a blocked put see the stop
            try:
                chunks.get(timeout=0.1)
            except queue.Empty:
                continue
        thread.join()
    if failure:
        raise failure[0]


class _Stopped(Exception):
    """The reader of `pulled` stopped early."""


# -- reading ------------------------------------------------------------------------------------------


def is_streamed(path: Path, field: str) -> bool:
    """Whether the file at `path` is a streamed record (it opens with the head's format key)."""
    try:
        with open(path, "rb") as file:
            return file.read(len(_OPENING)) == _OPENING
    except OSError as error:
        raise ApiError(field, f"cannot read {path}: {error.strerror}") from None


_OPENING = b'{"format":"' + FORMAT.encode() + b'"'


def read_lines(path: Path, field: str = "RECORD") -> Generator[tuple[int, str, Any]]:
    """(line number, section, value) for every line of a streamed record, each checked before it is yielded:
    the head first (section "head"), the sections in order, every event and measurement typed, and the end
    line last. Anything else is an ApiError naming the line."""
    try:
        file = open(path, "rb")  # noqa: SIM115 - closed below, after the generator's last line
    except OSError as error:
        raise ApiError(field, f"cannot read {path}: {error.strerror}") from None
    with file:
        yield from _checked_lines(file)


def _checked_lines(file: BinaryIO) -> Iterator[tuple[int, str, Any]]:
    number, rank, seen, events, value = 0, 0, set(), 0, None
    for number, line in enumerate(_lines(file), 1):
        at = f"record line {number}"
        if number == 1:
            yield number, "head", HEAD.keys(parse_json(line, at), at)
            continue
        if "end" in seen:
            raise ApiError(at, "follows the end line")
        entry = parse_json(line, at)
        if not isinstance(entry, dict) or len(entry) != 1 or next(iter(entry)) not in SECTIONS:
            raise ApiError(at, f"expected an object with one key of {', '.join(SECTIONS)}")
        ((section, value),) = entry.items()
        if SECTIONS[section] < rank or (section in ONCE and section in seen):
            raise ApiError(at, f"a {section} line cannot come here (sections: {', '.join(SECTIONS)}, in that order)")
        rank = SECTIONS[section]
        seen.add(section)
        if section == "event":
            value = event_row(value, at, events)
            events += 1
        elif section == "measurement":
            value = _measurement_row(value, at, events)
        else:
            value = _SECTION_CHECKS[section](value, at, number)
        yield number, section, value
    if number == 0:
        raise ApiError("record line 1", "missing: the file is empty")
    if "end" not in seen:
        raise ApiError(f"record line {number + 1}", "missing: the record ends without its end line (truncated?)")


def _lines(file: BinaryIO) -> Iterator[bytes]:
    number = 0
    while line := file.readline(READ_LIMIT + 1):
        number += 1
        if len(line) > READ_LIMIT:
            raise ApiError(f"record line {number}", f"longer than {READ_LIMIT} bytes")
        if not line.endswith(b"\n"):
            raise ApiError(f"record line {number}", "is cut off (no newline at its end): the record is truncated")
        yield line


_KINDS = {k.value: k for k in EventKind}
_PHASES = {p.value: p for p in Phase}
_DIRECTIONS = {d.value: d for d in TransferDirection}
_MEASURES = {m.value: m for m in MeasurementKind}


def event_row(row: Any, at: str, index: int) -> CacheEvent:
    """A CacheEvent from its line's array: the record's `index`th event, caused by earlier ones only."""
    if not isinstance(row, list) or len(row) != len(CacheEvent._fields):
        raise ApiError(
            at, f"an event is an array of {len(CacheEvent._fields)} values ({', '.join(CacheEvent._fields)})"
        )
    event_id, request_id, time_us, kind, state_id, size, device, host, detail, causes, phase, direction = row
    if event_id != index or type(event_id) is not int:
        raise ApiError(f"{at}.event_id", f"expected {index} (events are numbered in order), got {event_id!r}")
    for name, value in (("time_us", time_us), ("bytes", size), ("device_reserved_bytes", device),
                        ("host_retained_bytes", host)):  # fmt: skip
        if type(value) is not int or not -LIMIT <= value <= LIMIT:
            raise ApiError(f"{at}.{name}", f"expected an integer of at most 2^53, got {value!r}")
    if not isinstance(request_id, str) or not isinstance(detail, str) or not isinstance(state_id, str | None):
        raise ApiError(at, "request_id and detail are strings, state_id a string or null")
    if not isinstance(causes, list) or not all(type(c) is int and 0 <= c < index for c in causes):
        raise ApiError(f"{at}.causes", "expected the ids of earlier events")
    checked_kind = _member(_KINDS, kind, f"{at}.kind")
    return CacheEvent(
        index, request_id, time_us, checked_kind, state_id, size, device, host, detail, tuple(causes),
        None if phase is None else _member(_PHASES, phase, f"{at}.phase"),
        None if direction is None else _member(_DIRECTIONS, direction, f"{at}.transfer_direction"),
    )  # fmt: skip


def _measurement_row(row: Any, at: str, events: int) -> Measurement:
    if not isinstance(row, list) or len(row) != len(Measurement._fields):
        raise ApiError(at, f"a measurement is an array of {', '.join(Measurement._fields)}")
    event_id, kind, elapsed, size = row
    if type(event_id) is not int or not 0 <= event_id < events:
        raise ApiError(f"{at}.event_id", f"expected the id of an earlier event, got {event_id!r}")
    if type(elapsed) is not int or type(size) is not int:
        raise ApiError(at, "elapsed_us and bytes are integers")
    return Measurement(event_id, _member(_MEASURES, kind, f"{at}.kind"), elapsed, size)


def _member(members: dict[str, Any], value: Any, at: str) -> Any:
    if not isinstance(value, str) or value not in members:
        raise ApiError(at, f"expected one of {', '.join(members)}, got {value!r}")
    return members[value]


def _outcome(value: Any, at: str, _: int) -> dict:
    outcome = OUTCOME.read(value, at)
    if not isinstance(outcome.get("request_id"), str):
        raise ApiError(f"{at}.request_id", "expected the request's id")
    return outcome


def _end(value: Any, at: str, number: int) -> dict:
    end = Object({"id": String(), "lines": Const(number)}).read(value, at)
    return end


def _state(value: Any, at: str, _: int) -> dict:
    state = Object({"state_id": String()}, open=True).read(value, at)
    return state


_SECTION_CHECKS: dict[str, Callable[[Any, str, int], Any]] = {
    "computation": lambda value, at, _: Object({}, open=True).read(value, at),
    "outcome": _outcome,
    "totals": lambda value, at, _: TOTALS.read(value, at),
    "state": _state,
    "end": _end,
}


# -- viewing ------------------------------------------------------------------------------------------


def streamed_view(path: Path, field: str = "RECORD") -> Iterator[tuple[str, Any]]:
    """What `plot` and `perfetto` read, one pass in record order: ("head", {...}), ("event", CacheEvent)...,
    ("outcome", {...})..., ("end", {"id": ...})."""
    for _, section, value in read_lines(path, field):
        if section in ("head", "event", "outcome", "end"):
            yield section, value


def whole_view(record: dict) -> Iterator[tuple[str, Any]]:
    """The same entries from a whole-JSON record that `check_viewable` passed (event ids "e<index>")."""
    yield "head", record
    for index, event in enumerate(record["events"]):
        at = f"record.events[{index}]"
        if event["event_id"] != f"e{index}":
            raise ApiError(f"{at}.event_id", f"expected 'e{index}' (events are numbered in order)")
        row = [index, *(event[name] for name in CacheEvent._fields[1:])]
        row[9] = [int(cause[1:]) for cause in event["causes"]]  # check_viewable: earlier events' ids
        yield "event", event_row(row, at, index)
    for request_id, outcome in record["outcomes"]["requests"].items():
        yield "outcome", {"request_id": request_id, **outcome}
    yield "end", {"id": record["id"]}
