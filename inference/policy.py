"""GenerationPolicy and InferenceRequest: what a caller asks for, fixed before execution."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import is_integer, is_number

GREEDY = "greedy"
SAMPLE = "sample"  # seeded sampling (inference/sampling.py); the spec names greedy selection only
SELECTIONS = (GREEDY, SAMPLE)
STOPPING = "turn_end_or_budget"  # context capacity also bounds every run

# RunOutcome.stop_reason values, in the order the loop checks them.
STOP_TURN_END = "turn_end"
STOP_BUDGET = "max_new_tokens"
STOP_CONTEXT = "context"


@dataclasses.dataclass(frozen=True)
class GenerationPolicy:
    """Output budget (selected ids, the end token included) and the selection and stopping rules.

    `selection="sample"` draws each id from the logits scaled by `temperature` (0: greedy) and
    restricted to the `top_k` most probable ids (0: all) and then to the most probable ids whose
    probability reaches `top_p` (1: all), with keys from `seed`, the request id and the step.
    """

    max_new_tokens: int = 64
    selection: str = GREEDY
    stopping: str = STOPPING
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        _check_integer("max_new_tokens", self.max_new_tokens, 1, (1 << 31) - 1)  # budgets are int32 on the device
        if self.selection not in SELECTIONS:
            raise ApiError("selection", f"unsupported rule {self.selection!r}; supported: {', '.join(SELECTIONS)}")
        if self.stopping != STOPPING:
            raise ApiError("stopping", f"unsupported rule {self.stopping!r}; supported: {STOPPING}")
        _check_number("temperature", self.temperature, 0.0, 1e4)
        _check_number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_integer("top_k", self.top_k, 0, 1 << 31)
        _check_integer("seed", self.seed, 0, (1 << 31) - 1)
        changed = [f for f in _SAMPLING_FIELDS if getattr(self, f) != getattr(GenerationPolicy, f)]
        if self.selection == GREEDY and changed:
            raise ApiError(changed[0], f"applies only to selection {SAMPLE!r}")

    @classmethod
    def from_json(cls, document: Mapping[str, Any], field: str = "generation") -> GenerationPolicy:
        _require_object(document, field)
        unknown = sorted(set(document) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ApiError(f"{field}.{unknown[0]}", "is not a GenerationPolicy field")
        return cls(**document)

    def to_json(self) -> dict[str, Any]:
        """The policy's fields; a greedy policy's are the three the spec names."""
        document = dataclasses.asdict(self)
        if self.selection == GREEDY:
            document = {k: v for k, v in document.items() if k not in _SAMPLING_FIELDS}
        return document


_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed")


def implied_policy(max_new_tokens: int, settings: Mapping[str, Any], sample: bool = False) -> GenerationPolicy:
    """The policy of a face's sampling settings, one rule for `jgpt generate` and the HTTP API: a sampling setting
    given (temperature, top_k, top_p, seed) implies sampling, as `sample` asks for it outright; temperature 0 is
    sampling's limit, greedy selection. Every setting is checked either way."""
    if not (sample or settings):
        return GenerationPolicy(max_new_tokens, GREEDY)
    policy = GenerationPolicy(max_new_tokens, SAMPLE, **settings)
    return GenerationPolicy(max_new_tokens, GREEDY) if policy.temperature == 0 else policy


def _check_number(field: str, value: Any, low: float, high: float, low_open: bool = False) -> None:
    ok = is_number(value) and low <= value <= high
    if not ok or (low_open and value == low):
        bound = f"{'>' if low_open else '>='} {low:g} and <= {high:g}"
        raise ApiError(field, f"must be a number {bound}, got {value!r}")


def _check_integer(field: str, value: Any, low: int, high: int) -> None:
    if not is_integer(value) or not low <= value <= high:
        raise ApiError(field, f"must be an integer in {low}..{high}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class InferenceRequest:
    """One invocation: its identity, declared arrival, prompt ids and generation policy."""

    request_id: str
    prompt_ids: tuple[int, ...]
    generation: GenerationPolicy = GenerationPolicy()
    arrival_us: int = 0
    text: str | None = None  # the user text the prompt encodes, where there is one
    # The name its draws' random stream derives from (inference/sampling.py), when not its request id: an
    # endpoint request draws from the CLI's stream, so a seed selects the same ids there as in `jgpt generate`.
    draws_from: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))


def check_prompt(prompt_ids: Sequence[int], vocabulary: int, context: int, field: str = "prompt_ids") -> None:
    """Refuse an empty prompt, one longer than the context, or ids the model does not know."""
    if len(prompt_ids) == 0:
        raise ApiError(field, "is empty; a prompt needs at least one token id")
    if len(prompt_ids) > context:
        raise ApiError(field, f"has {len(prompt_ids)} ids, more than the model's context of {context}")
    for i, t in enumerate(prompt_ids):
        if not is_integer(t) or not 0 <= t < vocabulary:
            raise ApiError(f"{field}[{i}]", f"{t!r} is not a token id of this model (0..{vocabulary - 1})")


def _require_object(document: Any, field: str) -> None:
    if not isinstance(document, Mapping):
        raise ApiError(field, f"must be a JSON object, got {type(document).__name__}")
