"""Lab arms on the real InferenceEngine and calibrated kvsim arms: they run, replay, and edits are refused.

One module-scoped run of the kvsim-fidelity lab on a tiny random-weight model (4 output
tokens) serves the calibration workload and the engine arms for real; every test reads
or copies that one run.
"""

import copy
import hashlib
import json
import re
import shutil

import pytest

from experiments.experiment_design import ExperimentDesign, default_catalog
from experiments.experiment_execution import resolve, run_lab
from experiments.experiment_replay import replay
from experiments.kvsim_arms import simulate_arm
from experiments.record_integrity import check_measured_run
from experiments.record_summary import summary
from jgpt.foundation.errors import ApiError
from kvsim.cache_run import record_json
from kvsim.calibration import fit
from kvsim.measured_run import read_measured_run
from tests.test_experiments_run import _chromium

from conftest import lab_defaults, tiny_model

LAB = default_catalog().lab("kvsim-fidelity")


@pytest.fixture(scope="module")
def fidelity_defaults(tmp_path_factory):
    return lab_defaults(tiny_model(tmp_path_factory.mktemp("model"), seed=2), max_new_tokens=4)


@pytest.fixture(scope="module")
def fidelity(fidelity_defaults, tmp_path_factory):
    return run_lab(LAB, tmp_path_factory.mktemp("lab") / LAB.id, report=False, plots=False, defaults=fidelity_defaults)


def _copy(fidelity, tmp_path):
    directory = tmp_path / "copy"
    shutil.copytree(fidelity.directory, directory)
    return directory, json.loads((directory / "record.json").read_text())


def _rewrite(directory, record, name, document):
    """Replace a file the record names, its entry's hash and size updated so only the content check can object."""
    data = (json.dumps(document, indent=1) + "\n").encode()
    (directory / name).write_bytes(data)
    entries = [arm.get("measured_run") for arm in record["arms"]] + [
        run["measured_run"] for run in record["calibration"]["runs"]
    ]
    for entry in entries:
        if entry and entry["path"] == name:
            entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (directory / "record.json").write_text(json.dumps(record, indent=1) + "\n")


def _engine_arm(record):
    return next(i for i, arm in enumerate(record["arms"]) if "measured_run" in arm)


def test_engine_arms_are_measured_and_the_record_replays(fidelity):
    record = fidelity.record
    assert record == replay(fidelity.directory / "record.json")
    engine = [arm for arm in record["arms"] if "measured_run" in arm]
    assert len(engine) == 2 and len(record["arms"]) == 6  # 2 policies x {engine, calibrated, roofline}
    for arm in engine:
        measured = json.loads((fidelity.directory / arm["measured_run"]["path"]).read_bytes())
        assert arm["outcomes"] == measured["totals"] and arm["system"] == measured["system"]
        assert measured["engine"]["compiles_during_run"] == 0 and not measured["engine"]["as_fast_as_possible"]
        assert arm["outcomes"]["arrived"] == len(LAB.workload.requests)
        policy = {s["control"]: s["value"] for s in arm["execution"]}["scheduling.policy"]
        assert measured["system"]["scheduling"]["policy"] == policy
    table = summary(record)
    assert [row["source"] for row in table["arms"]] == [
        "measured on the engine",
        "simulated by kvsim (calibrated)",
        "simulated by kvsim (roofline)",
    ] * 2
    assert {(p["measured"], p["service"]) for p in table["fidelity"]} == {
        (arm["label"], s) for arm in engine for s in ("calibrated", "roofline")
    }
    for pair in table["fidelity"]:
        engine_arm = next(arm for arm in engine if arm["label"] == pair["measured"])
        ttft = next(row for row in pair["rows"] if row["field"] == "ttft.p50")
        assert ttft["measured"] == engine_arm["outcomes"]["latency_us"]["ttft"]["p50"]


def test_calibrated_arm_is_fitted_out_of_sample_and_resimulates_byte_for_byte(fidelity, fidelity_defaults):
    record, directory = fidelity.record, fidelity.directory
    runs = []
    for entry in record["calibration"]["runs"]:
        data = (directory / entry["measured_run"]["path"]).read_bytes()
        measured = json.loads(data)
        # served the calibration workload, not the lab's: the prediction is out of sample
        assert [r["request_id"] for r in measured["workload"]["requests"]] == [
            r.request_id for r in LAB.calibration_workload.requests
        ]
        assert not {r.request_id for r in LAB.calibration_workload.requests} & {
            r.request_id for r in LAB.workload.requests
        }
        runs.append(read_measured_run(measured, hashlib.sha256(data).hexdigest()))
    assert len(runs) == 2  # one per scheduling policy the calibrated arms sweep
    fragment, _, _ = fit(runs)
    assert record["calibration"]["fragment"] == fragment
    calibrated = [arm for arm in record["arms"] if arm["system"]["compute_service"].get("model") == "calibrated"]
    assert len(calibrated) == 2
    for arm in calibrated:
        service = arm["system"]["compute_service"]
        assert service["prefill"] == fragment["compute_service"]["prefill"]
        assert service["decode"] == fragment["compute_service"]["decode"]
        batches = service["decode_batch_buckets"]
        assert batches == ([1] if "serialized" in arm["label"] else [1, 2, 4])  # the engine's plan for this arm
        document = json.loads((directory / record["recordings"][0]["computations"]["path"]).read_bytes())
        execution = resolve(LAB.arms()[record["arms"].index(arm)].execution, fidelity_defaults.execution)
        run = simulate_arm(execution, document, LAB.workload, LAB, record["calibration"]["fragment"])
        assert record_json(run) == (directory / arm["cache_run"]["path"]).read_bytes()


def test_an_edited_measured_run_is_refused(fidelity, tmp_path):
    directory, record = _copy(fidelity, tmp_path)
    name = record["arms"][_engine_arm(record)]["measured_run"]["path"]
    original = (directory / name).read_bytes()
    (directory / name).write_bytes(original.replace(b'"wall_us": ', b'"wall_us": 1', 1))
    with pytest.raises(ApiError) as caught:
        replay(directory / "record.json")
    assert caught.value.field == f"record.arms[{_engine_arm(record)}].measured_run"
    # The same edit with the hash and size updated: the work's wall time contradicts its start and end.
    measured = json.loads(original)
    measured["works"][0]["wall_us"] += 1000
    _rewrite(directory, record, name, measured)
    with pytest.raises(ApiError) as caught:
        replay(directory / "record.json")
    assert caught.value.field.endswith("works[0].wall_us")
    # Its end moved with it: the work is consistent, but the totals no longer derive from the works.
    measured["works"][0]["end_us"] += 1000
    _rewrite(directory, record, name, measured)
    with pytest.raises(ApiError) as caught:
        replay(directory / "record.json")
    assert caught.value.field.endswith("totals.compute_busy_us")


def test_measured_outcomes_edited_consistently_are_refused_where_they_derive(fidelity, tmp_path):
    directory, record = _copy(fidelity, tmp_path)
    i = _engine_arm(record)
    name = record["arms"][i]["measured_run"]["path"]
    measured = json.loads((directory / name).read_bytes())
    measured["totals"]["latency_us"]["ttft"]["p50"] -= 1  # a better figure, written everywhere it appears
    record["arms"][i]["outcomes"] = measured["totals"]
    _rewrite(directory, record, name, measured)
    with pytest.raises(ApiError) as caught:
        replay(directory / "record.json")
    assert caught.value.field == f"record.arms[{i}].measured_run.totals.latency_us"
    with pytest.raises(ApiError):
        check_measured_run(measured, "measured")


def test_an_edited_calibration_is_refused(fidelity, tmp_path):
    directory, record = _copy(fidelity, tmp_path)
    record["calibration"]["fragment"]["compute_service"]["decode"]["fixed_us"] += 1
    (directory / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    with pytest.raises(ApiError) as caught:
        replay(directory / "record.json")
    assert caught.value.field == "record.calibration.fragment"
    directory, record = _copy(fidelity, tmp_path / "second")
    del record["calibration"]["runs"][1]
    (directory / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    with pytest.raises(ApiError) as caught:
        replay(directory / "record.json")
    assert caught.value.field == "record.calibration.runs"
    directory, record = _copy(fidelity, tmp_path / "third")
    name = record["calibration"]["runs"][0]["measured_run"]["path"]
    measured = json.loads((directory / name).read_bytes())
    measured["model"]["checkpoint_sha256"] = "0" * 64  # a run of another model, its hash updated
    _rewrite(directory, record, name, measured)
    with pytest.raises(ApiError) as caught:
        replay(directory / "record.json")
    assert caught.value.field == "record.calibration.runs[0].measured_run.model"


def test_kvsim_only_records_keep_their_form(lab_run):
    """No runner or service control is written where the lab leaves them at their defaults."""
    record = lab_run.record
    assert "calibration" not in record
    for arm in record["arms"]:
        assert {s["control"] for s in arm["execution"]}.isdisjoint({"execution.runner", "compute_service.model"})
        assert "cache_run" in arm and "measured_run" not in arm
    assert "fidelity" not in summary(record) and all("source" not in row for row in summary(record)["arms"])


def _lab(edit):
    document = copy.deepcopy(LAB.to_json())
    edit(document)
    return document


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d.pop("calibration_workload"), "calibration_workload"),
        (lambda d: d["sweep"][1]["values"].pop(1), "calibration_workload"),
        (
            lambda d: d["sweep"][1]["values"].__setitem__(
                0, {"execution.runner": "engine", "compute_service.model": "calibrated"}
            ),
            "sweep",
        ),
        (lambda d: d["sweep"][1]["values"].append({"compute_service.model": "roofline"}), "sweep[1].values"),
        (lambda d: d["sweep"][1]["values"].append({"scheduling.policy": "serialized"}), "sweep[1].values[3]"),
        (lambda d: d["sweep"][1]["values"].append({}), "sweep[1].values[3]"),
        (lambda d: d["sweep"][1]["values"].append({"execution.runner": "gpu"}), "sweep[1].values[3].execution.runner"),
    ],
)
def test_lab_refuses_runner_settings_that_cannot_run(edit, field):
    with pytest.raises(ApiError) as caught:
        ExperimentDesign.from_json(_lab(edit))
    assert caught.value.field == field


def test_report_shows_measured_against_predicted_without_kvsim_timelines_for_engine_arms(fidelity, tmp_path):
    from experiments.html_report import write_report

    directory, record = _copy(fidelity, tmp_path)
    page = write_report(directory / "record.json", tmp_path / "report.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page).group(1))
    assert data["summary"]["fidelity"] == summary(record)["fidelity"]
    assert 'id="fidelity-section"' in page and "innerHTML" not in page
    engine = {i for i, arm in enumerate(record["arms"]) if "measured_run" in arm}
    assert all(data["events"][i] == [] for i in engine) and all(data["events"][i] for i in set(range(6)) - engine)
    assert page.count('alt="kvsim timeline') == 6 - len(engine)
    # Rendered: the measured-vs-predicted table of each pair and one plotted point per latency percentile and pair.
    dom = _chromium(tmp_path, "--dump-dom", (tmp_path / "report.html").as_uri())
    panel = re.search(r'<div id="fidelity-panel">(.*?)</section>', dom, re.S).group(1)
    assert panel.count("<table") == len(data["summary"]["fidelity"]) == 4
    latencies = [
        row
        for pair in data["summary"]["fidelity"]
        for row in pair["rows"]
        if not row["exact"] and row["field"] != "compute_busy_us" and row["measured"] and row["predicted"]
    ]
    assert len(latencies) > 12 and panel.count('<circle class="point"') == len(latencies) and "within 10%" in panel
