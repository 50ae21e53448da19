"""Replay a lab's record: check it against its own files and derive every arm and field again.

Replay reads only the record and the files it names, simulates every kvsim arm
again and rebuilds the record: both must come back byte for byte. Inference is not
re-run (its wall times are measurements, not reproducible values).

What replay proves, and what not: the files are the ones the record names (each
path inside the record's directory, at most RECORD_FILE_LIMIT bytes, SHA-256 equal);
the record's `id` is the identity of what it says it consumed; its model bindings,
each recording's kernel plan, provenance, workload, inference controls, arm labels and walkthrough are those its lab
and recorded computations give; the inspected observations are of the sequences those
computations hold, in the shape the report reads; every arm's cache run,
system and outcomes are what kvsim computes from them. It does not prove that the
named model produced the computations (nothing is re-generated), nor the predicted
probabilities or attention weights (no forward pass is run): a record edited
consistently everywhere, hashes included, passes. `record_integrity.model_bindings`
additionally compares the model identities with this machine's catalog or artifact.
Measured runs (engine arms, calibration runs) are checked, not measured again: see
`experiments/measured_arms.py` and docs/security.md for what that proves.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.arm_recording import generation_of
from experiments.controls import chosen
from experiments.decoding_arms import replay_decoding_arm
from experiments.experiment_design import ExperimentDesign
from experiments.experiment_record import FORMAT, VERSION, execution_id
from experiments.experiment_spec import ExecutionSpec
from experiments.generation_defaults import generation_defaults
from experiments.kvsim_arms import replay_kvsim_arm
from experiments.lab_workload import LabWorkload
from experiments.measured_arms import replay_calibration, replay_engine_arm
from experiments.record_files import dumps, verified_file
from experiments.record_integrity import check_recording
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes
from jgpt.foundation.json_input import parse_json
from jgpt.foundation.validation import is_integer
from jgpt.model.architecture import architecture_from_json
from jgpt.model.walkthrough import walkthrough

# What experiment_execution writes at the top of every record ("calibration" too, when its lab calibrates): a field
# outside these is derived from nothing, so replay could not vouch for it.
_RECORD_FIELDS = {"format", "version", "id", "lab", "bindings", "provenance", "recordings", "arms"}


def replay(record_path: Path) -> dict[str, Any]:
    """Check a record against its own files and simulate every arm again; ApiError on the first difference."""
    record_path = Path(record_path)
    data = read_bytes(record_path, "record")
    record = parse_json(data, "record", source=str(record_path))
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("version") != VERSION:
        raise ApiError("record.format", f"not a {FORMAT} version {VERSION} record")
    if unknown := set(record) - _RECORD_FIELDS - {"calibration"}:
        raise ApiError("record", f"has fields no lab run writes: {sorted(unknown)}")
    lab = ExperimentDesign.from_json(record.get("lab"), "record.lab")
    workload = lab.workload or generation_defaults().workload
    recordings, arms = _list(record, "recordings"), _list(record, "arms")
    documents = _recorded_computations(record_path.parent, recordings)
    executions = [
        ExecutionSpec.from_json(arm.get("execution"), f"record.arms[{i}].execution") for i, arm in enumerate(arms)
    ]
    if ("calibration" in record) != (lab.calibration_workload is not None):
        raise ApiError(
            "record.calibration", "a record holds a calibration exactly when its lab declares a calibration_workload"
        )
    fragment = (
        None
        if lab.calibration_workload is None
        else replay_calibration(
            record_path.parent,
            record["calibration"],
            lab.calibration_workload,
            executions,
            [document.get("model") for document in documents],
        )
    )
    _replay_arms(record_path.parent, arms, executions, documents, workload, lab, fragment)
    _check_derived(record, lab, workload, executions, documents)
    if dumps(record) != data:
        raise ApiError("record", "is not in canonical form: its bytes differ from the values they hold")
    return record


def _list(record: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    value = record.get(name)
    if not isinstance(value, list) or not value or not all(isinstance(entry, dict) for entry in value):
        raise ApiError(f"record.{name}", "must be a non-empty list of objects")
    return value


def _recorded_computations(directory: Path, recordings: list[dict[str, Any]]) -> list[dict]:
    """Each recording's computations document, its files verified and its observations checked against it."""
    documents = []
    for n, entry in enumerate(recordings):
        field = f"record.recordings[{n}]"
        document = parse_json(
            verified_file(directory, entry.get("computations"), f"{field}.computations"),
            f"{field}.computations",
        )
        observations = parse_json(
            verified_file(directory, entry.get("observations"), f"{field}.observations"),
            f"{field}.observations",
        )
        for name in ("computations", "observations"):
            if set(entry[name]) != {"path", "sha256", "bytes"}:
                raise ApiError(f"{field}.{name}", "must be a file entry {path, sha256, bytes}")
        check_recording(entry, document, observations, field)
        documents.append(document)
    return documents


def _replay_arms(
    directory: Path,
    arms: list[dict[str, Any]],
    executions: list[ExecutionSpec],
    documents: list[dict],
    workload: LabWorkload,
    lab: ExperimentDesign,
    fragment: dict | None,
) -> None:
    """Every arm holds its lab's settings, names one of the recordings, and replays as its runner demands."""
    declared = lab.arms()
    if len(arms) != len(declared):
        raise ApiError("record.arms", f"must be the {len(declared)} arms of its lab")
    for i, (arm, execution) in enumerate(zip(arms, executions)):
        field = f"record.arms[{i}]"
        if any(execution.assignments.get(k) != v for k, v in declared[i].execution.assignments.items()):
            raise ApiError(f"{field}.execution", "does not hold the settings of its lab's arm")
        if not is_integer(arm.get("recording")) or arm["recording"] not in range(len(documents)):
            raise ApiError(f"{field}.recording", f"must be the index of one of the {len(documents)} recordings")
        document = documents[arm["recording"]]
        runner = chosen(execution.assignments, "execution.runner")
        if runner == "engine":
            replay_engine_arm(directory, arm, field, execution, document, workload)
        elif runner == "generate":
            replay_decoding_arm(directory, arm, field, execution, document)
        else:
            replay_kvsim_arm(directory, arm, field, execution, document, workload, lab, fragment)


def _check_derived(
    record: Mapping[str, Any],
    lab: ExperimentDesign,
    workload: LabWorkload,
    executions: list[ExecutionSpec],
    documents: list[dict],
) -> None:
    """Every field the run derived from what it consumed must be derived again, so none can be edited alone."""
    recordings, arms = record["recordings"], record["arms"]
    execution = documents[0].get("execution")
    execution = execution if isinstance(execution, dict) else {}
    provenance = execution.get("provenance")
    generations = []
    for i, (arm, spec) in enumerate(zip(arms, executions)):
        try:
            generations.append(generation_of(spec))
            named = spec.value("model.model_id")
        except ApiError as error:
            raise ApiError(f"record.arms[{i}].execution.{error.field}", error.reason) from None
        model_id = recordings[arm["recording"]]["model"].get("model_id")
        inference = {"model.model_id": model_id} | {f"generation.{k}": v for k, v in generations[-1].items()}
        # "default" is resolved to the catalog's default model when the lab runs
        if recordings[arm["recording"]].get("inference") != inference or named not in (model_id, "default"):
            raise ApiError(
                f"record.recordings[{arm['recording']}].inference", f"is not what arm {i}'s controls resolve to"
            )
    expected = {
        "id": execution_id(lab, arms, recordings, workload, record.get("calibration")),
        "bindings": {"workload": workload.to_json(generations[0]), "models": [r["model"] for r in recordings]},
        "provenance": {**(provenance if isinstance(provenance, dict) else {}), "backend": execution.get("backend")},
    }
    for name, value in expected.items():
        if record.get(name) != value:
            raise ApiError(f"record.{name}", "is not what the record's lab, arms and recorded computations give")
    if [arm.get("label") for arm in arms] != [arm.label for arm in lab.arms()]:
        raise ApiError("record.arms.label", "are not the labels of the lab's arms")
    for n, (entry, document) in enumerate(zip(recordings, documents)):
        try:
            architecture = architecture_from_json(document["model"].get("architecture"))
        except ApiError as error:
            raise ApiError(f"record.recordings[{n}].model.architecture.{error.field}", error.reason) from None
        if entry.get("walkthrough") != walkthrough(architecture).to_json():
            raise ApiError(
                f"record.recordings[{n}].walkthrough", "is not the walkthrough of the recorded model's architecture"
            )
