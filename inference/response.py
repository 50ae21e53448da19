"""Decoding evidence and the published response: TokenSelection, RunOutcome, InferenceResponse."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from inference.evidence import CacheComputation, GenerationWork, SpeculationEvidence, TensorObservation
from inference.policy import GREEDY, STOP_TURN_END


@dataclasses.dataclass(frozen=True)
class TokenSelection:
    """One prediction step: the rule, the selected id and, when asked, the scores it chose from.

    A sampled step also records its key's derivation and the filtered distribution's most probable
    (id, probability) pairs; the spec's TokenSelection has rng_state always null (greedy only).
    """

    selected_id: int
    rule: str = GREEDY
    decoding: str = "autoregressive"
    raw_logits: np.ndarray | None = None  # [V] float32
    probabilities: np.ndarray | None = None  # [V] softmax of raw_logits
    rng_state: dict | None = None  # greedy: none; sample: {"seed", "stream", "step"} the draw's key derives from
    candidates: tuple[tuple[int, float], ...] | None = None  # sample: the filtered distribution's top ids

    def to_json(self) -> dict[str, Any]:
        as_list = lambda x: None if x is None else [float(v) for v in x]
        return {
            "decoding": self.decoding, "rule": self.rule, "selected_id": self.selected_id,
            "raw_logits": as_list(self.raw_logits), "probabilities": as_list(self.probabilities),
            "rng_state": self.rng_state,
        } | ({} if self.candidates is None else {"candidates": [list(c) for c in self.candidates]})  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    selected_tokens: int  # TURN_END included
    published_tokens: int  # every selected id except TURN_END
    unused_budget: int  # max_new_tokens - selected_tokens
    stop_reason: str
    complete: bool  # true only if TURN_END was selected

    @classmethod
    def of(cls, output_ids: tuple[int, ...], max_new_tokens: int, stop_reason: str, turn_end_id: int) -> RunOutcome:
        ended = stop_reason == STOP_TURN_END
        return cls(
            selected_tokens=len(output_ids),
            published_tokens=len(output_ids) - int(ended),
            unused_budget=max_new_tokens - len(output_ids),
            stop_reason=stop_reason,
            complete=ended and output_ids[-1] == turn_end_id,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class InferenceResponse:
    """What one request produced, with the evidence of every work it executed."""

    request_id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]  # every selected id, TURN_END included
    published_ids: tuple[int, ...]  # every selected id except TURN_END
    outcome: RunOutcome
    selections: tuple[TokenSelection, ...]
    computations: tuple[CacheComputation, ...]
    work: GenerationWork
    observations: tuple[TensorObservation, ...] = ()
    speculation: SpeculationEvidence | None = None  # when decoded speculatively (inference/speculative.py)
