"""Execution evidence: CacheComputation per executed work, GenerationWork totals, TensorObservation,
and the rounds of speculative decoding."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

PREFILL = "prefill"
DECODE = "decode"
VERIFY = "verify"  # the target's forward over the last id and the drafted ones (speculative decoding)

# Which earlier stages each stage of a block reads; "input" is the block's input stream. A stage not
# listed reads the stage observed just before it.
_BLOCK_INPUTS = {
    "ln1": ("input",),
    "query": ("ln1",),
    "key": ("ln1",),
    "attention_weights": ("query", "key"),
    "attention": ("attention_weights", "ln1"),
    "residual1": ("input", "attention"),
    "ln2": ("residual1",),
    "feed_forward": ("ln2",),
    "residual2": ("residual1", "feed_forward"),
}
_AXES = {
    "attention_weights": ("position", "head", "slot"),
    "query": ("position", "head", "channel"),
    "key": ("position", "head", "channel"),
    "logits": ("position", "vocabulary"),
}


@dataclasses.dataclass(frozen=True)
class CacheComputation:
    """One executed forward work of one request, with its analytic counts and measured time."""

    work_id: str
    request_id: str
    step: int  # 0 is the prefill; decode step k selects output id k
    phase: str  # PREFILL | DECODE
    input_ids: tuple[int, ...]  # the ids this work processed
    processed_positions: int
    reused_positions: int  # positions taken from a KVState instead of being processed
    matmul_flops: int
    reference_matmul_flops: int  # a full-prefix recompute of the same positions
    logical_memory_bytes: int
    reference_max_abs_error: float | None  # vs. the full-prefix recompute, when asked
    wall_time_us: float
    measurement_boundary: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"input_ids": list(self.input_ids)}


@dataclasses.dataclass(frozen=True)
class GenerationWork:
    """Totals of the works one request executed."""

    processed_positions: int
    reused_positions: int
    matmul_flops: int
    reference_matmul_flops: int
    logical_memory_bytes: int
    wall_time_us: float

    @classmethod
    def total(cls, computations: Sequence[CacheComputation]) -> GenerationWork:
        fields = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: sum(getattr(c, name) for c in computations) for name in fields})

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SpeculationRound:
    """One round of speculative decoding of one request: what the draft proposed and what the target kept."""

    step: int  # the output id the round selected first
    drafted_ids: tuple[int, ...]  # the draft's k proposals
    accepted_ids: tuple[int, ...]  # the leading proposals the target agreed with and that were selected
    rejected_ids: tuple[int, ...]  # the rest: from the first disagreement (or past a stop) on
    target_id: int | None  # the target's own id selected after the accepted ones; None when a stop came first

    def to_json(self) -> dict[str, Any]:
        return {name: list(v) if isinstance(v, tuple) else v for name, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True)
class SpeculationEvidence:
    """A request's speculative decoding: the draft model, k, and every round."""

    draft_checkpoint_sha256: str | None  # None: drafted by prompt lookup, no model
    speculate: int  # k: ids drafted per round
    rounds: tuple[SpeculationRound, ...]
    draft_prefill_wall_time_us: float  # the draft's own prefill (the target's is a CacheComputation)

    @property
    def drafted(self) -> int:
        return sum(len(r.drafted_ids) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(len(r.accepted_ids) for r in self.rounds)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted ids; None when no round ran (the prefill's id was the whole output)."""
        return self.accepted / self.drafted if self.drafted else None

    def to_json(self) -> dict[str, Any]:
        return {
            "draft_checkpoint_sha256": self.draft_checkpoint_sha256, "speculate": self.speculate,
            "drafted": self.drafted, "accepted": self.accepted, "acceptance_rate": self.acceptance_rate,
            "draft_prefill_wall_time_us": self.draft_prefill_wall_time_us,
            "rounds": [r.to_json() for r in self.rounds],
        }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TensorObservation:
    """One model operation's output for one request at one step, with what it was computed from."""

    id: str
    run_id: str
    request_id: str
    step: int
    operation: str  # the ontology's operation concept, e.g. "Attention"
    layer: int | None
    positions: tuple[int, ...]
    inputs: tuple[str, ...]  # ids of the observations this one reads
    axes: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    values: np.ndarray

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "positions": list(self.positions), "inputs": list(self.inputs), "axes": list(self.axes),
            "shape": list(self.shape), "values": self.values.tolist(),
        }  # fmt: skip


def tensor_observations(observations, row: int, count: int, *, run_id: str, request_id: str, step: int):
    """TensorObservations of row `row`'s first `count` processed positions, from `forward(observe=True)`."""
    prefix = f"{run_id}/{request_id}/step{step}/"
    name = lambda stage, layer: prefix + (stage if layer is None else f"layer{layer}/{stage}")
    positions = tuple(int(p) for p in np.asarray(observations.positions)[row, :count])
    stream: str | None = None  # the id of the residual stream entering the next block
    result: list[TensorObservation] = []
    for record in observations.records:
        stage, layer = record.stage, record.layer
        if layer is not None:
            assert stream is not None, "forward records the embedding before any block"
            earlier = _BLOCK_INPUTS.get(stage, ("previous",))
            inputs = [stream if s == "input" else result[-1].id if s == "previous" else name(s, layer) for s in earlier]
        elif stage in ("ln_final", "logits"):  # the last block's output, then ln_final's
            assert stream is not None, "forward records the embedding before ln_final"
            inputs = [stream]
        elif stage == "embedding":
            inputs = [result[-1].id] if result else []  # the position embedding, where there is one
        else:  # computed from token ids and positions alone
            inputs = []
        values = np.asarray(record.value)[row, :count]
        axes = _AXES.get(stage, ("position", "channel"))
        result.append(
            TensorObservation(
                id=name(stage, layer), run_id=run_id, request_id=request_id, step=step,
                operation=record.operation, layer=layer, positions=positions, inputs=tuple(inputs),
                axes=axes if len(axes) == values.ndim else tuple(f"axis{i}" for i in range(values.ndim)),
                shape=values.shape, dtype=str(values.dtype), values=values,
            )
        )  # fmt: skip
        if stage in ("embedding", "residual2", "ln_final"):
            stream = name(stage, layer)
    return tuple(result)
