"""TrainingProvenance: how a trained artifact was made, enough to make it again."""

from __future__ import annotations

import dataclasses
from typing import Any

from jgpt.foundation.identity import source_hashes


@dataclasses.dataclass(frozen=True)
class TrainingProvenance:
    """The ontology's TrainingProvenance.

    kind: the corpus kind ("conversations" or "text"); step: the step of the selected
    weights; selection: "best_development_loss" or "final"; source_sha256: SHA-256 of
    each training and model source file by repository path; preparation_run_sha256:
    SHA-256 of the canonical run configuration; init_from: the parent artifact a
    fine-tuning run started from (`training.parent.ParentModel.identity`: the model as
    given, its path and its checkpoint, manifest and tokenizer identities), None for a
    run from initialized weights; learning_rate_schedule: the schedule the run's steps
    took (`learning_rate_schedule`).
    """

    kind: str
    seed: int
    step: int
    selection: str
    development_loss: float
    data_sha256: str
    source_sha256: dict[str, str]
    preparation_run_sha256: str
    init_from: dict[str, Any] | None
    learning_rate_schedule: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"type": "TrainingProvenance", **dataclasses.asdict(self)}


def learning_rate_schedule(config) -> dict[str, Any]:
    """A TrainingConfig's schedule as provenance states it: linear warm-up to the peak, cosine decay to the
    final rate at `schedule_steps`, and that rate held for the steps after it (`held_after_step`, None when
    the run ends where its schedule does)."""
    return {
        "warmup_steps": config.warmup_steps,
        "schedule_steps": config.schedule_steps,
        "steps": config.steps,
        "peak_learning_rate": config.learning_rate,
        "final_learning_rate": config.learning_rate * config.final_learning_rate_fraction,
        "held_after_step": config.schedule_steps if config.steps > config.schedule_steps else None,
    }


def source_sha256() -> dict[str, str]:
    """SHA-256 of every Python file of the training package and of the model core it trains."""
    return source_hashes(("training", "jgpt"))
