"""kvsim's typed records and the streamed (JSON Lines) record: the same run, replayed line by line, refused
naming the line when cut or corrupted, drawn as a Perfetto trace with counter tracks; a streamed document
(made one request at a time) gives the same record in bounded memory."""

import gc
import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import write_atomically
from kvsim import engine, parse_interaction, parse_system, record_value, run_id, simulate
from kvsim.analytic import AnalyticModel, analytic_computations, analytic_stream
from kvsim.cache_event import CacheEvent, EventKind, Measurement, MeasurementKind
from kvsim.cache_run import dumps_without_floats
from kvsim.outcomes import RequestOutcome, Status
from kvsim.perfetto import trace_chunks
from kvsim.record_lines import _rows, pulled, read_lines, streamed_view, whole_view, write_lines
from kvsim.record_view import check_viewable
from kvsim.recorded import request_json
from kvsim.streamed_replay import replay_lines
from kvsim.synthetic import ConversationMix, arriving, conversations

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
        damaged = (
            original[:at]
            + data.draw(st.sampled_from([b"{", b"]", b'"', b"\n", b"9", b"x", b"\xff"]))
            + original[at + 1 :]
        )
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


def _written(computations, **inputs) -> tuple[bytes, object]:
    chunks: list[bytes] = []
    run = write_lines(chunks.append, parse_system(SYSTEM), computations, **inputs)
    return b"".join(chunks), run


def test_arriving_makes_the_conversations_in_arrival_order():
    assert list(arriving(400, seed=5)) == sorted(conversations(400, seed=5), key=lambda c: c.arrival_us)


def test_a_streamed_document_gives_the_record_of_the_same_document_in_memory(tmp_path):
    mix = ConversationMix(mean_gap_us=500, think_us=(1_000, 4_000))  # busy: rejections, offloads and reloads
    source = analytic_stream(MODEL, lambda: arriving(240, seed=3, mix=mix), "streamed test")
    held = analytic_computations(MODEL, list(arriving(240, seed=3, mix=mix)), "streamed test")
    streamed_bytes, streamed_run = _written(source)
    held_bytes, _ = _written(held)
    assert streamed_bytes == held_bytes  # line for line, byte for byte
    whole = simulate(parse_system(SYSTEM), held)
    assert streamed_run.id == run_id(whole) and streamed_run.outcomes["totals"] == whole.outcomes["totals"]
    assert all(whole.outcomes["totals"][name] for name in ("rejected", "offloads", "reloads", "drops"))
    path = tmp_path / "record.jsonl"
    path.write_bytes(streamed_bytes)
    assert replay_lines(path).identical
    outcomes = {v["request_id"]: v for _, s, v in read_lines(path) if s == "outcome"}
    held_outcomes = whole.outcomes["requests"].items()
    assert outcomes == {k: {"request_id": k, **v, "end_event": int(v["end_event"][1:])} for k, v in held_outcomes}


def test_a_streamed_document_refuses_a_workload_and_requests_out_of_arrival_order():
    items = conversations(50, seed=1)  # turns of a conversation arrive after later conversations start
    with pytest.raises(ApiError, match=r"computations\.requests\[\d+\]\.arrival_us"):
        _written(analytic_stream(MODEL, lambda: iter(items), "unordered"))
    with pytest.raises(ApiError, match="workload"):
        _written(analytic_stream(MODEL, lambda: arriving(5, seed=1), "t"), interaction=SCENARIO["interaction"])


def test_a_streamed_run_keeps_next_to_nothing_per_finished_request(monkeypatch):
    """Traced memory still held when the end line is written, for 4N requests against N: what grows with the
    requests is a few numbers each (the latencies the percentiles need), not the requests, outcomes or events
    (holding a request took about 4.7 KB). Batches (events, encoded lines) are bounded, not counted here:
    bench/kvsim.py measures the peak at a million requests."""
    monkeypatch.setattr(engine, "HAND_OVER_EVENTS", 1024)
    system = parse_system({  # keeps up with the arrivals: no backlog of waiting requests grows with N
        **SYSTEM, "max_requests": 10_000, "kv_cache": {"device_kv_bytes": 400_000, "host_kv_bytes": 1_600_000},
        "compute_service": {"compute_flops_per_us": 1e7, "memory_bytes_per_us": 1e6},
    })  # fmt: skip

    def held(requests: int) -> int:
        source = analytic_stream(MODEL, lambda: arriving(requests, seed=4), "memory")
        at_end: list[int] = []

        def write(chunk: bytes) -> None:
            if chunk.startswith(b'{"end":'):
                gc.collect()  # what is held, not garbage awaiting the collector
                at_end.append(tracemalloc.get_traced_memory()[0])

        tracemalloc.start()
        try:
            totals = write_lines(write, system, source).outcomes["totals"]
        finally:
            tracemalloc.stop()
        assert totals["completed"] + totals["stopped"] == requests and totals["offloads"]
        return at_end[0]

    n = 100
    small, large = held(n), held(4 * n)
    assert (large - small) / (3 * n) < 300, (small, large)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSON)
def test_the_fast_encoder_writes_what_json_writes(value):
    """orjson encodes records' float-free values only where it writes json's bytes: any string (quotes,
    backslashes, control characters, DEL, non-ASCII, lone surrogates) and any integer (past 64 bits too)."""
    assert dumps_without_floats(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode()


def test_rows_whose_strings_hold_the_row_separator_are_encoded_row_by_row():
    rows = [(0, "a],[b", None, (1, 2)), (1, "caf\u00e9", "x", ()), (2, "plain", None, (0,))]
    expected = b"".join(b'{"event":%b}\n' % json.dumps(row, separators=(",", ":")).encode() for row in rows)
    assert _rows(b"event", rows) == expected
    assert _rows(b"event", rows[2:]) == expected.split(b"\n", 2)[2]


def test_analytic_counts_are_the_per_position_formulas():
    """A GPT-2 shape in bfloat16: matrices and KV at 2 bytes, embedding rows, norms, biases and logits at 4."""
    model = AnalyticModel(layers=3, width=24, ffn=40, vocabulary=300, precision_bytes=2)
    item = ITEMS[7]
    request = analytic_computations(model, [item], "formulas").requests[0]
    n, w, f, V, layers = len(item.prompt_ids), 24, 40, 300, 3
    position_flops = [
        layers * (8 * w * w + 4 * w * f + 4 * w * (p + 1)) + 2 * w * V for p in range(n + len(item.output_ids))
    ]
    kv = 2 * layers * w * 2
    position_bytes = [(2 * w + V) * 4 + kv * (p + 1) for p in range(n + len(item.output_ids))]
    fixed = 2 * (layers * (4 * w * w + 2 * w * f) + w * V) + 4 * (layers * (9 * w + f) + 2 * w + V)
    document = request_json(request)
    assert document["prefill_costs"] == {
        "fixed_matmul_flops": 0,
        "fixed_memory_bytes": fixed,
        "position_matmul_flops": position_flops[:n],
        "position_memory_bytes": position_bytes[:n],
    }
    steps = range(n, n + len(item.output_ids) - 1)
    assert [s["position"] for s in document["decode_steps"]] == list(steps)
    assert [s["matmul_flops"] for s in document["decode_steps"]] == [position_flops[p] for p in steps]
    assert [s["logical_memory_bytes"] for s in document["decode_steps"]] == [fixed + position_bytes[p] for p in steps]
    assert request.prefill_cost(5) == (sum(position_flops[5:n]), fixed + sum(position_bytes[5:n]))


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_in_a_run_and_left_as_it_was(enabled):
    """A run makes no reference cycles (the collector, paused while the engine runs, would free nothing); it is
    resumed after, even when the run fails, and left off if it was off."""
    gc.collect()
    gc.disable()
    try:
        seen = []
        system = parse_system({**SYSTEM, "max_requests": 1_000})
        write_lines(lambda chunk: seen.append(gc.isenabled()), system, SCENARIO["computations"])
        assert seen and not any(seen)
        assert gc.collect() == 0
        if enabled:
            gc.enable()

        def failing(chunk: bytes) -> None:
            if chunk.startswith(b'{"event"'):
                raise OSError("disk full")

        with pytest.raises(OSError):
            write_lines(failing, system, SCENARIO["computations"])
        assert gc.isenabled() == enabled
    finally:
        gc.enable()


def test_replay_of_a_streamed_document_reads_its_requests_without_holding_them(monkeypatch, tmp_path):
    """Peak traced memory of replaying a record of 4N requests against N: what grows is the head's arrivals
    and a few numbers a request (about 330 bytes a request measured), not the requests (holding the computation
    lines and their requests took about 22 KB a request in this scenario); bound 1,000 bytes a request."""
    monkeypatch.setattr(engine, "HAND_OVER_EVENTS", 1024)
    system = parse_system({**SYSTEM, "max_requests": 10_000, "kv_cache": {"device_kv_bytes": 400_000, "host_kv_bytes": 1_600_000},
                           "compute_service": {"compute_flops_per_us": 1e7, "memory_bytes_per_us": 1e6}})  # fmt: skip

    def peak(requests: int) -> int:
        path = tmp_path / f"{requests}.jsonl"
        with open(path, "wb") as file:
            write_lines(file.write, system, analytic_stream(MODEL, lambda: arriving(requests, seed=4), "replay"))
        gc.collect()
        tracemalloc.start()
        try:
            replay = replay_lines(path)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert replay.identical and replay.bytes == path.stat().st_size
        return peak

    n = 300
    small, large = peak(n), peak(4 * n)
    assert (large - small) / (3 * n) < 1_000, (small, large)


def test_a_tampered_computation_line_of_a_streamed_document_is_named(tmp_path):
    source = analytic_stream(MODEL, lambda: arriving(40, seed=3), "tampered")
    lines = _written(source)[0].split(b"\n")
    number = 7  # request 5's computation line
    assert lines[number - 1].startswith(b'{"computation":')
    path = tmp_path / "record.jsonl"
    costlier = lines[number - 1].replace(b'"fixed_matmul_flops":', b'"fixed_matmul_flops":9', 1)
    path.write_bytes(b"\n".join([*lines[: number - 1], costlier, *lines[number:]]))
    replay = replay_lines(path)  # replayed as read: its own line agrees, the run it simulates does not
    assert not replay.identical and int(replay.difference.split(":")[0].removeprefix("first differing line ")) > number
    broken = lines[number - 1].replace(b'"selected_tokens":', b'"selected_tokens":9', 1)
    path.write_bytes(b"\n".join([*lines[: number - 1], broken, *lines[number:]]))
    with pytest.raises(ApiError, match=rf"record line {number}\.computation\.outcome\.selected_tokens"):
        replay_lines(path)


@pytest.mark.parametrize("output_ids", [5, {"a": 1}, "xy", [], ["x"], [1.5], None])
def test_a_complete_request_with_malformed_output_ids_is_refused_naming_its_line(tmp_path, output_ids):
    """The streamed replay finds the turn end in the first complete request: a malformed one is refused as
    a request, naming its line, never read as a list of ids (an int here was a TypeError)."""
    source = analytic_stream(MODEL, lambda: arriving(40, seed=3), "malformed")
    lines = _written(source)[0].split(b"\n")
    number = 2  # the first computation line
    line = json.loads(lines[number - 1])
    line["computation"]["outcome"]["complete"] = True
    line["computation"]["output_ids"] = output_ids
    path = tmp_path / "record.jsonl"
    path.write_bytes(b"\n".join([*lines[: number - 1], json.dumps(line).encode(), *lines[number:]]))
    with pytest.raises(ApiError, match=rf"record line {number}\.computation\.output"):
        replay_lines(path)
