"""Arms simulated by kvsim: how a lab runs them, and what its replay checks.

A kvsim arm (`execution.runner=kvsim`, the default) resolves its controls to a
KVResidencySystemConfig and simulates the lab's workload over its recording's
computations (`kvsim.simulate`); the CacheRun (`cache-run-N.json`, kvsim's
canonical bytes) is the arm's file and its totals are the arm's outcomes. A
calibrated arm (`compute_service.model=calibrated`) takes its service from the
fragment its lab's calibration fitted (`experiments/measured_arms.py`), shaped to the
engine's. Everything a kvsim arm holds is computed, so a replay simulates it again
and compares bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.arm_recording import generation_of
from experiments.controls import chosen
from experiments.experiment_design import ExperimentDesign
from experiments.experiment_spec import ExecutionSpec
from experiments.lab_workload import LabWorkload
from experiments.record_files import file_entry, verified_file
from jgpt.foundation.errors import ApiError
from kvsim import merge_service, parse_document, parse_system, record_json, simulate


def kvsim_arm(
    i: int,
    label: str,
    execution: ExecutionSpec,
    n: int,
    document: dict,
    workload: LabWorkload,
    lab: ExperimentDesign,
    fragment: dict | None,
    files: dict[str, bytes],
) -> dict[str, Any]:
    """Simulate the arm over its recording's computations `document` (`n`, the recording's index in the
    record); its outcomes are the cache run's totals."""
    try:
        run = simulate_arm(execution, document, workload, lab, fragment)
    except ApiError as error:
        raise ApiError(f"arm {label!r}: {error.field}", error.reason) from None
    name = f"cache-run-{i}.json"
    files[name] = record_json(run)
    return {
        "label": label,
        "execution": execution.to_json(),
        "system": run.declaration["system"],
        "recording": n,
        "cache_run": file_entry(name, files[name]) | {"id": json.loads(files[name])["id"]},
        "outcomes": run.outcomes["totals"],
    }


def replay_kvsim_arm(
    directory: Path,
    arm: Mapping[str, Any],
    field: str,
    execution: ExecutionSpec,
    document: dict,
    workload: LabWorkload,
    lab: ExperimentDesign,
    fragment: dict | None,
) -> None:
    """The arm's cache run is intact and simulating the arm again gives its bytes, system and outcomes."""
    recorded = verified_file(directory, arm.get("cache_run"), f"{field}.cache_run")
    try:
        run = simulate_arm(execution, document, workload, lab, fragment)
    except ApiError as error:
        raise ApiError(f"{field}.{error.field}", error.reason) from None
    if record_json(run) != recorded:
        raise ApiError(f"{field}.cache_run", f"replaying arm {arm.get('label')!r} gave different bytes")
    if arm["cache_run"] != file_entry(arm["cache_run"]["path"], recorded) | {"id": json.loads(recorded)["id"]}:
        raise ApiError(f"{field}.cache_run", "must be {path, sha256, bytes, id} of the cache run it names")
    if run.declaration["system"] != arm.get("system"):
        raise ApiError(f"{field}.system", "is not the system its controls resolve to")
    if run.outcomes["totals"] != arm.get("outcomes"):
        raise ApiError(f"{field}.outcomes", "differ from the replayed cache run")


def simulate_arm(
    execution: ExecutionSpec, document: dict, workload: LabWorkload, lab: ExperimentDesign, fragment: dict | None = None
):
    """kvsim's CacheRun of the arm: its system over the recorded computations `document` and the lab's workload."""
    computations = parse_document(document)  # checked before the engine's shapes are read from it
    settings = execution.system_config_json()
    if chosen(execution.assignments, "compute_service.model") == "calibrated":
        # Start-up cost only: EnginePlan lives with the engine, whose modules import jax.
        from experiments.engine_serving import engine_shapes

        if fragment is None:
            raise ApiError("compute_service.model", "a calibrated arm needs its lab's calibration_workload")
        settings = merge_service(settings, fragment)
        settings = settings | {
            "compute_service": settings["compute_service"] | engine_shapes(document, settings, generation_of(execution))
        }
    system = parse_system(settings, "system")
    return simulate(
        system,
        computations,
        workload.arrivals(),
        workload.interaction,
        None,
        lab.ontology_binding.to_json(),
    )
