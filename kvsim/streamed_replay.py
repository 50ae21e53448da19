"""Replay of a streamed CacheRun record (kvsim.record_lines): its declaration simulated again, compared line by line.

`replay_lines` writes the record again through `write_lines` and compares each chunk with the file as it
goes, so neither is ever held whole; the first differing line is named. A record whose requests arrive
when its computation lines say is replayed from those lines, read from the file again each time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from jgpt.foundation.errors import ApiError
from kvsim.cache_run import MODEL_VERSION, rerun_inputs
from kvsim.record_lines import read_lines, write_lines
from kvsim.recorded import (
    REQUEST,
    RecordedRequest,
    StreamedComputations,
    check_complete_end,
    check_stops_at_turn_end,
    parse_request,
)


@dataclass(frozen=True)
class Replay:
    id: str
    identical: bool
    lines: int
    bytes: int
    difference: str | None


def replay_lines(path: Path, field: str = "RECORD") -> Replay:
    """Simulate a streamed record's declaration again, comparing each produced chunk with the file as it
    goes (neither is ever held whole); the first differing line is named. A record whose requests arrive
    when its computations say (a recorded workload, no customer interaction) is replayed as a
    StreamedComputations that reads its computation lines from the file again each time: its requests are
    never held (a million of them took ~10 GB held)."""
    heads = read_lines(path, field)
    record: dict[str, Any] = dict(next(heads)[2])
    heads.close()
    if not str(record["evidence"]).startswith(f"{MODEL_VERSION}:"):
        raise ApiError("record line 1.evidence", f"not a {MODEL_VERSION} record")
    turn_end = _streamable(path, field, record["declaration"])
    if turn_end is not _HELD:
        record["declaration"] = {**record["declaration"], "workload": {"kind": "recorded", "requests": []}}
    record["computations"] = [] if turn_end is not _HELD else [value for _, value in _computation_values(path, field)]
    try:
        inputs = rerun_inputs(record)
    except ApiError as error:
        raise _on_its_line(error) from None
    del record
    if turn_end is not _HELD:
        held = inputs.pop("computations")
        requests = lambda: _recorded_requests(path, field, turn_end)  # noqa: E731
        inputs |= {"workload": None, "interaction": None, "computations": StreamedComputations(
            held.model, held.kv_bytes_per_position, held.execution, requests)}  # fmt: skip
    with open(path, "rb") as file:
        comparison = _Comparison(file)
        try:
            run = write_lines(comparison.write, **inputs)
        except _Differs:
            return Replay("", False, comparison.lines, comparison.offset, comparison.difference)
        except ApiError as error:
            raise _on_its_line(error) from None
        if file.read(1):
            comparison.difference = f"the record goes on after its replayed {comparison.lines} lines"
    return Replay(run.id, comparison.difference is None, comparison.lines, comparison.offset, comparison.difference)


_HELD = object()  # `_streamable`'s answer for a record whose requests a replay holds


def _computation_values(path: Path, field: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each computation line, read from the file one at a time."""
    for number, section, value in read_lines(path, field):
        if section == "computation":
            yield number, value
        elif section != "head":
            return


def _streamable(path: Path, field: str, declared: dict) -> Any:
    """Whether a streamed document gives this record (its workload is the arrivals its computation lines
    declare, in arrival order, and no customer acts): then the turn end its complete requests end with
    (None if none is complete), else _HELD. One pass over the computation lines, holding none of them."""
    workload = declared.get("workload")
    if declared.get("customer_interaction") is not None or not isinstance(workload, dict):
        return _HELD
    arrivals = workload.get("requests")
    if workload.get("kind") != "recorded" or not isinstance(arrivals, list):
        return _HELD
    turn_end, last, count = None, 0, 0
    for count, (_, value) in enumerate(_computation_values(path, field), 1):
        arrival = {"request_id": value.get("request_id"), "arrival_us": value.get("arrival_us")}
        if count > len(arrivals) or arrivals[count - 1] != arrival or type(arrival["arrival_us"]) is not int:
            return _HELD
        if arrival["arrival_us"] < last:
            return _HELD
        last = arrival["arrival_us"]
        outcome, output = value.get("outcome"), value.get("output_ids")
        # Only from a well-formed line: a malformed one is refused, naming its line, when it is read as a request.
        if turn_end is None and isinstance(outcome, dict) and outcome.get("complete") is True and _ends_with_id(output):
            turn_end = output[-1]
    return turn_end if count == len(arrivals) else _HELD


def _ends_with_id(output: Any) -> bool:
    return isinstance(output, list) and bool(output) and type(output[-1]) is int


def _recorded_requests(path: Path, field: str, turn_end: int | None) -> Iterator[RecordedRequest]:
    """The record's requests, parsed from its computation lines one at a time, with the checks
    `parse_document` makes of each (and of the turn end; request ids are not checked for duplicates,
    which would hold them all, as a streamed document's are not)."""
    for number, value in _computation_values(path, field):
        at = f"record line {number}.computation"
        request = parse_request(REQUEST.read(value, at), at)
        check_complete_end(request, turn_end, at)
        check_stops_at_turn_end(request, turn_end, at)
        yield request


def _on_its_line(error: ApiError) -> ApiError:
    """An error `rerun_inputs` names in the whole record's terms, named by the streamed record's line."""
    if error.field.startswith("record line "):  # a streamed replay's requests name their own lines
        return error
    request = re.match(r"record\.computations\.requests\[(\d+)\](.*)", error.field)
    if request:  # request i is on line i + 2, after the head
        return ApiError(f"record line {int(request[1]) + 2}.computation{request[2]}", error.reason)
    if error.field.startswith("record."):  # the declaration, checkpoint and provenance are on the head line
        return ApiError("record line 1" + error.field.removeprefix("record"), error.reason)
    return ApiError(f"record line 1.declaration.{error.field}", error.reason)  # refused by the simulation


class _Differs(Exception):
    """Raised into the replaying simulation at the first difference: nothing after it is compared."""


class _Comparison:
    """Reads the recorded file alongside what a replay writes."""

    def __init__(self, file: BinaryIO):
        self.file, self.offset, self.lines = file, 0, 0
        self.difference: str | None = None

    def write(self, data: bytes) -> None:
        recorded = self.file.read(len(data))
        if recorded == data:
            self.offset += len(data)
            self.lines += data.count(b"\n")
            return
        at = next((i for i, (a, b) in enumerate(zip(recorded, data, strict=False)) if a != b), len(recorded))
        start = data.rfind(b"\n", 0, at) + 1
        line = self.lines + data.count(b"\n", 0, at) + 1
        replayed = data[start : data.find(b"\n", start) if b"\n" in data[start:] else None]
        written = (recorded[start:] + self.file.readline(200)).split(b"\n", 1)[0]
        self.difference = (
            f"first differing line {line}:\n  recorded: {_shown(written)}\n  replayed: {_shown(replayed)}"
            if written else f"the record ends at line {line}, the replay goes on"
        )  # fmt: skip
        self.lines = line
        raise _Differs


def _shown(line: bytes) -> str:
    text = line.decode("utf-8", errors="replace")
    return text if len(text) <= 300 else text[:300] + "..."
