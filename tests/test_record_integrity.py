"""lab replay refuses a record whose id, model binding, observations or anything else it can
re-derive was edited (issue 13, record integrity), and any hostile record or observations
file makes `jgpt report` refuse naming a record field, with nothing written.

All start from one tiny lab run (tests/conftest.py) copied and edited per test.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.experiment_replay import replay
from experiments.record_files import dumps
from experiments.record_integrity import model_bindings
from jgpt.foundation.errors import ApiError
from tests.hostile import FUZZ, assert_refused, mutated_json, run_jgpt
from tests.test_report_injection import rewrite_entry


def _edited(lab_run, tmp_path, change) -> Path:
    directory = tmp_path / "edited"
    shutil.copytree(lab_run.directory, directory)
    record = json.loads((directory / "record.json").read_text())
    change(directory, record)
    (directory / "record.json").write_bytes(dumps(record))
    return directory / "record.json"


def test_record_integrity_an_edited_id_is_refused(lab_run, tmp_path):
    path = _edited(lab_run, tmp_path, lambda d, r: r.update(id="lab-0123456789abcdef"))
    with pytest.raises(ApiError) as error:
        replay(path)
    assert error.value.field == "record.id"
    assert_refused(["lab", "replay", path], inputs=[path], watch=[path.parent], field="record.id")


@pytest.mark.parametrize("field", ["", "note"])
def test_record_integrity_a_field_no_run_writes_is_refused(lab_run, tmp_path, field):
    """Found by the fuzz test below: a top-level `"": null` replayed, though nothing derives it."""
    path = _edited(lab_run, tmp_path, lambda d, r: r.update({field: None}))
    with pytest.raises(ApiError) as error:
        replay(path)
    assert error.value.field == "record" and repr(field) in error.value.reason


def test_record_integrity_an_edited_model_binding_is_refused(lab_run, tmp_path):
    def claim_another_model(directory, record):
        record["bindings"]["models"][0]["checkpoint_sha256"] = "f" * 64

    with pytest.raises(ApiError) as error:
        replay(_edited(lab_run, tmp_path / "bindings", claim_another_model))
    assert error.value.field == "record.bindings"

    def claim_everywhere(directory, record):  # binding and recording agree, the computations do not
        for model in (record["bindings"]["models"][0], record["recordings"][0]["model"]):
            model["checkpoint_sha256"] = "f" * 64

    with pytest.raises(ApiError) as error:
        replay(_edited(lab_run, tmp_path / "everywhere", claim_everywhere))
    assert error.value.field == "record.recordings[0].model"


def test_record_integrity_model_identity_is_checked_against_the_artifact(lab_run, tmp_path):
    record = replay(lab_run.directory / "record.json")
    assert model_bindings(record) == [
        f"{record['bindings']['models'][0]['model_id']}: checkpoint_sha256 and "
        f"tokenizer_sha256 match {record['bindings']['models'][0]['model_id']}/manifest.json"
    ]
    moved = json.loads(json.dumps(record))
    moved["bindings"]["models"][0]["model_id"] = str(tmp_path / "gone")
    assert model_bindings(moved)[0].endswith("not on this machine; its identity is not checked")
    forged = json.loads(json.dumps(record))
    forged["bindings"]["models"][0]["tokenizer_sha256"] = "e" * 64
    with pytest.raises(ApiError) as error:
        model_bindings(forged)
    assert error.value.field == "record.bindings.models[0].tokenizer_sha256"


def test_record_integrity_an_edited_observation_is_refused(lab_run, tmp_path):
    def change_token(directory, record):
        entry = record["recordings"][0]["observations"]
        observations = json.loads((directory / entry["path"]).read_text())
        observations["requests"][0]["tokens"][1]["id"] += 1
        rewrite_entry(directory, entry, observations)

    with pytest.raises(ApiError) as error:
        replay(_edited(lab_run, tmp_path / "token", change_token))
    assert error.value.field == "record.recordings[0].observations.requests[0].tokens"

    def change_prediction(directory, record):
        entry = record["recordings"][0]["observations"]
        observations = json.loads((directory / entry["path"]).read_text())
        observations["requests"][0]["predictions"][0]["next_id"] += 1
        rewrite_entry(directory, entry, observations)

    with pytest.raises(ApiError) as error:
        replay(_edited(lab_run, tmp_path / "prediction", change_prediction))
    assert error.value.field == "record.recordings[0].observations.requests[0].predictions"

    def change_without_rehash(directory, record):
        path = directory / record["recordings"][0]["observations"]["path"]
        path.write_bytes(path.read_bytes().replace(b'"id": 2', b'"id": 3', 1))

    with pytest.raises(ApiError) as error:
        replay(_edited(lab_run, tmp_path / "unhashed", change_without_rehash))
    assert error.value.field == "record.recordings[0].observations"


def test_record_integrity_edited_provenance_labels_and_walkthrough_are_refused(lab_run, tmp_path):
    for name, change, field in [
        ("provenance", lambda d, r: r["provenance"].update(python="0.0"), "record.provenance"),
        ("label", lambda d, r: r["arms"][0].update(label="better"), "record.arms.label"),
        (
            "walkthrough",
            lambda d, r: r["recordings"][0]["walkthrough"]["stages"][0].update(label="x"),
            "record.recordings[0].walkthrough",
        ),
    ]:
        with pytest.raises(ApiError) as error:
            replay(_edited(lab_run, tmp_path / name, change))
        assert error.value.field == field


def test_record_integrity_a_file_entry_with_a_key_removed_or_added_is_refused(lab_run, tmp_path):
    """Found by the fuzz test in CI: an arm's cache_run entry without its id was accepted."""
    for name, change, field in [
        ("no-id", lambda d, r: r["arms"][0]["cache_run"].pop("id"), "record.arms[0].cache_run"),
        (
            "other-id",
            lambda d, r: r["arms"][0]["cache_run"].update(id="kv-0123456789abcdef"),
            "record.arms[0].cache_run",
        ),
        ("extra", lambda d, r: r["recordings"][0]["computations"].update(id="x"), "record.recordings[0].computations"),
    ]:
        with pytest.raises(ApiError) as error:
            replay(_edited(lab_run, tmp_path / name, change))
        assert error.value.field == field


# --- hostile records ----------------------------------------------------------------------------------


def _canonical(document: bytes) -> bytes:
    """A mutated record as `lab run` would have written it, when it still is finite JSON; else as it is."""
    try:
        return dumps(json.loads(document))
    except (ValueError, RecursionError):
        return document


@FUZZ
@given(data=st.data())
def test_record_integrity_any_hostile_record_is_refused_naming_a_record_field(lab_run, tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("hostile") / "run"
    shutil.copytree(lab_run.directory, directory)
    record = json.loads((directory / "record.json").read_text())
    mutated = _canonical(data.draw(mutated_json(record)))
    (directory / "record.json").write_bytes(mutated)
    code, _, err = run_jgpt(["report", directory / "record.json", "--out", directory.parent / "page.html"])
    if code == 0:  # only what replay cannot re-derive may change: the lab's contract, sources or wording
        accepted = json.loads(mutated)
        assert {k: v for k, v in accepted.items() if k != "lab"} == {k: v for k, v in record.items() if k != "lab"}
        return
    line = assert_refused(
        ["report", directory / "record.json", "--out", directory.parent / "page.html"],
        inputs=list(directory.iterdir()),
        watch=[directory.parent],
    )
    assert "error: record" in line, line


@FUZZ
@given(data=st.data())
def test_record_integrity_any_hostile_observations_file_is_refused_naming_it(lab_run, tmp_path_factory, data):
    """Observations rewritten with a matching hash in the record: refused naming them, or still drawable."""
    directory = tmp_path_factory.mktemp("observations") / "run"
    shutil.copytree(lab_run.directory, directory)
    record = json.loads((directory / "record.json").read_text())
    entry = record["recordings"][0]["observations"]
    observations = json.loads((directory / entry["path"]).read_text())
    observations["requests"] = observations["requests"][:1]  # a smaller document: more mutations hit what matters
    mutated = _canonical(data.draw(mutated_json(observations)))
    (directory / entry["path"]).write_bytes(mutated)
    entry.update(sha256=hashlib.sha256(mutated).hexdigest(), bytes=len(mutated))
    (directory / "record.json").write_bytes(dumps(record))
    try:
        replay(directory / "record.json")
    except ApiError as error:
        assert error.field.startswith("record.recordings[0].observations"), error
    else:  # what write_report builds from it must still be a valid InspectionState
        from experiments.inspection import Inspectable

        computations = json.loads((directory / record["recordings"][0]["computations"]["path"]).read_text())
        works = {r["request_id"]: r["computations"] for r in computations["requests"]}
        Inspectable(json.loads(mutated), record["recordings"][0]["walkthrough"], works).initial()


@pytest.mark.parametrize("request_id", [[], {}, 7, None])
def test_record_integrity_an_inspected_request_id_that_is_not_a_string_is_refused(lab_run, tmp_path, request_id):
    """Found by the fuzz test above in CI: a list as request_id once raised TypeError (unhashable)."""
    directory = tmp_path / "run"
    shutil.copytree(lab_run.directory, directory)
    record = json.loads((directory / "record.json").read_text())
    entry = record["recordings"][0]["observations"]
    observations = json.loads((directory / entry["path"]).read_text())
    observations["requests"][0]["request_id"] = request_id
    mutated = dumps(observations)
    (directory / entry["path"]).write_bytes(mutated)
    entry.update(sha256=hashlib.sha256(mutated).hexdigest(), bytes=len(mutated))
    (directory / "record.json").write_bytes(dumps(record))
    with pytest.raises(ApiError) as error:
        replay(directory / "record.json")
    assert error.value.field == "record.recordings[0].observations.requests[0]", error.value


def test_record_integrity_file_entries_are_bounded_and_sized_before_reading(lab_run, tmp_path):
    from experiments.record_files import RECORD_FILE_LIMIT

    for name, bytes_ in (("huge", RECORD_FILE_LIMIT + 1), ("short", 10)):
        path = _edited(lab_run, tmp_path / name, lambda d, r: r["recordings"][0]["computations"].update(bytes=bytes_))
        with pytest.raises(ApiError) as error:
            replay(path)
        assert error.value.field == "record.recordings[0].computations"
        assert ("at most" if name == "huge" else "size") in error.value.reason
