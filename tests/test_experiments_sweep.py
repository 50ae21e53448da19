"""Labs of one's own and sweeps that scale out: a lab file from any directory is read, shown, listed,
run and swept like a built-in one; a sweep's arms run serially, in worker processes or on a local Ray
instance and write the same bytes; Ctrl-C stops the workers and writes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.arm_pool import ArmPool, SharedInput, SimulatedArm, simulated
from experiments.experiment_design import LABS, ExperimentDesign, default_catalog, find_lab, is_lab_path
from experiments.experiment_execution import run_lab
from experiments.experiment_replay import replay
from experiments.lab_grid import GridAxis, gridded, parse_axis
from jgpt.foundation.errors import ApiError

from conftest import lab_defaults, tiny_model
from hostile import error_lines, interruptible, run_jgpt

REPO = Path(__file__).resolve().parent.parent
DEADLINE = 240
CATALOG = default_catalog()


def own_lab(model_path: str | None = None, lab_id: str = "my-host-tier") -> dict:
    """The host-tier lab as a person's own file: another id, three conversations, a 2 x 3 x 2 = 12-arm sweep, and
    (for a command, which has no test defaults) the tiny model and a short output budget in its settings."""
    document = json.loads((LABS / "host-tier-vs-recompute.json").read_text())
    document["id"] = lab_id
    document.pop("answer")  # its crossover picks one arm per bandwidth, and this lab has two (device budgets)
    document["workload"]["conversations"] = document["workload"]["conversations"][:3]
    document["sweep"].append({"control": "kv_cache.device_kv_bytes", "values": [262144, 524288]})
    document["settings"] = [s for s in document["settings"] if s["control"] != "kv_cache.device_kv_bytes"]
    if model_path is not None:
        document["settings"] += [
            {"control": "model.model_id", "value": model_path},
            {"control": "generation.max_new_tokens", "value": 4},
        ]
    return document


def write_lab(directory: Path, document: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{document['id']}.json"
    path.write_text(json.dumps(document, indent=1))
    return path


def every_file(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@given(st.from_regex(r"^[a-z0-9]+(-[a-z0-9]+)*$", fullmatch=True))  # LAB's id pattern
def test_no_lab_id_reads_as_a_path(lab_id):
    assert not is_lab_path(lab_id)


def test_a_reference_with_a_separator_or_a_json_suffix_is_a_path():
    assert all(is_lab_path(r) for r in ("mylab.json", "./mylab", "labs/x", "/tmp/x.json"))
    assert not any(is_lab_path(r) for r in ("host-tier-vs-recompute", "mylab"))


def test_show_and_list_read_lab_files_from_any_directory(tmp_path, monkeypatch):
    path = write_lab(tmp_path / "elsewhere", own_lab())
    code, shown, _ = run_jgpt(["lab", "show", path])
    assert code == 0 and shown.startswith("my-host-tier: ") and "kv_cache.device_kv_bytes in [262144, 524288]" in shown
    code, listed, _ = run_jgpt(["lab", "list", "--dir", path.parent])
    assert code == 0 and listed.split()[:3] == ["my-host-tier", "12", "arms"]
    code, as_json, _ = run_jgpt(["lab", "show", path, "--json"])
    assert ExperimentDesign.from_json(json.loads(as_json)) == find_lab(str(path))
    monkeypatch.chdir(path.parent)
    assert run_jgpt(["lab", "show", "my-host-tier.json"])[1] == shown  # relative to the current directory
    (path.parent / "my-host-tier").write_text(path.read_text())
    code, _, stderr = run_jgpt(["lab", "show", "my-host-tier"])  # an id, never the file beside it
    assert code == 2 and "give its path: ./my-host-tier" in stderr
    (path.parent / "host-tier-vs-recompute").write_text("{}")  # a file named like a built-in id: the id wins
    assert run_jgpt(["lab", "show", "host-tier-vs-recompute"])[0] == 0


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d["sweep"][2]["values"].append("big"), "sweep[2].values[2]"),
        (lambda d: d["settings"].append({"control": "kv_cache.host_kv_bytes", "value": 1}), "sweep[0].control"),
        (lambda d: d["workload"]["conversations"][0]["turns"][1].update(role="robot"), "workload.conversations[0]"),
        (lambda d: d.update(id="other-id"), "id"),
        (lambda d: d.pop("contract"), "contract"),
    ],
)
def test_a_bad_lab_file_is_refused_naming_its_path_and_field(tmp_path, edit, field):
    document = own_lab()
    edit(document)
    path = tmp_path / "my-host-tier.json"
    path.write_text(json.dumps(document))
    for argv in (["lab", "show", path], ["lab", "run", path, "--out", tmp_path / "out"]):
        code, _, stderr = run_jgpt(argv)
        assert code == 2 and f"{path}: {field}" in error_lines(stderr)[0], stderr
    code, _, stderr = run_jgpt(["lab", "list", "--dir", tmp_path])
    assert code == 2 and f"{path}: {field}" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-host-tier.json"]


def test_a_missing_lab_file_or_directory_is_refused_naming_it(tmp_path):
    code, _, stderr = run_jgpt(["lab", "run", tmp_path / "none.json", "--out", tmp_path / "out"])
    assert code == 2 and f": lab: cannot read {tmp_path / 'none.json'}" in stderr
    code, _, stderr = run_jgpt(["lab", "list", "--dir", tmp_path / "none"])
    assert code == 2 and ": --dir: " in stderr
    code, _, stderr = run_jgpt(["lab", "list", "--dir", tmp_path])
    assert code == 2 and "holds no lab file" in stderr


def test_grid_axes_add_to_the_labs_sweep_and_replace_what_it_assigns():
    lab = find_lab("host-tier-vs-recompute")
    axis = parse_axis("kv_cache.device_kv_bytes=262144,524288")
    assert axis == GridAxis("kv_cache.device_kv_bytes", (262144, 524288))
    swept, replaced = gridded(lab, [axis, parse_axis("kv_cache.retention_policy=lru")])
    assert len(swept.arms()) == 12 and swept.answer is None
    assert replaced[0] == "--grid replaces kv_cache.device_kv_bytes: the lab's setting 524288"
    assert replaced[1].startswith("--grid drops the lab's crossover answer, which does not fit the swept arms")
    assert all(arm.execution.value("kv_cache.retention_policy") == "lru" for arm in swept.arms())
    assert (
        swept.arms()[0].label
        == "kv_cache.host_kv_bytes=0, transfer.link_bytes_per_us=30, kv_cache.device_kv_bytes=262144"
    )
    again, replaced = gridded(lab, [parse_axis("transfer.link_bytes_per_us=1e2,1000")])
    assert [arm.execution.value("transfer.link_bytes_per_us") for arm in again.arms()][:2] == [100.0, 1000]
    assert replaced == ["--grid replaces transfer.link_bytes_per_us: the lab's sweep over [30, 300, 3000]"]
    assert again.answer == lab.answer  # still one arm per bandwidth on each side


@pytest.mark.parametrize(
    "grid, field",
    [
        (["kv_cache.device_kv_bytes"], "--grid"),
        (["kv_cache.device_kv_bytes="], "--grid"),
        (["no.such.control=1,2"], "--grid"),
        (["kv_cache.device_kv_bytes=1,big"], "--grid kv_cache.device_kv_bytes[1]"),
        (["kv_cache.device_kv_bytes=0,1"], "--grid kv_cache.device_kv_bytes[0]"),
        (["kv_cache.device_kv_bytes=1,1"], "--grid kv_cache.device_kv_bytes"),
        (["kv_cache.retention_policy=lru,most"], "--grid kv_cache.retention_policy[1]"),
        (["max_requests=1,2", "max_requests=3,4"], "--grid max_requests"),
        (["decoding.rule=greedy,speculative"], "--grid: sweep"),
    ],
)
def test_a_bad_grid_is_refused_naming_it(tmp_path, grid, field):
    argv = ["lab", "sweep", "host-tier-vs-recompute", "--out", tmp_path / "out"]
    code, _, stderr = run_jgpt(argv + [x for g in grid for x in ("--grid", g)])
    assert code == 2 and f": {field}" in error_lines(stderr)[0], stderr
    assert list(tmp_path.iterdir()) == []


def test_a_grid_cannot_take_a_control_out_of_a_joint_axis():
    with pytest.raises(ApiError) as caught:
        gridded(find_lab("kvsim-fidelity"), [parse_axis("execution.runner=kvsim,engine")])
    assert caught.value.field == "--grid execution.runner"


def test_where_arms_run_is_checked_before_anything_runs(monkeypatch):
    for pool, field in ((dict(workers=0), "--workers"), (dict(ray=" "), "--ray"), (dict(ray="10.1.2.3:6379", workers=2), "--workers")):  # fmt: skip
        with pytest.raises(ApiError) as caught:
            ArmPool(**pool)
        assert caught.value.field == field
    monkeypatch.setitem(sys.modules, "ray", None)  # as without the extra: `import ray` raises ImportError
    lab = find_lab("host-tier-vs-recompute")
    arm = SimulatedArm(0, "settings", lab.settings, 0)
    with pytest.raises(ApiError) as caught:
        list(simulated(ArmPool(ray="local"), SharedInput(lab, lab.workload, ({},), None), [arm]))
    assert caught.value.field == "--ray" and "pip install 'jgpt[ray]'" in caught.value.reason


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """A person's 12-arm lab, read from a temporary directory and run serially (the reference bytes), with the
    recordings the other runs share so that only where the arms run differs."""
    root = tmp_path_factory.mktemp("sweep")
    model = tiny_model(root / "model", seed=3)
    lab = find_lab(str(write_lab(root / "labs", own_lab(str(model.path)))))
    recordings: dict = {}
    started = time.perf_counter()
    run = run_lab(lab, root / "serial", report=False, plots=False, recordings=recordings)
    return lab, recordings, run, time.perf_counter() - started, root


def _same_run(serial, pool: ArmPool, name: str):
    lab, recordings, reference, _, root = serial
    run = run_lab(lab, root / name, report=False, plots=False, recordings=recordings, pool=pool)
    assert len(run.record["arms"]) == 12
    assert every_file(run.directory) == every_file(reference.directory)  # record, cache runs, summary: same bytes
    assert replay(run.directory / "record.json") == reference.record


def test_a_12_arm_sweep_in_two_worker_processes_writes_the_serial_runs_bytes(serial):
    _same_run(serial, ArmPool(workers=2), "workers")


def test_a_12_arm_sweep_on_a_local_ray_instance_writes_the_serial_runs_bytes(serial):
    _same_run(serial, ArmPool(ray="local", workers=2), "ray")


def test_engine_arms_are_measured_here_and_calibrated_kvsim_arms_simulated_in_workers(tmp_path):
    """kvsim-fidelity: the calibration and the engine arms run in this process, one at a time; the calibrated and
    roofline arms, which read the fitted service, in two workers. The record replays, arms in the lab's order."""
    lab = find_lab("kvsim-fidelity")
    defaults = lab_defaults(tiny_model(tmp_path / "model", seed=2), max_new_tokens=4)
    run = run_lab(lab, tmp_path / "run", report=False, plots=False, defaults=defaults, pool=ArmPool(workers=2))
    assert [arm["label"] for arm in run.record["arms"]] == [arm.label for arm in lab.arms()]
    assert ["measured_run" in arm for arm in run.record["arms"]] == [
        arm.execution.assignments.get("execution.runner") == "engine" for arm in lab.arms()
    ]
    assert replay(run.directory / "record.json") == run.record


def test_a_lab_file_from_a_temporary_directory_runs_and_sweeps_from_the_command_line(serial, tmp_path):
    lab, _, _, _, root = serial
    path = root / "labs" / f"{lab.id}.json"
    code, stdout, stderr = run_jgpt(["lab", "run", path, "--out", tmp_path / "run", "--no-report", "--quiet"])
    assert code == 0, stderr
    assert stdout.startswith("my-host-tier (lab-") and len(json.loads((tmp_path / "run" / "summary.json").read_text())["arms"]) == 12  # fmt: skip
    argv = ["lab", "sweep", path, "--out", tmp_path / "sweep", "--no-report", "--quiet", "--workers", "2", "--json"]
    code, stdout, stderr = run_jgpt(argv + ["--grid", "scheduling.max_active_requests=1,4"])
    assert code == 0, stderr
    assert len(json.loads(stdout)["arms"]) == 24 and replay(tmp_path / "sweep" / "record.json")


def test_ctrl_c_stops_the_workers_and_leaves_nothing_written(serial, tmp_path):
    """Ctrl-C reaches the whole process group: the command ends as interrupted, its workers with it, and the
    output directory is never made (a run writes it whole, after every arm)."""
    lab, _, _, _, root = serial
    path = root / "labs" / f"{lab.id}.json"
    many = ",".join(str(100 + n) for n in range(40))
    argv = [sys.executable, "-m", "jgpt", "lab", "sweep", str(path), "--out", str(tmp_path / "out"), "--quiet",
            "--workers", "2", "--grid", f"transfer.link_latency_us={many}", "--grid", f"max_requests={many}"]  # fmt: skip
    with interruptible():
        process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)  # fmt: skip
    try:
        workers = _wait_for_workers(process)
        time.sleep(1)  # arms running in them
        os.killpg(process.pid, signal.SIGINT)
        code = process.wait(DEADLINE)
    finally:
        if process.poll() is None:
            process.kill()
    stderr = process.stderr.read()
    assert code == 128 + signal.SIGINT and stderr.strip().splitlines()[-1] == "jgpt lab: interrupted", stderr
    assert "Traceback" not in stderr
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    assert list(tmp_path.iterdir()) == []


def _wait_for_workers(process: subprocess.Popen) -> list[int]:
    """The pids of the command's spawned workers, once there are two."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        workers = [pid for pid in children if "spawn_main" in _command_line(pid)]
        if len(workers) >= 2:
            return [int(pid) for pid in workers]
        time.sleep(0.05)
    raise AssertionError("timed out waiting for the workers")


def _command_line(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:  # it ended between the listing and the read
        return ""
