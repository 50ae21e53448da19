"""The hand-computed worked example of docs/kvsim.md, event by event.

The expected log is the table in the doc itself, so the page and the simulator
cannot drift apart.
"""

import json
from pathlib import Path

from kvsim import record_value, simulate
from kvsim.inputs import load_input

ROOT = Path(__file__).resolve().parent.parent
INPUT = ROOT / "tests" / "data" / "kvsim_worked_example.json"


def _table_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "kvsim.md").read_text()
    example = text[text.index("## Worked example") :]
    lines = [line for line in example.splitlines() if line.startswith("| e") and not line.startswith("| event")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def _run() -> dict:
    return record_value(simulate(**load_input(INPUT)))


def test_every_event_matches_the_hand_computed_table():
    events = _run()["events"]
    rows = _table_rows()
    assert len(rows) == len(events) == 57
    for row, event in zip(rows, events, strict=True):
        event_id, time_us, request_id, kind, state, size, device, host, causes, detail = row
        detail_parts = [p for p in (event["phase"] or event["transfer_direction"], event["detail"]) if p]
        assert (event_id, int(time_us), request_id, kind, state or None, int(size), int(device), int(host)) == (
            event["event_id"],
            event["time_us"],
            event["request_id"],
            event["kind"],
            event["state_id"],
            event["bytes"],
            event["device_reserved_bytes"],
            event["host_retained_bytes"],
        ), event_id
        assert causes.split() == event["causes"], event_id
        assert detail == " ".join(detail_parts), event_id


def test_totals_and_outcomes_match_the_hand_computation():
    outcomes = _run()["outcomes"]
    totals = outcomes["totals"]
    assert (totals["hits_device"], totals["hits_host"], totals["lookups"]) == (1, 1, 4)
    assert (totals["reused_positions"], totals["prompt_positions"]) == (11, 21)
    assert (totals["bytes_device_to_host"], totals["bytes_host_to_device"]) == (700, 700)
    assert (totals["offloads"], totals["reloads"], totals["drops"]) == (1, 1, 1)
    assert (totals["compute_busy_us"], totals["end_us"]) == (14, 32)
    assert (totals["completed"], totals["rejected"]) == (4, 1)
    # Saved prefill FLOPs: B skips 4 positions and D skips 7, at 10 FLOPs each.
    assert totals["saved_matmul_flops"] == 110
    d = outcomes["requests"]["D"]
    assert (d["ttft_us"], d["queueing_us"], d["e2e_us"], d["reuse_tier"]) == (28, 17, 29, "host")


def test_the_input_file_is_what_the_doc_describes():
    document = json.loads(INPUT.read_text())["computations"]
    assert document["kv_bytes_per_position"] == 100
    assert [r["request_id"] for r in document["requests"]] == ["A", "B", "C", "D", "E"]
