"""TokenSelection by seeded sampling: temperature, top-k and top-p filters, keys from (seed, request, step).

The selection rule of a row is a function of its logits and three integers: the
policy's `seed`, the request's stream (from the SHA-256 of its request id, or of the
name it `draws_from`) and the index of the id being selected (0 for the id the
prefill's logits select). The draw
reads no other state, so a request selects the same ids alone or in a batch, in
`generate` or `generate_stepwise`, and in the InferenceEngine.

Filters apply in the order temperature, top-k, top-p, as Hugging Face's warpers do.
Neither filter splits a tie: every id whose value equals the last kept one is
kept too. Temperature 0 is greedy selection (argmax), the limit of the rule.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from inference.policy import SAMPLE, GenerationPolicy, InferenceRequest
from jgpt.model import pytree as struct

TOP_CANDIDATES = 5  # ids of the filtered distribution a TokenSelection records
# top_p counts as reached when the kept mass is within float32 rounding of it, so a top_p that equals a
# cumulative boundary exactly keeps the ids up to that boundary and no more.
TOP_P_TOLERANCE = 1e-6


def request_stream(request: InferenceRequest) -> int:
    """A request's random stream: the first 31 bits of the SHA-256 of its id, or of the name it draws from
    (its batch position plays no part)."""
    name = request.request_id if request.draws_from is None else request.draws_from
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") >> 1


@struct.dataclass
class SelectionRule:
    """Per row of a batch: sample or select greedily, and the sampling parameters (arrays [B])."""

    sample: jax.Array  # bool
    temperature: jax.Array  # float32; 0: greedy
    top_k: jax.Array  # int32; 0: no limit
    top_p: jax.Array  # float32; 1: no limit
    seed: jax.Array  # int32
    stream: jax.Array  # int32, request_stream of the request id

    @classmethod
    def of(cls, requests: Sequence[InferenceRequest | None], always: bool = False) -> SelectionRule | None:
        """The rows' rules (a None row is an unused one: greedy), or None when every request selects
        greedily and not `always` (the greedy programs then run unchanged)."""
        policies = [GenerationPolicy() if r is None else r.generation for r in requests]
        if not always and not any(p.selection == SAMPLE for p in policies):
            return None
        column = lambda values, dtype: jnp.asarray(np.asarray(values, dtype))
        return cls(
            sample=column([p.selection == SAMPLE and p.temperature > 0 for p in policies], np.bool_),
            temperature=column([p.temperature for p in policies], np.float32),
            top_k=column([p.top_k for p in policies], np.int32),
            top_p=column([p.top_p for p in policies], np.float32),
            seed=column([p.seed for p in policies], np.int32),
            stream=column([0 if r is None else request_stream(r) for r in requests], np.int32),
        )


def step_key(seed, stream, step) -> jax.Array:
    """The key of one row's draw: fold the request's stream, then the selection index, into the seed's key."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), stream), step)


def filtered_logits(logits: jax.Array, temperature, top_k, top_p) -> jax.Array:
    """One row's logits [V] scaled by temperature, with every id outside top-k, then top-p, set to -inf."""
    V = logits.shape[-1]
    z = logits / jnp.where(temperature > 0, temperature, 1.0)
    descending = -jnp.sort(-z)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)
    z = jnp.where(z >= descending[k - 1], z, -jnp.inf)
    p = jax.nn.softmax(z)
    p_descending = -jnp.sort(-p)
    before = jnp.cumsum(p_descending) - p_descending  # the mass of the more probable ids
    kept = jnp.sum(before < top_p - TOP_P_TOLERANCE)  # >= 1: the first id has nothing before it
    threshold = jnp.where(top_p >= 1.0, 0.0, p_descending[jnp.maximum(kept, 1) - 1])
    return jnp.where((p >= threshold) & (z > -jnp.inf), z, -jnp.inf)


def select(logits: jax.Array, rule: SelectionRule | None, steps: jax.Array) -> jax.Array:
    """Ids [B] selected from logits [B, V]; `steps` [B] is the index of the id each row selects."""
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if rule is None:
        return greedy
    keys = jax.vmap(step_key)(rule.seed, rule.stream, steps)
    filtered = jax.vmap(filtered_logits)(logits, rule.temperature, rule.top_k, rule.top_p)
    drawn = jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)
    return jnp.where(rule.sample, drawn, greedy)


def candidates(logits: jax.Array, rule: SelectionRule) -> tuple[jax.Array, jax.Array]:
    """The TOP_CANDIDATES most probable ids [B, N] of each row's filtered distribution and their probabilities."""
    filtered = jax.vmap(filtered_logits)(logits, rule.temperature, rule.top_k, rule.top_p)
    probabilities, ids = jax.lax.top_k(jax.nn.softmax(filtered, axis=-1), TOP_CANDIDATES)
    return ids.astype(jnp.int32), probabilities


select_jit = jax.jit(select)
candidates_jit = jax.jit(candidates)
