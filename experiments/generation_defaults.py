"""GenerationDefaults: a working ExecutionSpec (every control assigned) and LabWorkload.

A lab's settings are completed with these defaults for every control they leave
unassigned; a lab without a workload runs on the default one. The hypothetical
service rates are scaled to the small shipped checkpoints so that compute,
memory traffic and transfers all take whole, comparable virtual microseconds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from experiments.controls import CONTROLS
from experiments.experiment_spec import ExecutionSpec
from experiments.lab_workload import LabWorkload, read_workload
from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import mapping

DEFAULTS = Path(__file__).with_name("generation_defaults.json")


@dataclasses.dataclass(frozen=True)
class GenerationDefaults:
    execution: ExecutionSpec
    workload: LabWorkload

    @classmethod
    def from_json(cls, value: Any, field: str = "generation_defaults") -> GenerationDefaults:
        mapping(value, field, {"execution", "workload"})
        execution = ExecutionSpec.from_json(value["execution"], f"{field}.execution")
        unassigned = [name for name in CONTROLS if name not in execution.assignments]
        if unassigned:
            raise ApiError(f"{field}.execution", f"defaults assign every control; missing {', '.join(unassigned)}")
        return cls(execution, read_workload(value["workload"], f"{field}.workload"))


@functools.cache
def generation_defaults() -> GenerationDefaults:
    return GenerationDefaults.from_json(json.loads(DEFAULTS.read_text(encoding="utf-8")), DEFAULTS.name)
