"""`jgpt schema`: the JSON Schemas generated from the readers' descriptions hold for jgpt's own documents.

Every example document in the repository validates against its schema with `jsonschema`
(an implementation independent of ours), and so do documents jgpt writes (a kvsim record,
a measured run and the recorded computations in it); a bad document is refused by the
schema and by jgpt's reader at the same field.
"""

from __future__ import annotations

import copy
import fnmatch
import json
from pathlib import Path

import jsonschema
import pytest

from jgpt.cli import main as cli
from jgpt.cli.schema import SCHEMAS, schema
from jgpt.foundation.errors import ApiError

REPOSITORY = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"

# Every JSON document under these folders, and the schema it is an example of.
EXAMPLES = {
    "tests/data/kvsim_worked_example.json": "kvsim-input",
    "tests/data/engine_system.json": "kvsim-system",
    "tests/data/engine_workload.json": "workload",
    **{str(p.relative_to(REPOSITORY)): "lab" for p in sorted((REPOSITORY / "experiments/labs").glob("*.json"))},
}
# Documents with no schema yet (patterns): read by code that has no description, or by no code at all.
WITHOUT_SCHEMA = {
    "checkpoints/catalog.json": "ModelCatalog: jgpt.artifacts.catalog reads it with its own checks",
    "checkpoints/*/manifest.json": "artifact manifest: jgpt.artifacts.artifact reads it with its own checks",
    "checkpoints/*/tokenizer.json": "a Hugging Face tokenizer.json (its format is the tokenizers library's)",
    "experiments/evidence/*.json": "lab evidence summary: written for people, read by no code",
}
FOLDERS = ("tests/data", "experiments/evidence", "experiments/labs", "checkpoints")


def validator(name: str) -> jsonschema.Draft202012Validator:
    document = schema(name)
    jsonschema.Draft202012Validator.check_schema(document)
    return jsonschema.Draft202012Validator(document)


def faults(name: str, document) -> set[str]:
    """The dotted paths where the schema finds faults (errors inside anyOf/oneOf included)."""
    found, errors = set(), list(validator(name).iter_errors(document))
    while errors:
        error = errors.pop()
        found.add("".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path))
        errors.extend(error.context or ())
    return found


def test_every_schema_is_a_valid_draft_2020_12_schema():
    for name in SCHEMAS:
        assert schema(name)["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        validator(name)


def test_every_json_document_in_the_repository_is_an_example_of_a_schema_or_listed_without_one():
    found = {str(p.relative_to(REPOSITORY)) for folder in FOLDERS for p in (REPOSITORY / folder).rglob("*.json")}
    unlisted = {p for p in found - set(EXAMPLES) if not any(fnmatch.fnmatch(p, rule) for rule in WITHOUT_SCHEMA)}
    assert unlisted == set()
    assert set(EXAMPLES) <= found


@pytest.mark.parametrize("path, name", sorted(EXAMPLES.items()))
def test_example_documents_validate(path, name):
    assert faults(name, json.loads((REPOSITORY / path).read_text())) == set()


def test_the_inline_recorded_computations_of_the_worked_example_validate():
    document = json.loads((DATA / "kvsim_worked_example.json").read_text())["computations"]
    assert faults("recorded-computations", document) == set()


def test_a_kvsim_record_validates(tmp_path):
    out = tmp_path / "record.json"
    assert cli.main(["kvsim", "run", str(DATA / "kvsim_worked_example.json"), "--out", str(out)]) == 0
    assert faults("kvsim-record", json.loads(out.read_text())) == set()


def test_a_measured_run_and_its_recorded_computations_validate(tmp_path):
    from conftest import tiny_model

    # Two short requests, one at a time: few programs to compile.
    system = json.loads((DATA / "engine_system.json").read_text())
    system["scheduling"] = {"max_active_requests": 1, "policy": "serialized"}
    workload = {"kind": "two", "requests": [
        {"request_id": r, "arrival_us": 0, "request": {"text": "add 1+2", "generation": {"max_new_tokens": 2}}}
        for r in ("a", "b")]}  # fmt: skip
    (tmp_path / "system.json").write_text(json.dumps(system))
    (tmp_path / "workload.json").write_text(json.dumps(workload))
    model, out = tiny_model(tmp_path, seed=3), tmp_path / "measured.json"
    code = cli.main(["serve", str(tmp_path / "workload.json"), "--system", str(tmp_path / "system.json"),
                     "--model", str(model.path), "--out", str(out), "--as-fast-as-possible"])  # fmt: skip
    assert code == 0
    document = json.loads(out.read_text())
    assert faults("measured-run", document) == set()
    assert faults("recorded-computations", document["computations"]) == set()
    document["works"][0]["wall_us"] = -1
    assert ".works[0].wall_us" in faults("measured-run", document)


def _relative(read, prefix):
    """`read` with its error fields relative to the document (readers name the file or the document)."""

    def reader(tmp_path, document):
        try:
            return read(tmp_path, document)
        except ApiError as error:
            raise ApiError(error.field.removeprefix(prefix(document)), error.reason) from None

    return reader


def _kvsim_input(tmp_path, document):
    from kvsim.inputs import load_input

    path = tmp_path / "input.json"
    path.write_text(json.dumps(document))
    return load_input(path)


def _lab(tmp_path, document):
    from experiments.experiment_design import read_lab

    path = tmp_path / f"{document['id']}.json"
    path.write_text(json.dumps(document))
    return read_lab(path)


def _workload(tmp_path, document):
    from inference.recorded_computations import read_workload
    from jgpt.tokenizers.tokenizer import Tokenizer

    return read_workload(document, Tokenizer.bytes_only())


_kvsim_input = _relative(_kvsim_input, lambda d: "input.")
_lab = _relative(_lab, lambda d: f"{d['id']}.json: ")
_workload = _relative(_workload, lambda d: "workload.")


WORKED = "tests/data/kvsim_worked_example.json"
LAB = "experiments/labs/device-budget-sweep.json"


@pytest.mark.parametrize(
    "path, name, read, change, field",
    [
        (WORKED, "kvsim-input", _kvsim_input, lambda d: d["system"]["kv_cache"].update(device_kv_bytes=True),
         "system.kv_cache.device_kv_bytes"),
        (WORKED, "kvsim-input", _kvsim_input, lambda d: d["system"]["scheduling"].update(policy="fifo"),
         "system.scheduling.policy"),
        (WORKED, "kvsim-input", _kvsim_input, lambda d: d["computations"]["requests"][1].update(max_new_tokens=0),
         "computations.requests[1].max_new_tokens"),
        (WORKED, "kvsim-input", _kvsim_input, lambda d: d.update(workload={"kind": "w", "requests": [{"request_id": 3,
         "arrival_us": 0}]}), "workload.requests[0].request_id"),
        (LAB, "lab", _lab, lambda d: d["sources"][0].update(url="http://example.org"), "sources[0].url"),
        (LAB, "lab", _lab, lambda d: d["settings"][0].update(value=-1), "settings[0].value"),
        (LAB, "lab", _lab, lambda d: d["evidence"].append("../outside.json"), "evidence[1]"),
        (LAB, "lab", _lab, lambda d: d["workload"]["conversations"][0].update(turn_gap_us=1.5),
         "workload.conversations[0].turn_gap_us"),
        ("tests/data/engine_workload.json", "workload", _workload, lambda d: d["requests"][0].update(arrival_us=-1),
         "requests[0].arrival_us"),
        ("tests/data/engine_workload.json", "workload", _workload, lambda d: d["requests"][0]["request"].update(
         prompt_ids=[1, False]), "requests[0].request.prompt_ids[1]"),
    ],
)  # fmt: skip
def test_a_bad_document_fails_the_schema_and_the_reader_at_the_same_field(tmp_path, path, name, read, change, field):
    document = copy.deepcopy(json.loads((REPOSITORY / path).read_text()))
    change(document)
    with pytest.raises(ApiError) as refused:
        read(tmp_path, document)
    assert refused.value.field == field
    assert f".{field}" in faults(name, document)


def test_the_schema_command_prints_a_schema_and_lists_them(capsys):
    assert cli.main(["schema", "kvsim-system"]) == 0
    assert json.loads(capsys.readouterr().out)["title"].startswith("KVResidencySystemConfig")
    assert cli.main(["schema"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("recorded-computations")
    with pytest.raises(SystemExit) as ended:
        cli.main(["schema", "nothing"])
    assert ended.value.code == 2
