"""A crafted record cannot run script in the report (issue 13, report injection), and lab
replay refuses a record whose id, model binding or observations were edited (record integrity).

One tiny random-weight model runs one lab; a copy of its record is then poisoned: every
string replay cannot re-derive (lab name, question, contract, source titles; in the
observations token and candidate pieces, span reasons, layer and observation ids) carries `<script>`,
an `<img onerror>` breaking out of an attribute, `<!--` and `</script>`. Each payload
would mark the page's body if it ran. The page is rendered in headless Chromium; the
dumped DOM must show the payloads as text, no mark, and every panel drawn. A control page
that does use innerHTML shows that the mark would be seen.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.experiment_design import default_catalog
from experiments.experiment_execution import _dumps, _execution_id, model_bindings, replay, run_lab
from experiments.generation_defaults import DEFAULTS, GenerationDefaults, generation_defaults
from experiments.report import write_report
from jgpt.errors import ApiError
from tests.hostile import FUZZ, assert_refused, mutated_json, run_jgpt
from tests.test_experiments_run import _chromium

LAB = "prefix-reuse-multi-turn"
MARKED = r"<body[^>]* data-pwned="  # what a payload that ran leaves in the DOM
PAYLOAD = ('<script>document.body.setAttribute("data-pwned","script")</script>'
           '"><img src=x onerror="document.body.setAttribute(\'data-pwned\',\'img\')"><!--</script>\u2028')


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from jgpt.architecture import ModelArchitecture
    from jgpt.artifact import save_artifact
    from jgpt.tokenizer import Tokenizer
    from jgpt.weights import initialize

    architecture = ModelArchitecture(vocabulary=260, width=32, ffn=64, context=128, layers=2, heads=2)
    weights, provenance = initialize(architecture, seed=1)
    model = save_artifact(tmp_path_factory.mktemp("model") / "tiny", architecture, weights, provenance,
                          Tokenizer.bytes_only())
    document = json.loads(DEFAULTS.read_text())
    for setting in document["execution"]:
        if setting["control"] == "model.model_id":
            setting["value"] = str(model.path)
        if setting["control"] == "generation.max_new_tokens":
            setting["value"] = 4
    defaults = GenerationDefaults.from_json(document)
    return run_lab(default_catalog().lab(LAB), tmp_path_factory.mktemp("lab") / LAB, report=False, plots=False,
                   defaults=defaults)


def _poison(value, skip=("request_id", "run_id")):
    """Every string in `value` with the payload appended (keys named in `skip` left alone); equal strings stay equal."""
    if isinstance(value, str):
        return value + PAYLOAD
    if isinstance(value, list):
        return [_poison(item, skip) for item in value]
    if isinstance(value, dict):
        return {k: v if k in skip else _poison(v, skip) for k, v in value.items()}
    return value


def _rewrite(directory: Path, record: dict) -> Path:
    """Write `record` canonically with the identity replay re-derives."""
    from experiments.experiment_design import ExperimentDesign

    lab = ExperimentDesign.from_json(record["lab"], "lab")
    record["id"] = _execution_id(lab, record["arms"], record["recordings"], lab.workload or generation_defaults().workload)
    (directory / "record.json").write_bytes(_dumps(record))
    return directory / "record.json"


def _file(directory: Path, entry: dict, document) -> None:
    data = _dumps(document)
    (directory / entry["path"]).write_bytes(data)
    entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


@pytest.fixture(scope="module")
def poisoned(run, tmp_path_factory):
    directory = tmp_path_factory.mktemp("poisoned") / "run"
    shutil.copytree(run.directory, directory)
    record = json.loads((directory / "record.json").read_text())
    lab = record["lab"]
    for name in ("name", "question"):
        lab[name] += PAYLOAD
    lab["contract"] = _poison(lab["contract"])
    for source in lab["sources"]:
        source["title"] += PAYLOAD
    recording = record["recordings"][0]  # (its walkthrough is derived from the model: replay refuses an edit)
    _file(directory, recording["observations"], _poison(json.loads((directory / recording["observations"]["path"]).read_text())))
    return _rewrite(directory, record)


def test_report_injection_no_payload_runs_in_chromium(poisoned, tmp_path):
    page = write_report(poisoned, tmp_path / "page.html")
    text = page.read_text()
    opening = '<script type="application/json" id="data">'
    data = text[text.index(opening) + len(opening):].split("</script>")[0]
    assert "\\u003cscript\\u003edocument.body" in data and "\\u003c!--\\u003c/script\\u003e\\u2028" in data  # the payload is in it,
    assert not any(c in data for c in "<>&\u2028\u2029")  # escaped so that nothing can end or change the element
    assert "'unsafe-inline'" not in re.search(r"script-src[^;\"]*", text).group(0)
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert not re.search(MARKED, dom), "a payload ran"
    assert "document.body.setAttribute" in dom  # and it is on the page, as text
    assert dom.count("&lt;script&gt;document.body") >= 10
    candidates = re.search(r'<table id="candidates">(.*?)</table>', dom).group(1)
    assert candidates.count("<tr") == 1 + 5 and "&lt;img src=x onerror=" in candidates  # the panels still render
    assert re.search(r'<div id="inspection-error" role="alert"></div>', dom)
    assert "&lt;!--&lt;/script&gt;" in re.search(r'<div id="tokens-panel">(.*?)</section>', dom, re.S).group(1)
    assert len(re.findall(r'<canvas class="heatmap" data-head="\d+"', dom)) == 2


def test_report_injection_the_check_would_see_a_payload_that_ran(tmp_path):
    """Control: the same payload inserted with innerHTML under a permissive policy marks the body."""
    page = tmp_path / "unsafe.html"
    page.write_text(f"<!DOCTYPE html><html><body><div id=x></div><script>document.getElementById('x').innerHTML = "
                    f"{json.dumps(PAYLOAD).replace('<', chr(92) + 'u003c')};</script></body></html>")
    assert re.search(MARKED, _chromium(tmp_path, "--dump-dom", page.as_uri()))


def test_report_injection_refused_fragment_is_shown_as_text(poisoned, tmp_path):
    page = write_report(poisoned, tmp_path / "page.html")
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#surface=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert not re.search(MARKED, dom) and "<img src=x" not in dom
    assert "selection refused: unknown surface &lt;img src=x onerror=alert(1)&gt;" in dom


# --- record integrity ----------------------------------------------------------------------------------

def _edited(run, tmp_path, change) -> Path:
    directory = tmp_path / "edited"
    shutil.copytree(run.directory, directory)
    record = json.loads((directory / "record.json").read_text())
    change(directory, record)
    (directory / "record.json").write_bytes(_dumps(record))
    return directory / "record.json"


def test_record_integrity_an_edited_id_is_refused(run, tmp_path):
    path = _edited(run, tmp_path, lambda d, r: r.update(id="lab-0123456789abcdef"))
    with pytest.raises(ApiError) as error:
        replay(path)
    assert error.value.field == "record.id"
    assert_refused(["lab", "replay", path], inputs=[path], watch=[path.parent], field="record.id")


def test_record_integrity_an_edited_model_binding_is_refused(run, tmp_path):
    def claim_another_model(directory, record):
        record["bindings"]["models"][0]["checkpoint_sha256"] = "f" * 64
    with pytest.raises(ApiError) as error:
        replay(_edited(run, tmp_path / "bindings", claim_another_model))
    assert error.value.field == "record.bindings"

    def claim_everywhere(directory, record):  # binding and recording agree, the computations do not
        for model in (record["bindings"]["models"][0], record["recordings"][0]["model"]):
            model["checkpoint_sha256"] = "f" * 64
    with pytest.raises(ApiError) as error:
        replay(_edited(run, tmp_path / "everywhere", claim_everywhere))
    assert error.value.field == "record.recordings[0].model"


def test_record_integrity_model_identity_is_checked_against_the_artifact(run, tmp_path):
    record = replay(run.directory / "record.json")
    assert model_bindings(record) == [f"{record['bindings']['models'][0]['model_id']}: checkpoint_sha256 and "
                                      f"tokenizer_sha256 match {record['bindings']['models'][0]['model_id']}/manifest.json"]
    moved = json.loads(json.dumps(record))
    moved["bindings"]["models"][0]["model_id"] = str(tmp_path / "gone")
    assert model_bindings(moved)[0].endswith("not on this machine; its identity is not checked")
    forged = json.loads(json.dumps(record))
    forged["bindings"]["models"][0]["tokenizer_sha256"] = "e" * 64
    with pytest.raises(ApiError) as error:
        model_bindings(forged)
    assert error.value.field == "record.bindings.models[0].tokenizer_sha256"


def test_record_integrity_an_edited_observation_is_refused(run, tmp_path):
    def change_token(directory, record):
        entry = record["recordings"][0]["observations"]
        observations = json.loads((directory / entry["path"]).read_text())
        observations["requests"][0]["tokens"][1]["id"] += 1
        _file(directory, entry, observations)
    with pytest.raises(ApiError) as error:
        replay(_edited(run, tmp_path / "token", change_token))
    assert error.value.field == "record.recordings[0].observations.requests[0].tokens"

    def change_prediction(directory, record):
        entry = record["recordings"][0]["observations"]
        observations = json.loads((directory / entry["path"]).read_text())
        observations["requests"][0]["predictions"][0]["next_id"] += 1
        _file(directory, entry, observations)
    with pytest.raises(ApiError) as error:
        replay(_edited(run, tmp_path / "prediction", change_prediction))
    assert error.value.field == "record.recordings[0].observations.requests[0].predictions"

    def change_without_rehash(directory, record):
        path = directory / record["recordings"][0]["observations"]["path"]
        path.write_bytes(path.read_bytes().replace(b'"id": 2', b'"id": 3', 1))
    with pytest.raises(ApiError) as error:
        replay(_edited(run, tmp_path / "unhashed", change_without_rehash))
    assert error.value.field == "record.recordings[0].observations"


def test_record_integrity_edited_provenance_labels_and_walkthrough_are_refused(run, tmp_path):
    for name, change, field in [
        ("provenance", lambda d, r: r["provenance"].update(python="0.0"), "record.provenance"),
        ("label", lambda d, r: r["arms"][0].update(label="better"), "record.arms.label"),
        ("walkthrough", lambda d, r: r["recordings"][0]["walkthrough"]["stages"][0].update(label="x"),
         "record.recordings[0].walkthrough"),
    ]:
        with pytest.raises(ApiError) as error:
            replay(_edited(run, tmp_path / name, change))
        assert error.value.field == field


# --- hostile records ----------------------------------------------------------------------------------

def _canonical(document: bytes) -> bytes:
    """A mutated record as `lab run` would have written it, when it still is finite JSON; else as it is."""
    try:
        return _dumps(json.loads(document))
    except (ValueError, RecursionError):
        return document


@FUZZ
@given(data=st.data())
def test_record_integrity_any_hostile_record_is_refused_naming_a_record_field(run, tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("hostile") / "run"
    shutil.copytree(run.directory, directory)
    record = json.loads((directory / "record.json").read_text())
    mutated = _canonical(data.draw(mutated_json(record)))
    (directory / "record.json").write_bytes(mutated)
    code, _, err = run_jgpt(["report", directory / "record.json", "--out", directory.parent / "page.html"])
    if code == 0:  # only what replay cannot re-derive may change: the lab's contract, sources or wording
        accepted = json.loads(mutated)
        assert {k: v for k, v in accepted.items() if k != "lab"} == {k: v for k, v in record.items() if k != "lab"}
        return
    line = assert_refused(["report", directory / "record.json", "--out", directory.parent / "page.html"],
                          inputs=list(directory.iterdir()), watch=[directory.parent])
    assert "error: record" in line, line


@FUZZ
@given(data=st.data())
def test_record_integrity_any_hostile_observations_file_is_refused_naming_it(run, tmp_path_factory, data):
    """Observations rewritten with a matching hash in the record: refused naming them, or still drawable."""
    directory = tmp_path_factory.mktemp("observations") / "run"
    shutil.copytree(run.directory, directory)
    record = json.loads((directory / "record.json").read_text())
    entry = record["recordings"][0]["observations"]
    observations = json.loads((directory / entry["path"]).read_text())
    observations["requests"] = observations["requests"][:1]  # a smaller document: more mutations hit what matters
    mutated = _canonical(data.draw(mutated_json(observations)))
    (directory / entry["path"]).write_bytes(mutated)
    entry.update(sha256=hashlib.sha256(mutated).hexdigest(), bytes=len(mutated))
    (directory / "record.json").write_bytes(_dumps(record))
    try:
        replay(directory / "record.json")
    except ApiError as error:
        assert error.field.startswith("record.recordings[0].observations"), error
    else:  # what write_report builds from it must still be a valid InspectionState
        from experiments.inspection import Inspectable

        computations = json.loads((directory / record["recordings"][0]["computations"]["path"]).read_text())
        works = {r["request_id"]: r["computations"] for r in computations["requests"]}
        Inspectable(json.loads(mutated), record["recordings"][0]["walkthrough"], works).initial()
