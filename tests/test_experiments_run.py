"""Labs run end to end (model -> recorded computations -> kvsim -> record), replay byte for byte,
and their report renders in headless Chromium.

One module-scoped run of every runnable lab on a tiny random-weight model keeps the
JAX compile cost to one process; labs sharing a workload share one recording.
"""

import html
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from experiments.experiment_design import default_catalog
from experiments.experiment_execution import run_lab
from experiments.experiment_replay import replay
from experiments.html_report import write_report
from experiments.inspection import Inspectable
from jgpt.foundation.errors import ApiError

from conftest import lab_defaults, tiny_model

CATALOG = default_catalog()
RUNNABLE = [lab for lab in CATALOG.experiments if not lab.planned and not lab.served]  # served: test_experiments_engine
REPORTED = "prefix-reuse-multi-turn"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("model"), seed=0)


@pytest.fixture(scope="module")
def defaults(model):
    return lab_defaults(model, max_new_tokens=8)


@pytest.fixture(scope="module")
def runs(defaults, tmp_path_factory):
    out = tmp_path_factory.mktemp("labs")
    recordings = {}
    return {
        lab.id: run_lab(
            lab,
            out / lab.id,
            report=lab.id == REPORTED,
            plots=lab.id == REPORTED,
            defaults=defaults,
            recordings=recordings,
        )
        for lab in RUNNABLE
    }


@pytest.mark.parametrize("lab", RUNNABLE, ids=lambda lab: lab.id)
def test_every_runnable_lab_runs_and_replays_byte_for_byte(runs, lab, model):
    run = runs[lab.id]
    record = run.record
    assert record == replay(run.directory / "record.json")
    assert len(record["arms"]) == len(lab.arms())
    assert [arm["label"] for arm in record["arms"]] == [arm.label for arm in lab.arms()]
    assert record["bindings"]["models"][0]["checkpoint_sha256"] == model.checkpoint_sha256
    workload = lab.workload or CATALOG.experiments[0].workload
    arrivals = [r["request_id"] for r in record["bindings"]["workload"]["requests"]]
    if lab.workload is not None:
        assert arrivals == [r.request_id for r in workload.requests]
    for arm in record["arms"]:
        cache_run = json.loads((run.directory / arm["cache_run"]["path"]).read_bytes())
        assert cache_run["declaration"]["ontology_binding"] == lab.ontology_binding.to_json()
        settings = {s["control"]: s["value"] for s in arm["execution"]}
        assert cache_run["declaration"]["system"]["kv_cache"]["device_kv_bytes"] == settings["kv_cache.device_kv_bytes"]
        assert arm["outcomes"]["arrived"] == len(arrivals)
    summary = json.loads((run.directory / "summary.json").read_text())
    assert summary["record"] == record["id"] and len(summary["arms"]) == len(record["arms"])


def test_sweep_arms_differ_where_the_mechanism_should(runs):
    prefix = {arm["label"]: arm["outcomes"] for arm in runs["prefix-reuse-multi-turn"].record["arms"]}
    none, lru = prefix["kv_cache.retention_policy=none"], prefix["kv_cache.retention_policy=lru"]
    assert none["reused_positions"] == 0 and lru["reused_positions"] > 0
    assert lru["compute_busy_us"] < none["compute_busy_us"]
    host = {arm["label"]: arm["outcomes"] for arm in runs["host-tier-vs-recompute"].record["arms"]}
    assert all(o["reloads"] == 0 for label, o in host.items() if "host_kv_bytes=0," in label)
    slots = [arm["outcomes"]["latency_us"]["queueing"]["p90"] for arm in runs["admission-slots-latency"].record["arms"]]
    assert slots == sorted(slots, reverse=True) and slots[0] > slots[-1]
    cancelled = [arm["outcomes"]["cancelled"] for arm in runs["cancellation-under-load"].record["arms"]]
    assert all(n > 0 for n in cancelled)


def test_labs_sharing_a_workload_share_one_recording(runs):
    host = runs["host-tier-vs-recompute"].directory / "computations-0.json"
    budget = runs["device-budget-sweep"].directory / "computations-0.json"
    assert host.read_bytes() == budget.read_bytes()


def test_replay_detects_a_changed_cache_run_or_record(runs, tmp_path):
    source = runs["admission-slots-latency"].directory
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    path = copy / "cache-run-1.json"
    path.write_bytes(path.read_bytes().replace(b'"arrival"', b'"arrivaL"', 1))
    with pytest.raises(ApiError) as caught:
        replay(copy / "record.json")
    assert caught.value.field == "record.arms[1].cache_run"
    shutil.copytree(source, tmp_path / "again")
    record = json.loads((tmp_path / "again" / "record.json").read_text())
    record["arms"][0]["outcomes"]["completed"] += 1
    (tmp_path / "again" / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    with pytest.raises(ApiError) as caught:
        replay(tmp_path / "again" / "record.json")
    assert caught.value.field == "record.arms[0].outcomes"


def _inspectable(run):
    recording = run.record["recordings"][0]
    observations = json.loads((run.directory / recording["observations"]["path"]).read_bytes())
    computations = json.loads((run.directory / recording["computations"]["path"]).read_bytes())
    return Inspectable(
        observations, recording["walkthrough"], {r["request_id"]: r["computations"] for r in computations["requests"]}
    ), computations


def test_recorded_predictions_agree_with_the_greedy_outputs(runs):
    inspectable, computations = _inspectable(runs[REPORTED])
    outputs = {r["request_id"]: r["output_ids"] for r in computations["requests"]}
    for request in inspectable.observations["requests"]:
        n = request["prompt_length"]
        assert [t["id"] for t in request["tokens"][n:]] == outputs[request["request_id"]]
        for p in range(n - 1, len(request["tokens"]) - 1):
            prediction = request["predictions"][p]
            # greedy selection: the recorded next id is the observed pass's top candidate
            assert prediction["candidates"][0]["id"] == prediction["next_id"] == request["tokens"][p + 1]["id"]
        for observation in request["attention"]:
            for q, heads in enumerate(observation["values"]):
                assert np.allclose([sum(row) for row in heads], 1.0, atol=1e-2)
                assert all(len(row) == q + 1 for row in heads)


def test_inspection_state_selects_recorded_values_and_rejects_bad_selections(runs):
    inspectable, _ = _inspectable(runs[REPORTED])
    state = inspectable.initial()
    first = inspectable.observations["requests"][0]
    assert state.position == first["prompt_length"] - 1 and state.surface == "model"
    moved = inspectable.select(state, position=3, surface="request")
    assert inspectable.shown(moved)["prediction"] == first["predictions"][3]
    assert inspectable.shown(moved)["token"] == first["tokens"][3]
    other = inspectable.observations["requests"][-1]
    switched = inspectable.select(moved, run_id=f"{inspectable.observations['run_id']}/{other['request_id']}")
    assert switched.position == other["prompt_length"] - 1
    for changes, field in [
        ({"position": len(first["tokens"]) - 1}, "position"),
        ({"position": -1}, "position"),
        ({"surface": "screen"}, "surface"),
        ({"observation_id": "nope"}, "observation_id"),
        ({"observation_id": None}, "observation_id"),  # the model surface needs one
        ({"architecture_step": 99}, "architecture_step"),
        ({"computation_index": 10_000}, "computation_index"),
        ({"run_id": "nope"}, "run_id"),
        ({"colour": "red"}, "colour"),
    ]:
        with pytest.raises(ApiError) as caught:
            inspectable.select(state, **changes)
        assert caught.value.field == field


def test_cli_lists_shows_and_refuses_planned_labs(tmp_path):
    run = lambda *args: subprocess.run([sys.executable, "-m", "jgpt", *args], capture_output=True, text=True)  # noqa: E731
    listed = run("lab", "list")
    assert listed.returncode == 0
    assert all(lab.id in listed.stdout for lab in CATALOG.experiments)
    shown = run("lab", "show", "host-tier-vs-recompute")
    assert "transfer.link_bytes_per_us in [30, 300, 3000]" in shown.stdout
    planned = run("lab", "run", "prefill-decode-disaggregation", "--out", str(tmp_path / "out"))
    assert planned.returncode == 2 and "Traceback" not in planned.stderr
    assert "resource_graph.placement" in planned.stderr
    assert not (tmp_path / "out").exists()
    unknown = run("lab", "show", "no-such-lab")
    assert unknown.returncode == 2 and "no-such-lab" in unknown.stderr


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _chromium(tmp_path, *args):
    binary = shutil.which("chromium")
    assert binary, "Debian's chromium package is required for the report test (apt-get install chromium)"
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    result = subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
    )
    return result.stdout


def test_report_renders_in_headless_chromium(runs, tmp_path):
    run = runs[REPORTED]
    page = run.directory / "report.html"
    text = page.read_text()
    # The SVG namespace URI names a namespace for createElementNS; nothing is fetched from it.
    unfetched = text.replace('href="http', "").replace("'http://www.w3.org/2000/svg'", "")
    assert "http://" not in unfetched and "<link" not in text and ' src="http' not in text
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#position=4&surface=request")
    for section in (
        "overview",
        "arms",
        "architecture",
        "tokens",
        "prediction",
        "attention",
        "computations",
        "kvsim",
        "map",
        "contract",
    ):
        assert f'id="{section}-section"' in dom
    state = json.loads(html.unescape(re.search(r'<div id="state">InspectionState (.*?)</div>', dom).group(1)))
    assert state["position"] == 4 and state["surface"] == "request"  # the state came from the URL fragment
    assert re.search(r'<div id="inspection-error" role="alert"></div>', dom)  # and was accepted
    candidates = re.search(r'<table id="candidates">(.*?)</table>', dom).group(1)
    assert candidates.count("<tr") == 1 + 5  # header and the top five, rendered by the page's script
    inspected = json.loads((run.directory / run.record["recordings"][0]["observations"]["path"]).read_text())
    heads = inspected["requests"][0]["attention"][0]["shape"][1]
    assert len(re.findall(r'<canvas class="heatmap" data-head="\d+"', dom)) == heads
    assert re.search(r"<p>after position 4 \(", dom)
    events = re.search(r'<table id="events">(.*?)</table>', dom).group(1)
    assert '<td class="l">arrival</td>' in events and '<td class="l">compute_end</td>' in events
    refused = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#position=100000")
    assert re.search(r'role="alert">selection refused: position must be 0\.\.\d+</div>', refused)
    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_report_refuses_a_record_that_does_not_replay(runs, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(runs["cancellation-under-load"].directory, copy)
    (copy / "cache-run-0.json").write_text("{}")
    with pytest.raises(ApiError):
        write_report(copy / "record.json", tmp_path / "report.html")
    assert not (tmp_path / "report.html").exists()


def test_replay_and_report_commands(runs, tmp_path):
    directory = runs["decode-compute-vs-memory-bound"].directory
    jgpt = lambda *args: subprocess.run([sys.executable, "-m", "jgpt", *args], capture_output=True, text=True)  # noqa: E731
    replayed = jgpt("lab", "replay", str(directory / "record.json"))
    assert replayed.returncode == 0 and "4 arms replayed byte for byte" in replayed.stdout
    shutil.copytree(runs[REPORTED].directory, tmp_path / "run", dirs_exist_ok=True)
    written = jgpt("report", str(tmp_path / "run" / "record.json"), "--out", str(tmp_path / "page.html"))
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "page.html").read_bytes() == (runs[REPORTED].directory / "report.html").read_bytes()
    missing = jgpt("report", str(tmp_path / "none.json"), "--out", str(tmp_path / "x.html"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and not (tmp_path / "x.html").exists()


def test_report_of_a_record_run_without_plots_draws_them_for_the_page_only(runs, tmp_path):
    directory = runs["admission-slots-latency"].directory
    before = sorted(p.name for p in directory.iterdir())
    page = write_report(directory / "record.json", tmp_path / "page.html")
    assert sorted(p.name for p in directory.iterdir()) == before
    assert page.read_text().count("data:image/png;base64,") == 2 + len(runs["admission-slots-latency"].record["arms"])


def test_run_refuses_a_directory_that_is_not_a_lab_run(tmp_path, defaults):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ApiError) as caught:
        run_lab(CATALOG.lab("admission-slots-latency"), tmp_path, defaults=defaults)
    assert caught.value.field == "out"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
