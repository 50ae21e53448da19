"""Resuming a run: the configuration it continues with, and what a resume may change (only its length).

`jgpt train --out DIR --resume` continues the run DIR's `run.json` records: the flags and a --config
file may restate its fields, and one that differs is refused naming the field, the recorded value and
the given one. The one change a resume takes is more steps (`--steps N` past the recorded steps): an
extension, of a finished run or of an interrupted one. Fewer steps are refused.

The rule of an extension: the learning-rate schedule keeps its span (`schedule_steps`, the steps the
run was started for) and the steps after it run at its final rate. Why this rule and not a schedule
stretched over the new total:

* the steps already taken ran under the recorded schedule; stretching it would send the rate back up
  at the resume (a 3000-step run extended to 6000 would jump from 5% of the peak to about 54%),
  undoing the annealing its finished model was selected at, so more steps could first make it worse;
* the extended run is a function of its configuration alone, as every run is: a run extended in one
  go, one extended and resumed again after an interruption, and one configured from the start with
  that `schedule_steps` and `steps` take the same steps bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from training.config import LOCATION_FIELDS, TrainingConfig


@dataclass(frozen=True)
class Extension:
    """A resumed run's steps past the ones it was started for."""

    from_steps: int
    to_steps: int
    schedule_steps: int
    held_learning_rate: float

    def describe(self, root: Path) -> str:
        return (
            f"extending {root} from {self.from_steps} to {self.to_steps} steps: the learning-rate schedule keeps "
            f"its span of {self.schedule_steps} steps, so steps {self.schedule_steps + 1}-{self.to_steps} hold its "
            f"final rate {self.held_learning_rate:.6g} (recorded as learning_rate_schedule in the model's provenance)"
        )


def resumable_document(recorded: TrainingConfig) -> dict[str, Any]:
    """The recorded configuration as a resume starts from: the flags and a --config file are laid over it.
    Its schedule's span is written out, so that a --steps past it extends the run and keeps the schedule."""
    return recorded.to_json() | {"schedule_steps": recorded.schedule_steps}


def check_resume(recorded: TrainingConfig, config: TrainingConfig, root: Path, done: int) -> Extension | None:
    """Refuse resuming the run at `root` (which recorded `recorded` and has done `done` steps) with `config`
    unless it is the recorded configuration, or that with more steps; returns the extension, if any."""
    if config.steps < recorded.steps:
        raise ApiError(
            "steps",
            f"{root} was started for {recorded.steps} steps and has done {done}; a resume continues it to "
            f"{recorded.steps} (leave --steps out) or extends it (--steps above {recorded.steps}), never to "
            f"fewer (given {config.steps})",
        )
    expected = recorded.replace(steps=config.steps, schedule_steps=recorded.schedule_steps)
    _require_same(expected, config, root)
    if config.steps == recorded.steps:
        return None
    assert recorded.schedule_steps is not None, "TrainingConfig.__post_init__ sets schedule_steps"
    held = recorded.learning_rate * recorded.final_learning_rate_fraction
    return Extension(recorded.steps, config.steps, recorded.schedule_steps, held)


def _require_same(recorded: TrainingConfig, config: TrainingConfig, root: Path) -> None:
    if recorded.parent is not None and config.parent is not None:
        then, now = recorded.parent.weights_identity(), config.parent.weights_identity()
        for name in then:
            if then[name] != now[name]:
                raise ApiError(
                    "init_from",
                    f"{root} was started from {recorded.init_from} with {name} {then[name]}; "
                    f"{config.init_from} now has {now[name]}: a resume continues from its own checkpoints, "
                    "but the run would no longer be the one its configuration names; train it under another --out",
                )
    difference = next(_differences(recorded.to_json(), config.to_json()), None)
    if difference is not None:
        field, stored, given = difference
        raise ApiError(
            field,
            f"{root} was started with {field} {stored!r}, given {given!r}. A resume continues the run as "
            f"{root / 'run.json'} records it: `--out {root} --resume` alone reads the rest (leave the flag or "
            f"--config field for {field} out), or start a new run with {given!r} under another --out",
        )


def _differences(stored: dict[str, Any], given: dict[str, Any], prefix: str = ""):
    """(field, stored value, given value) of each field that differs; an architecture's by their own names."""
    for name in dict.fromkeys([*stored, *given]):
        if name in LOCATION_FIELDS:
            continue
        before, after = stored.get(name), given.get(name)
        if isinstance(before, dict) and isinstance(after, dict):
            yield from _differences(before, after, f"{prefix}{name}.")
        elif before != after:
            yield f"{prefix}{name}", before, after
