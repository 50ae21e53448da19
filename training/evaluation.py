"""Evaluation of trained weights: development loss, bits per byte, held-out exact match per skill."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jgpt.architecture import Architecture
from jgpt.model import KVBuffers, forward
from jgpt.tokenizer import Tokenizer
from jgpt.weights import ModelWeights
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


@partial(jax.jit, static_argnames=("architecture", "new_tokens"))
def greedy_continuations(
    weights: ModelWeights, architecture: Architecture, prompts: jax.Array, lengths: jax.Array, new_tokens: int
) -> jax.Array:
    """Greedy tokens after each right-padded prompt: prompts int32[N, S], lengths int32[N] -> int32[N, new_tokens].

    One prefill writes every prompt's keys and values into slots = positions; each
    decode step then feeds one token per row at its own position, so rows of
    different lengths advance together and padding slots are overwritten before
    any query can see them.
    """
    a = architecture
    N, S = prompts.shape
    empty = jnp.zeros((a.layers, N, S, a.kv_width), jnp.dtype(a.precision))
    prefill = forward(weights, a, prompts, cache=KVBuffers(empty, empty))
    rows = jnp.arange(N)
    first = jnp.argmax(prefill.logits[rows, lengths - 1], axis=-1).astype(jnp.int32)  # [N]

    def step(carry, _):
        token, position, cache = carry
        out = forward(weights, a, token[:, None], positions=position[:, None], cache=cache)
        following = jnp.argmax(out.logits[:, 0], axis=-1).astype(jnp.int32)
        return (following, position + 1, out.cache), token

    _, tokens = jax.lax.scan(step, (first, lengths, prefill.cache), length=new_tokens)
    return tokens.T


def exact_match(
    weights: ModelWeights,
    architecture: Architecture,
    tokenizer: Tokenizer,
    exercises: Sequence[HeldOutExercise],
    batch_size: int = 256,
) -> dict[str, dict[str, float | int]]:
    """Per skill: the fraction of held-out exercises whose greedy reply is exactly the answer then TURN_END."""
    answers = [(*tokenizer.encode_text(e.answer), tokenizer.turn_end_id) for e in exercises]
    new_tokens = max(map(len, answers))
    width = min(max(len(e.prompt) for e in exercises) + new_tokens, architecture.context)
    correct: dict[str, list[bool]] = defaultdict(list)
    for start in range(0, len(exercises), batch_size):
        chunk = exercises[start : start + batch_size]
        prompts = np.full((batch_size, width), tokenizer.turn_end_id, np.int32)
        lengths = np.ones(batch_size, np.int32)
        for row, exercise in enumerate(chunk):
            prompts[row, : len(exercise.prompt)] = exercise.prompt
            lengths[row] = len(exercise.prompt)
        replies = np.asarray(greedy_continuations(weights, architecture, prompts, lengths, new_tokens))
        for row, exercise in enumerate(chunk):
            expected = answers[start + row]
            correct[exercise.skill].append(tuple(replies[row, : len(expected)]) == expected)
    return {
        skill: {"exact_match": sum(marks) / len(marks), "exercises": len(marks)}
        for skill, marks in sorted(correct.items())
    }
