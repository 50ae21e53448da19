"""The `jgpt kvsim` commands: bad input is one clear error and no record; replay; plots; perfetto."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jgpt.cli.main import main as jgpt

EXAMPLE = json.loads((Path(__file__).parent / "data" / "kvsim_worked_example.json").read_text())


def _write(path: Path, value) -> Path:
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def _fails(tmp_path, capsys, scenario, message: str) -> None:
    record = tmp_path / "record.json"
    code = jgpt(["kvsim", "run", str(_write(tmp_path / "input.json", scenario)), "--out", str(record)])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err
    assert err.count("\n") == 1
    assert not record.exists() and list(tmp_path.iterdir()) == [tmp_path / "input.json"]


def _changed(edit):
    scenario = copy.deepcopy(EXAMPLE)
    edit(scenario)
    return scenario


def test_malformed_json(tmp_path, capsys):
    _fails(tmp_path, capsys, '{"system": {', "INPUT: ")
    _fails(tmp_path, capsys, '{"system": {', "is not JSON: Expecting property name")


def test_negative_rate(tmp_path, capsys):
    scenario = _changed(lambda s: s["system"]["transfer"].update(link_bytes_per_us=-1))
    _fails(tmp_path, capsys, scenario, "system.transfer.link_bytes_per_us: must be positive")


def test_unknown_field(tmp_path, capsys):
    scenario = _changed(lambda s: s["system"]["kv_cache"].update(device_kv_byte=5))
    _fails(tmp_path, capsys, scenario, "system.kv_cache.device_kv_byte: unknown field")
    _fails(tmp_path, capsys, _changed(lambda s: s.update(extra=1)), "input.extra: unknown field")


def test_link_to_missing_node(tmp_path, capsys):
    graph = {
        "basis": "assumed",
        "nodes": [{"id": "gpu", "memory_capacity_bytes": 10, "compute_flops_per_us": 1, "memory_bytes_per_us": 1}],
        "links": [{"id": "pcie", "source": "gpu", "target": "cpu", "bandwidth_bytes_per_us": 1, "startup_us": 0}],
    }
    _fails(
        tmp_path,
        capsys,
        _changed(lambda s: s.update(resource_graph=graph)),
        "resource_graph.links[0].target: no node with id 'cpu'",
    )
    graph["nodes"].append(
        {"id": "gpu", "memory_capacity_bytes": 10, "compute_flops_per_us": 1, "memory_bytes_per_us": 1}
    )
    _fails(
        tmp_path,
        capsys,
        _changed(lambda s: s.update(resource_graph=graph)),
        "resource_graph.nodes[1].id: duplicate id 'gpu'",
    )


def test_cancel_for_unknown_request(tmp_path, capsys):
    interaction = {"actions": [{"kind": "cancel", "at_us": 3, "request_id": "Z"}]}
    _fails(
        tmp_path,
        capsys,
        _changed(lambda s: s.update(customer_interaction=interaction)),
        "customer_interaction.actions[0].request_id: unknown request 'Z'",
    )


def test_inconsistent_document(tmp_path, capsys):
    scenario = _changed(lambda s: s["computations"]["requests"][0]["decode_steps"].clear())
    _fails(tmp_path, capsys, scenario, "computations.requests[0].decode_steps: expected 1 steps")


def test_missing_computations_file(tmp_path, capsys):
    _fails(tmp_path, capsys, _changed(lambda s: s.update(computations="nowhere.json")), "computations: cannot read")


@pytest.fixture
def recorded(tmp_path) -> Path:
    scenario = _changed(
        lambda s: s.update(
            customer_interaction={"actions": [{"kind": "consume", "at_us": 2, "request_id": "A", "output_bytes": 1}]}
        )
    )
    record = tmp_path / "record.json"
    assert jgpt(["kvsim", "run", str(_write(tmp_path / "input.json", scenario)), "--out", str(record)]) == 0
    return record


def test_run_prints_the_summary_and_replay_is_byte_identical(recorded, capsys):
    assert jgpt(["kvsim", "run", str(recorded.with_name("input.json"))]) == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "hit rate     device 25.0%  host 25.0%" in out
    assert jgpt(["kvsim", "replay", str(recorded)]) == 0
    assert "byte-identical" in capsys.readouterr().out


def test_replay_names_the_first_differing_event(recorded, capsys):
    record = json.loads(recorded.read_text())
    record["events"][20]["time_us"] += 1
    tampered = _write(recorded.with_name("tampered.json"), json.dumps(record, separators=(",", ":")) + "\n")
    assert jgpt(["kvsim", "replay", str(tampered)]) == 1
    err = capsys.readouterr().err
    assert "first differing event at index 20" in err and '"event_id": "e20"' in err


def test_plot_and_perfetto_write_their_files(recorded, tmp_path, capsys):
    assert jgpt(["kvsim", "plot", str(recorded), "--out-dir", str(tmp_path / "plots")]) == 0
    for name in ("occupancy.png", "timeline.png", "latency_cdf.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    assert jgpt(["kvsim", "perfetto", str(recorded)]) == 0
    trace = json.loads(recorded.with_name("record.perfetto.json").read_text())["traceEvents"]
    record = json.loads(recorded.read_text())
    instants = [e for e in trace if e["ph"] == "i"]  # every event, its causes among its arguments
    assert [e.get("args", {}).get("causes", []) for e in instants] == [
        [int(c[1:]) for c in e["causes"]] for e in record["events"]
    ]
    assert [e for e in trace if e["ph"] == "C"]  # the occupancy counter track
    steps = [e for e in trace if e["ph"] == "X" and e["tid"] == 1]  # the compute track
    assert sum(s["dur"] for s in steps) == record["outcomes"]["totals"]["compute_busy_us"]


def test_consumption_is_measured_against_publication(recorded):
    record = json.loads(recorded.read_text())
    (consume,) = [e for e in record["events"] if e["kind"] == "consume"]
    assert (consume["time_us"], consume["bytes"], consume["detail"]) == (2, 1, "published_bytes=0")
    (wait,) = [m for m in record["measurements"] if m["kind"] == "consume_wait"]
    assert (wait["event_id"], wait["elapsed_us"]) == (consume["event_id"], 1)  # A publishes its first byte at 3


def test_synthesize_then_run(tmp_path, capsys):
    document = tmp_path / "doc.json"
    assert jgpt(["kvsim", "synthesize", "--requests", "40", "--seed", "3", "--out", str(document)]) == 0
    scenario = {"system": EXAMPLE["system"] | {"max_new_tokens_cap": 16}, "computations": "doc.json"}
    scenario["system"]["kv_cache"] = {"device_kv_bytes": 10**8, "host_kv_bytes": 10**8}
    assert jgpt(["kvsim", "run", str(_write(tmp_path / "input.json", scenario))]) == 0
    assert "40 requests" in capsys.readouterr().out


def test_kvsim_imports_no_jax_numpy_or_matplotlib():
    code = (
        "import sys, kvsim, kvsim.commands, kvsim.perfetto, kvsim.record_lines, kvsim.traces\n"
        "print(sorted(m for m in ('jax', 'numpy', 'matplotlib', 'inference') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
