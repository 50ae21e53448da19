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
    SHA-256 of the canonical run configuration.
    """

    kind: str
    seed: int
    step: int
    selection: str
    development_loss: float
    data_sha256: str
    source_sha256: dict[str, str]
    preparation_run_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "TrainingProvenance", **dataclasses.asdict(self)}


def source_sha256() -> dict[str, str]:
    """SHA-256 of every Python file of the training package and of the model core it trains."""
    return source_hashes(("training", "jgpt"))
