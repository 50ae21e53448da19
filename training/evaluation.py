"""Evaluation of trained weights: development loss, bits per byte, held-out exact match per skill."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

from jgpt.foundation import progress
from jgpt.model.weights import ModelWeights
from jgpt.tokenizers.tokenizer import Tokenizer
from training.batches import TokenRows
from training.corpus import HeldOutExercise

DEVELOPMENT_BATCH = 64


def development_loss(
    development_step: Callable, weights: ModelWeights, development: TokenRows, counted_bytes: int, batch_size: int
) -> tuple[float, float]:
    """(mean nats per counted target, bits per UTF-8 byte of those targets) over the whole split."""
    total, count = 0.0, 0.0
    for batch in development.chunks(batch_size):
        nats, targets = development_step(weights, batch)
        total, count = total + float(nats), count + float(targets)
    return total / max(count, 1.0), total / math.log(2) / max(counted_bytes, 1)


def exact_match(
    execution, tokenizer: Tokenizer, exercises: Sequence[HeldOutExercise], batch_size: int = 256
) -> dict[str, dict[str, float | int]]:
    """Per skill: the fraction of held-out exercises whose greedy reply is exactly the answer then TURN_END.

    `execution` is an `inference.ModelExecution`; replies come from its batched greedy `generate`,
    each with a budget of exactly the answer's length plus TURN_END.
    """
    from inference.generation import generate
    from inference.policy import GenerationPolicy, InferenceRequest

    answers = [(*tokenizer.encode_text(e.answer), tokenizer.turn_end_id) for e in exercises]
    requests = [
        InferenceRequest(f"{e.skill}-{n}", e.prompt, GenerationPolicy(max_new_tokens=len(answer)))
        for n, (e, answer) in enumerate(zip(exercises, answers, strict=True))
    ]
    correct: dict[str, list[bool]] = defaultdict(list)
    for start in progress.tracked(range(0, len(requests), batch_size), "exact match", unit="batch"):
        generation = generate(execution, requests[start : start + batch_size])
        for n, response in enumerate(generation.responses, start):
            correct[exercises[n].skill].append(tuple(response.output_ids) == answers[n])
    return {
        skill: {"exact_match": sum(marks) / len(marks), "exercises": len(marks)}
        for skill, marks in sorted(correct.items())
    }
