"""`jgpt lab run --kernels auto|xla`: the plan a lab's model ran with is in its record, and both plans select the
same ids.

The smallest lab (the demo's: two kvsim arms over the default four-request workload) runs once per plan with the
shipped default model, in this process so that the two runs share their compiled programs.
"""

import contextlib
import io
import json

import pytest

from experiments.experiment_replay import replay
from inference.execution import ModelExecution
from jgpt.artifacts.catalog import load_model, read_catalog
from jgpt.cli import main as cli
from jgpt.foundation.errors import ApiError
from jgpt.kernels.plan import Kernels

from conftest import LAB

# The pure-JAX reference, written out rather than taken from `Kernels.xla()`.
REFERENCE = {"products": "xla", "attention": "full", "decode": "xla", "one_row": "xla"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per plan name: (exit code, stdout, the run's directory)."""
    out, runs = tmp_path_factory.mktemp("labs"), {}
    for name in ("xla", "auto"):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = cli.main(["lab", "run", LAB, "--out", str(out / name), "--kernels", name, "--no-report", "--quiet"])
        runs[name] = (code, printed.getvalue(), out / name)
    return runs


def recorded(directory):
    """The record and its only recording's computations."""
    record = json.loads((directory / "record.json").read_bytes())
    (recording,) = record["recordings"]
    return record, json.loads((directory / recording["computations"]["path"]).read_bytes())


def test_xla_records_the_reference_plan_next_to_the_model_and_prints_it(runs):
    code, printed, directory = runs["xla"]
    record, computations = recorded(directory)
    assert code == 0
    assert record["recordings"][0]["kernels"] == REFERENCE == computations["execution"]["kernels"]
    model_id = record["recordings"][0]["model"]["model_id"]
    assert f"kernels of {model_id}: products xla, attention full, decode xla, one_row xla" in printed


def test_auto_records_the_plan_generate_runs_the_model_with(runs):
    code, printed, directory = runs["auto"]
    record, computations = recorded(directory)
    artifact = load_model(read_catalog().default_id())
    generates = ModelExecution.from_artifact(artifact, artifact.tokenizer(), kernels=Kernels.auto()).kernels
    assert code == 0
    assert record["recordings"][0]["kernels"] == generates.to_json() == computations["execution"]["kernels"]
    # auto keeps the products and attention the shipped models were trained with
    assert record["recordings"][0]["kernels"]["products"] == "xla"
    assert record["recordings"][0]["kernels"]["attention"] == "full"
    assert f"kernels of {record['recordings'][0]['model']['model_id']}: {generates}" in printed


def test_both_plans_record_the_same_output_ids(runs):
    ids = {name: [r["output_ids"] for r in recorded(runs[name][2])[1]["requests"]] for name in runs}
    assert ids["xla"] == ids["auto"] and any(ids["xla"])


def test_an_unknown_plan_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        cli.main(["lab", "run", LAB, "--out", str(tmp_path / "run"), "--kernels", "bogus"])
    assert refused.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_xla_record_replays_and_a_record_naming_another_plan_is_refused(runs, tmp_path):
    directory = runs["xla"][2]
    record, _ = recorded(directory)
    assert replay(directory / "record.json") == record
    for path in directory.glob("*.json"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    record["recordings"][0]["kernels"] = REFERENCE | {"decode": "fused"}  # what its computations do not name
    (tmp_path / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    with pytest.raises(ApiError) as refused:
        replay(tmp_path / "record.json")
    assert refused.value.field == "record.recordings[0].kernels"
