"""The record a lab run writes (`record.json`): its format, and its id, the identity of what the run consumed.

`experiments/experiment_execution.py` writes it, `experiments/experiment_replay.py`
derives its id again from the lab, arms and recordings it names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from experiments.experiment_design import ExperimentDesign
from experiments.lab_workload import LabWorkload
from experiments.record_files import dumps

FORMAT = "jgpt-experiment-execution"
VERSION = 1
RECORD = "record.json"


def execution_id(
    lab: ExperimentDesign,
    arms: list,
    recordings: list,
    workload: LabWorkload,
    calibration: Mapping[str, Any] | None = None,
) -> str:
    """Names what was consumed: the lab, every arm's controls, the recorded computations' identity and any
    measured runs (engine arms', then the calibration's)."""
    consumed = {
        "lab": lab.to_json(),
        "arms": [arm["execution"] for arm in arms],
        "computations": [r["computations"]["sha256"] for r in recordings],
        "workload": workload.to_json({}),
    }
    measured = [arm[kind]["sha256"] for arm in arms for kind in ("measured_run", "decoding_run") if kind in arm]
    measured += [run["measured_run"]["sha256"] for run in (calibration or {}).get("runs", [])]
    if measured:  # absent for kvsim-only labs, whose ids stay what they were
        consumed["measured_runs"] = measured
    return f"lab-{hashlib.sha256(dumps(consumed)).hexdigest()[:16]}"
