"""Arms and calibrations measured on the InferenceEngine: how a lab runs them, and what its replay checks.

An engine arm (`execution.runner=engine`) is served by `engine_serving`; its
measured-run document is the arm's file and its totals are the arm's outcomes. A
lab with calibrated arms (`compute_service.model=calibrated`) first serves its
`calibration_workload` on the engine, once per distinct model, generation policy
and system of those arms, and fits kvsim's service to those runs
(`kvsim.calibration.fit`). Nothing measured can be measured again: a replay checks
the measured runs (record_integrity.check_measured_run and the bindings below),
and fits the service again from the recorded calibration runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.arm_recording import INFERENCE_CONTROLS, Recording, generation_of, recording_key
from experiments.controls import chosen
from experiments.experiment_spec import ExecutionSpec
from experiments.lab_workload import LabWorkload
from experiments.record_files import dumps, file_entry, verified_file
from experiments.record_integrity import check_measured_run
from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import parse_json
from kvsim import fit, fitted_terms, parse_system, read_measured_run, system_json

if TYPE_CHECKING:  # the plan's module imports jax, which a replay never needs
    from jgpt.kernels.plan import Kernels


def engine_arm(
    i: int,
    label: str,
    execution: ExecutionSpec,
    n: int,
    recording: Recording,
    workload: LabWorkload,
    files: dict[str, bytes],
    kernels: Kernels,
) -> dict[str, Any]:
    """Serve the arm on the InferenceEngine under the kernel plan `kernels`; its outcomes are the measured totals
    (kvsim's field names)."""
    # Start-up cost only: the engine imports jax, which a replay never needs; an arm served on it does.
    from experiments.engine_serving import serve

    measured = serve(
        recording.model["model_id"],
        kernels,
        execution.system_config_json(),
        workload,
        recording.document,
        generation_of(execution),
        f"arm {label!r}",
    )
    name = f"measured-run-{i}.json"
    files[name] = dumps(measured)
    return {
        "label": label,
        "execution": execution.to_json(),
        "system": measured["system"],
        "recording": n,
        "measured_run": file_entry(name, files[name]),
        "outcomes": measured["totals"],
    }


def calibration_plan(executions: list[ExecutionSpec]) -> list[tuple[ExecutionSpec, dict[str, Any]]]:
    """One engine run of the calibration workload per distinct model, generation policy and system of the
    calibrated arms (the service rates aside: the engine has its own)."""
    plan: dict[str, tuple[ExecutionSpec, dict[str, Any]]] = {}
    for execution in executions:
        if chosen(execution.assignments, "compute_service.model") != "calibrated":
            continue
        system = system_json(parse_system(execution.system_config_json(), "system"))
        served = {k: v for k, v in system.items() if k not in ("compute_service", "transfer")}
        inference = {name: execution.value(name) for name in INFERENCE_CONTROLS}
        plan.setdefault(json.dumps([inference, served], sort_keys=True), (execution, system))
    return list(plan.values())


def calibrate(
    workload: LabWorkload, arms: list, recordings: dict, files: dict[str, bytes], kernels: Kernels
) -> dict[str, Any]:
    """Serve the calibration workload on the engine under each planned system and the kernel plan `kernels`, and
    fit kvsim's service to it."""
    # Start-up cost only: both import jax, which a replay never needs; a calibration serves and records.
    from experiments.engine_serving import serve
    from experiments.lab_recording import record_workload

    entries, runs = [], []
    for n, (execution, system) in enumerate(calibration_plan([execution for _, execution in arms])):
        key = recording_key(execution, workload, kernels)
        if key not in recordings:  # the prompts its conversations send, with the model's own replies
            recordings[key] = record_workload(execution, workload, kernels)
        recording = recordings[key]
        measured = serve(
            recording.model["model_id"],
            kernels,
            system,
            workload,
            recording.document,
            generation_of(execution),
            f"calibration run {n}",
        )
        name = f"calibration-run-{n}.json"
        files[name] = dumps(measured)
        runs.append(read_measured_run(json.loads(files[name]), hashlib.sha256(files[name]).hexdigest(), name))
        entries.append(
            {
                "execution": execution.to_json(),
                "system": measured["system"],
                "measured_run": file_entry(name, files[name]),
            }
        )
    fragment, _, _ = fit(runs)
    return {"runs": entries, "fragment": fragment}


def replay_calibration(
    directory: Path, calibration: Any, workload: LabWorkload, executions: list[ExecutionSpec], models: list[Any]
) -> dict:
    """The recorded calibration runs are the planned ones, intact, on a model the record's recordings name, and
    fitting them again gives the recorded fragment."""
    field = "record.calibration"
    plan = calibration_plan(executions)
    entries = calibration.get("runs") if isinstance(calibration, dict) else None
    if not isinstance(entries, list) or len(entries) != len(plan) or not all(isinstance(e, dict) for e in entries):
        raise ApiError(f"{field}.runs", f"must list the {len(plan)} calibration runs its calibrated arms plan")
    runs = []
    for n, (entry, (execution, system)) in enumerate(zip(entries, plan)):
        at = f"{field}.runs[{n}]"
        data = verified_file(directory, entry.get("measured_run"), f"{at}.measured_run")
        measured = parse_json(data, f"{at}.measured_run")
        check_measured_run(measured, f"{at}.measured_run")
        if (
            entry.get("execution") != execution.to_json()
            or entry.get("system") != system
            or measured["system"] != system
        ):
            raise ApiError(at, "is not the engine run its calibrated arms plan (their controls and system)")
        _check_arrivals(measured, workload, f"{at}.measured_run")
        if measured.get("model") not in models:
            raise ApiError(f"{at}.measured_run.model", "is not a model of the record's recorded computations")
        runs.append(read_measured_run(measured, hashlib.sha256(data).hexdigest(), f"{at}.measured_run"))
    fragment, _, _ = fit(runs, fitted_terms(calibration.get("fragment")))
    if calibration.get("fragment") != fragment:
        raise ApiError(f"{field}.fragment", "is not what fitting the recorded calibration runs gives")
    return fragment


def replay_engine_arm(
    directory: Path, arm: Mapping[str, Any], field: str, execution: ExecutionSpec, document: dict, workload: LabWorkload
) -> None:
    """An engine arm cannot be measured again: its measured run is intact, is of this arm's system, model,
    prompts and arrivals, and its totals are what its requests and works give; the arm's outcomes are them."""
    data = verified_file(directory, arm.get("measured_run"), f"{field}.measured_run")
    measured = parse_json(data, f"{field}.measured_run")
    check_measured_run(measured, f"{field}.measured_run")
    system = system_json(parse_system(execution.system_config_json(), "system"))
    if measured["system"] != system or arm.get("system") != system:
        raise ApiError(f"{field}.system", "is not the system its controls resolve to")
    if measured.get("model") != document.get("model"):
        raise ApiError(f"{field}.measured_run.model", "is not the model of the arm's recorded computations")
    _check_arrivals(measured, workload, f"{field}.measured_run")
    prompts = lambda computations: {
        r.get("request_id"): r.get("prompt_ids")  # noqa: E731
        for r in computations.get("requests") or []
        if isinstance(r, dict)
    }
    if prompts(measured["computations"]) != prompts(document):
        raise ApiError(
            f"{field}.measured_run.computations", "did not serve the prompts of the arm's recorded computations"
        )
    if measured["totals"] != arm.get("outcomes"):
        raise ApiError(f"{field}.outcomes", "are not the totals of its measured run")


def _check_arrivals(measured: Mapping[str, Any], workload: LabWorkload, field: str) -> None:
    declared = [{"request_id": r.request_id, "arrival_us": r.arrival_us} for r in workload.requests]
    if measured["workload"].get("requests") != declared or measured["engine"].get("as_fast_as_possible") is not False:
        raise ApiError(f"{field}.workload", "is not the lab's workload served at its declared arrivals")
