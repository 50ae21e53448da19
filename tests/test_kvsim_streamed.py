"""kvsim's typed records and the streamed (JSON Lines) record: the same run, replayed line by line, refused
naming the line when cut or corrupted, drawn as a Perfetto trace with counter tracks."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jgpt.errors import ApiError
from jgpt.identity import write_atomically
from kvsim import parse_interaction, parse_system, record_value, run_id, simulate
from kvsim.analytic import AnalyticModel, analytic_computations
from kvsim.cache_event import CacheEvent, EventKind, Measurement, MeasurementKind
from kvsim.outcomes import RequestOutcome, Status
from kvsim.perfetto import trace_chunks
from kvsim.record_lines import pulled, read_lines, replay_lines, streamed_view, whole_view, write_lines
from kvsim.record_view import check_viewable
from kvsim.synthetic import conversations

MODEL = AnalyticModel(layers=1, width=16, ffn=32, vocabulary=260, precision_bytes=4)
SYSTEM = {
    "max_requests": 30, "max_new_tokens_cap": 12,
    "scheduling": {"max_active_requests": 3, "policy": "continuous_batching"},
    "kv_cache": {"device_kv_bytes": 60_000, "host_kv_bytes": 120_000},
    "transfer": {"link_bytes_per_us": 100, "link_latency_us": 5},
    "compute_service": {"compute_flops_per_us": 1e5, "memory_bytes_per_us": 1e4},
}  # fmt: skip
ITEMS = conversations(60, seed=2)
ACTIONS = [
    {"kind": "consume", "at_us": item.arrival_us + 300 * i, "request_id": item.request_id, "output_bytes": 2}
    for i, item in enumerate(ITEMS[:20])
] + [{"kind": "cancel", "at_us": ITEMS[5].arrival_us + 40, "request_id": ITEMS[5].request_id}]
SCENARIO = {
    "system": parse_system(SYSTEM),
    "computations": analytic_computations(MODEL, ITEMS, "streamed test"),
    "interaction": parse_interaction({"actions": sorted(ACTIONS, key=lambda a: a["at_us"])}),
}


@pytest.fixture(scope="module")
def streamed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("streamed") / "record.jsonl"
    write_atomically(path, pulled(lambda write: write_lines(write, **SCENARIO)))
    return path


def test_events_measurements_and_outcomes_are_typed():
    run = simulate(**SCENARIO)
    kinds = {event.kind for event in run.result.events}
    assert all(type(event) is CacheEvent for event in run.result.events)
    assert all(type(m) is Measurement and isinstance(m.kind, MeasurementKind) for m in run.measurements)
    assert {EventKind.OFFLOAD, EventKind.RELOAD, EventKind.CONSUME, EventKind.CANCEL_REQUEST} <= kinds
    assert all(type(o) is RequestOutcome and isinstance(o.status, Status) for o in run.result.outcomes)
    # every cause is an earlier event, and the record writes the enum members as their plain strings
    assert all(c < event.event_id for event in run.result.events for c in event.causes)
    record = record_value(run)
    assert record["events"][0]["kind"] == "arrival" and record["events"][0]["event_id"] == "e0"
    assert {m["kind"] for m in record["measurements"]} >= {"compute_prefill", "consume_wait"}


def test_a_streamed_record_holds_the_in_memory_run_and_replays_identically(streamed):
    run = simulate(**SCENARIO)
    lines = list(read_lines(streamed))
    sections = [section for _, section, _ in lines]
    assert sections[0] == "head" and sections[-1] == "end"
    assert [v for _, s, v in lines if s == "event"] == run.result.events
    assert [v for _, s, v in lines if s == "measurement"] == run.measurements  # consume waits last, as in memory
    outcomes = {v["request_id"]: v for _, s, v in lines if s == "outcome"}
    assert outcomes.keys() == run.outcomes["requests"].keys()
    assert [v for _, s, v in lines if s == "totals"] == [run.outcomes["totals"]]
    assert lines[-1][2] == {"id": run_id(run), "lines": len(lines)}  # the same id as the whole-JSON record's
    replay = replay_lines(streamed)
    assert (replay.identical, replay.lines, replay.bytes) == (True, len(lines), streamed.stat().st_size)


def test_a_changed_line_is_named_by_replay(streamed, tmp_path):
    lines = streamed.read_bytes().split(b"\n")
    number = next(i for i, line in enumerate(lines) if line.startswith(b'{"event":[40,')) + 1
    lines[number - 1] = lines[number - 1].replace(b'{"event":[40,"', b'{"event":[40,"x', 1)
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_bytes(b"\n".join(lines))
    replay = replay_lines(tampered)
    assert not replay.identical and replay.difference.startswith(f"first differing line {number}:")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_cut_or_corrupted_streamed_record_is_refused_naming_a_line(streamed, tmp_path_factory, data):
    original = streamed.read_bytes()
    if data.draw(st.booleans(), label="cut"):
        damaged = original[: data.draw(st.integers(0, len(original) - 1), label="length")]
    else:
        at = data.draw(st.integers(0, len(original) - 1), label="at")
        damaged = original[:at] + data.draw(st.sampled_from([b"{", b"]", b'"', b"\n", b"9", b"x", b"\xff"])) + original[at + 1 :]
    if damaged == original:
        return
    path = tmp_path_factory.mktemp("damaged") / "record.jsonl"
    path.write_bytes(damaged)
    try:
        replay = replay_lines(path)
    except ApiError as error:  # refused: the error names the line it stopped at
        assert error.field.startswith("record line "), error
        number = int(error.field.removeprefix("record line ").split(".")[0])
        assert 1 <= number <= damaged.count(b"\n") + 1
        return
    assert not replay.identical  # read whole but not what the declaration gives: replay says where


def test_perfetto_has_counter_tracks_instants_and_the_compute_slices(streamed):
    trace = json.loads(b"".join(trace_chunks(streamed_view(streamed))))
    run = simulate(**SCENARIO)
    events = trace["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(set(e["args"]) == {"device", "host"} for e in counters)
    assert max(e["args"]["device"] for e in counters) <= SYSTEM["kv_cache"]["device_kv_bytes"]
    assert len([e for e in events if e["ph"] == "i"]) == len(run.result.events)
    assert {e["tid"] for e in events if e["ph"] in ("i", "X")} == {1, 2, 3}  # compute, link, events: no request tracks
    ends = {EventKind.COMPUTE_END: 1, EventKind.TRANSFER_END: 2}
    for tid in (1, 2):  # a slice per work (a batch draws one per request in it) and per transfer, start to end
        slices = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and e["tid"] == tid]
        assert sorted(end for _, end in slices) == [e.time_us for e in run.result.events if ends.get(e.kind) == tid]
        assert all(start <= end for start, end in slices)
    assert trace["otherData"]["record"] == run_id(run)
    # the whole-JSON record draws the same trace
    whole = json.loads(b"".join(trace_chunks(whole_view(check_viewable(record_value(run))))))
    assert whole == trace
