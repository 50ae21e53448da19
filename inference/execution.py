"""ModelExecution: jitted prefill and decode over an immutable KVState.

Both phases are one jitted function, `advance`: process a window of new tokens per
row at the positions after the row's prefix, writing their keys and values into
the state's slots, and return the logits of each row's last new token (only those
tokens are projected to the vocabulary). Prefill is a window of the prompt (prompt
lengths bucketed to four widths per power of two, `window_bucket`, so a model compiles a
bounded set of programs, not one per length, and a batch pads at most a quarter past its
longest prompt); decode is a window of one.
Continuing a state returns a new state; the caller's value is never donated, so
every snapshot stays valid.

How the layers run inside a step, and the layout the execution holds its weights in, is
the execution's LayerStrategy, by default the one `LayerStrategy.for_backend()` picks for
the backend JAX runs on (`jgpt/model/layer_strategy.py`). Which steps run by jgpt's kernels is its
kernel plan (`jgpt.kernels.plan.Kernels`, by default `Kernels.auto()`), narrowed once, when the
execution is bound, to what can run on its weights, and a jit-static argument of every step.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from inference.costs import WorkCosts
from inference.policy import check_prompt
from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import is_integer
from jgpt.kernels.plan import XLA, Kernels
from jgpt.model.architecture import Architecture
from jgpt.model.kv_state import KVState, StateIdentity
from jgpt.model.layer_strategy import LayerStrategy, LayerView
from jgpt.model.transformer import forward
from jgpt.model.weights import ModelWeights
from jgpt.tokenizers.framing import TURN_END_ID

MIN_BUCKET = 16
CAPACITY_STEP = 32


def bucket(n: int, limit: int) -> int:
    """The smallest power of two >= n (at least MIN_BUCKET), but never more than `limit`."""
    return min(limit, max(MIN_BUCKET, 1 << max(0, n - 1).bit_length()))


def window_bucket(n: int, limit: int) -> int:
    """The window width for n new ids: a power of two up to MIN_BUCKET, then the next multiple of a quarter of
    the power of two below n (20, 24, 28, 32, 40, ... 56, 64, 80, ...), but never more than `limit`.

    Four widths per doubling: a batch's prefill pays for at most a quarter more than its longest prompt.
    """
    if n <= MIN_BUCKET:
        return bucket(n, limit)
    quarter = (1 << ((n - 1).bit_length() - 1)) // 4
    return min(limit, -(-n // quarter) * quarter)


def capacity_bucket(n: int, limit: int) -> int:
    """Cache slots for n positions: powers of two up to CAPACITY_STEP, then multiples of it (at most `limit`).

    Finer than powers of two because every decode step attends over all slots of the buffer.
    """
    return bucket(n, limit) if n <= CAPACITY_STEP else min(limit, -(-n // CAPACITY_STEP) * CAPACITY_STEP)


def advance(
    weights: ModelWeights,
    architecture: Architecture,
    state: KVState,
    window_ids: jax.Array,  # int32 [B, W]: row b's new ids first, padding after
    counts: jax.Array,  # int32 [B]: new ids per row, 0 <= counts <= W
    unroll: int | bool,
    layer_weights: LayerView | None = None,
    kernels: Kernels = XLA,
) -> tuple[jax.Array, KVState]:
    """Logits [B, V] of each row's last new id, and the state extended by the new ids.

    Padding beyond a row's count is processed too (shapes are static) but lands in
    slots past the row's new length, which no query sees; slots past the buffer are
    dropped. A row with count 0 keeps its length.
    """
    W = window_ids.shape[1]
    positions = state.lengths[:, None] + jnp.arange(W, dtype=jnp.int32)  # [B, W]
    last = None if W == 1 else jnp.maximum(counts - 1, 0)  # a decode step's one id is its last
    out = forward(
        weights, architecture, window_ids, positions=positions, cache=state.buffers, unroll=unroll,
        layer_weights=layer_weights, logits_at=last, kernels=kernels.calls(),
    )  # fmt: skip
    logits = out.logits[:, 0]  # [B, V]
    write = lambda row, ids, slots: row.at[slots].set(ids, mode="drop")
    state = state.replace(
        keys=out.cache.keys,
        values=out.cache.values,
        token_ids=jax.vmap(write)(state.token_ids, window_ids, positions),
        lengths=state.lengths + counts,
    )
    return logits, state


_advance = jax.jit(advance, static_argnames=("architecture", "unroll", "kernels"))


@functools.partial(jax.jit, static_argnames=("architecture", "unroll", "kernels"))
def _full_prefix_logits(weights, architecture, token_ids, unroll, layer_weights, kernels: Kernels):
    return forward(
        weights, architecture, token_ids, unroll=unroll, layer_weights=layer_weights, kernels=kernels.calls()
    ).logits


@dataclasses.dataclass(frozen=True)
class ModelExecution:
    """A model bound for execution: weights, architecture, the identity its states carry, and costs.

    The weights are held once, stacked, in the strategy's layout (`LayerStrategy.held_weights`, applied when
    the execution is made): on CPU every projection and the output projection transposed to OutputMajor in
    place of the stored array. The unrolled-layers strategy runs over a per-layer view of them
    (`layer_weights`), which on CPU shares their memory. `kernels` is the plan as this execution runs it
    (`Kernels.for_execution`), what its evidence records.
    """

    weights: ModelWeights
    architecture: Architecture
    identity: StateIdentity
    turn_end_id: int = TURN_END_ID
    strategy: LayerStrategy = dataclasses.field(default_factory=LayerStrategy.for_backend)
    kernels: Kernels = dataclasses.field(default_factory=Kernels.auto)

    def __post_init__(self):
        object.__setattr__(self, "weights", self.strategy.held_weights(self.weights))
        object.__setattr__(self, "kernels", self.kernels.for_execution(self.architecture, self.strategy.output_major))

    @classmethod
    def from_artifact(
        cls, artifact, tokenizer, strategy: LayerStrategy | None = None, kernels: Kernels | None = None
    ) -> ModelExecution:
        """Bind a loaded ModelArtifact; its states carry the checkpoint's and the tokenizer's identity."""
        identity = StateIdentity(
            checkpoint_sha256=artifact.checkpoint_sha256,
            tokenizer_sha256=tokenizer.tokenizer_sha256,
            precision=artifact.architecture.precision,
        )
        strategy = strategy or LayerStrategy.for_backend()
        kernels = Kernels.auto() if kernels is None else kernels
        return cls(artifact.weights, artifact.architecture, identity, tokenizer.turn_end_id, strategy, kernels)

    @functools.cached_property
    def layer_weights(self) -> LayerView | None:
        """The per-layer view of the weights the strategy runs over, or None where it scans the stacked tensors."""
        return self.strategy.layer_weights(self.weights)

    @property
    def scan_unroll(self) -> int | bool:
        return self.strategy.unroll

    @functools.cached_property
    def costs(self) -> WorkCosts:
        itemsize = jnp.dtype(self.architecture.precision).itemsize
        return WorkCosts.of(self.architecture, self.weights, itemsize)

    def empty_state(self, batch: int, capacity: int) -> KVState:
        a = self.architecture
        kv_heads = a.kv_heads
        assert kv_heads is not None, "LlamaArchitecture.__post_init__ sets kv_heads"
        return KVState.empty(self.identity, a.layers, batch, capacity, kv_heads, a.head_dim)

    def check_state(self, state: KVState) -> None:
        if not isinstance(state, KVState):
            raise ApiError("state", f"must be a KVState, got {type(state).__name__}")
        state.require_identity(self.identity)

    def window(self, prompts: Sequence[Sequence[int]], state: KVState | None, capacity: int = 0):
        """The state to extend (reusing each row's exact prefix) and the window of new ids per row.

        Returns (state, window_ids [B, W], counts [B], reused [B]); the state is a new
        value sized to hold `capacity` positions (at least the prompts).
        """
        a = self.architecture
        if not prompts:
            raise ApiError("prompt_ids", "no prompt given")
        for b, prompt in enumerate(prompts):
            check_prompt(prompt, a.vocabulary, a.context, f"prompt_ids[{b}]" if len(prompts) > 1 else "prompt_ids")
        longest = max(map(len, prompts))
        capacity = max(capacity, longest)
        if state is None:
            state, reused = self.empty_state(len(prompts), capacity_bucket(capacity, a.context)), [0] * len(prompts)
        else:
            self.check_state(state)
            if state.batch != len(prompts):
                raise ApiError("state", f"holds {state.batch} rows for {len(prompts)} prompts")
            reused = [_reusable(prefix, prompt) for prefix, prompt in zip(state.prefixes(), prompts)]
            state = state.with_capacity(capacity_bucket(capacity, a.context))
            state = state.replace(lengths=jnp.asarray(reused, jnp.int32))
        counts = [len(p) - r for p, r in zip(prompts, reused)]
        window_ids = np.zeros((len(prompts), window_bucket(max(counts), a.context)), np.int32)
        for b, (prompt, r) in enumerate(zip(prompts, reused)):
            window_ids[b, : counts[b]] = prompt[r:]
        return state, window_ids, np.asarray(counts, np.int32), reused

    def prefill(
        self, prompts: Sequence[Sequence[int]], state: KVState | None = None, capacity: int = 0
    ) -> tuple[jax.Array, KVState]:
        """Logits [B, V] after each prompt and the state holding it; `state` supplies reusable prefixes."""
        state, window_ids, counts, _ = self.window(prompts, state, capacity)
        return self.advance(state, window_ids, counts)

    def advance(self, state: KVState, window_ids, counts) -> tuple[jax.Array, KVState]:
        """The jitted work: `counts[b]` ids of `window_ids[b]` processed after row b's prefix."""
        window_ids, counts = jnp.asarray(window_ids, jnp.int32), jnp.asarray(counts, jnp.int32)
        return _advance(
            self.weights, self.architecture, state, window_ids, counts, self.scan_unroll, self.layer_weights,
            self.kernels,
        )  # fmt: skip

    def decode(self, state: KVState, token_ids: Sequence[int | np.integer]) -> tuple[jax.Array, KVState]:
        """Process one id per row after the row's prefix: logits [B, V] and the continued state."""
        self.check_state(state)
        a = self.architecture
        if len(token_ids) != state.batch:
            raise ApiError("token_id", f"needs one id per state row ({state.batch}), got {len(token_ids)}")
        for t in token_ids:
            if not (is_integer(t) or isinstance(t, np.integer)) or not 0 <= t < a.vocabulary:
                raise ApiError("token_id", f"{t!r} is not a token id of this model (0..{a.vocabulary - 1})")
        longest = int(jnp.max(state.lengths))
        if longest >= a.context:
            raise ApiError("state", f"already holds {longest} positions, the model's whole context")
        state = state.with_capacity(capacity_bucket(longest + 1, a.context))
        return self.advance(state, np.asarray(token_ids)[:, None], np.ones(state.batch))

    def full_prefix_logits(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """The reference: logits [B, T, V] of a full recompute without any cache, rows right-padded."""
        longest = max(map(len, sequences))
        ids = np.zeros((len(sequences), bucket(longest, self.architecture.context)), np.int32)
        for b, sequence in enumerate(sequences):
            ids[b, : len(sequence)] = sequence
        logits = _full_prefix_logits(
            self.weights, self.architecture, jnp.asarray(ids), self.scan_unroll, self.layer_weights, self.kernels
        )
        return np.asarray(logits)[:, :longest]


def prefill(weights, architecture, token_ids, *, identity: StateIdentity, state: KVState | None = None):
    """`prefill(weights, architecture, token_ids) -> (logits, KVState)` for one prompt or a batch of them.

    The functional form scans the stacked layers; bind a ModelExecution for repeated, faster use.
    """
    single = len(token_ids) == 0 or isinstance(token_ids[0], (int, np.integer))
    return ModelExecution(weights, architecture, identity, strategy=LayerStrategy.scan()).prefill(
        [token_ids] if single else token_ids, state
    )


def decode(weights, architecture, state: KVState, token_id):
    """`decode(weights, architecture, KVState, token_id) -> (logits, KVState)`; one id, or one per row."""
    token_ids = [token_id] if isinstance(token_id, (int, np.integer)) else list(token_id)
    return ModelExecution(weights, architecture, state.identity, strategy=LayerStrategy.scan()).decode(state, token_ids)


def _reusable(prefix: tuple[int, ...], prompt: Sequence[int]) -> int:
    """How many leading positions of a state row a prompt reuses: all of them if the row is an exact
    prefix of the prompt, else none. At least one prompt position is always processed, for its logits."""
    if len(prefix) > len(prompt) or tuple(prompt[: len(prefix)]) != prefix:
        return 0
    return min(len(prefix), len(prompt) - 1)
