"""The Recording an arm runs on, and what decides which one: its inference controls.

An arm's model and generation controls (the inference controls: no system control and
no control of how the arm runs) decide what the model records of a workload. Arms of a
lab, and labs run together, that agree on them, the workload and the kernel plan share
one Recording (`recording_key`); `experiments/lab_recording.py` makes it by running the
model, and every kind of arm (kvsim, engine, generate) reads it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from experiments.controls import CONTROLS
from experiments.experiment_spec import ExecutionSpec
from experiments.lab_workload import LabWorkload

if TYPE_CHECKING:  # the plan's module imports jax, which a replay never needs
    from jgpt.kernels.plan import Kernels

INFERENCE_CONTROLS = tuple(name for name, c in CONTROLS.items() if c.system_path is None and c.default is None)


@dataclasses.dataclass(frozen=True)
class Recording:
    """Recorded computations of the workload under one model and generation policy."""

    inference: dict[str, Any]  # the inference controls that produced it
    model: dict[str, Any]  # model_id and the ModelArtifactReference
    document: dict[str, Any]  # the recorded computation document
    walkthrough: dict[str, Any]  # ArchitectureWalkthrough of the model
    observations: dict[str, Any]  # inspection data: tokens, predictions, attention


def generation_of(execution: ExecutionSpec) -> dict[str, Any]:
    """The generation policy an arm's controls set, by the policy's own field names."""
    return {name.split(".")[1]: execution.value(name) for name in INFERENCE_CONTROLS if name.startswith("generation.")}


def recording_key(execution: ExecutionSpec, workload: LabWorkload, kernels: Kernels) -> str:
    """What arms sharing one Recording agree on: inference controls, workload and kernel plan."""
    inference = {name: execution.value(name) for name in INFERENCE_CONTROLS}
    return json.dumps([inference, workload.to_json({}), kernels.to_json()], sort_keys=True)
