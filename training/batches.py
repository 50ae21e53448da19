"""Token data on the device and the batches drawn from it.

Two shapes of data: rows (one padded conversation per row, loss only on
assistant tokens) and a stream (one long token sequence, any window is an
example). Both are pytrees whose `sample` is a pure function of a key, so the
batch of step `s` is `sample(fold_in(data_key, s))` and the data stream is a
function of the step alone: resuming at step `s` sees exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jgpt.model import pytree as struct


@struct.dataclass
class Batch:
    inputs: jax.Array  # int32[B, T]
    targets: jax.Array  # int32[B, T]: inputs shifted left by one
    mask: jax.Array  # float32[B, T]: 1 where the target counts toward the loss


def _shifted(windows: jax.Array, weights: jax.Array) -> Batch:
    # windows, weights: [B, T + 1]; the weight of a target sits at the target's position.
    return Batch(windows[:, :-1], windows[:, 1:], weights[:, 1:].astype(jnp.float32))


@struct.dataclass
class TokenRows:
    """Padded examples, one per row: tokens int32[N, T + 1], weights uint8[N, T + 1]."""

    tokens: jax.Array | np.ndarray  # numpy when tiled from a stream still on the host
    weights: jax.Array

    @property
    def count(self) -> int:
        return self.tokens.shape[0]

    def sample(self, key: jax.Array, batch_size: int) -> Batch:
        rows = jax.random.randint(key, (batch_size,), 0, self.count)
        return _shifted(self.tokens[rows], self.weights[rows])

    def chunks(self, batch_size: int) -> list[Batch]:
        """Every row exactly once, in order, in batches of `batch_size` (the last padded with weight 0)."""
        missing = -self.count % batch_size
        tokens = jnp.pad(self.tokens, ((0, missing), (0, 0)))
        weights = jnp.pad(self.weights, ((0, missing), (0, 0)))
        return [
            _shifted(tokens[i : i + batch_size], weights[i : i + batch_size])
            for i in range(0, tokens.shape[0], batch_size)
        ]


@struct.dataclass
class TokenStream:
    """One token sequence; an example is any window of `context + 1` tokens."""

    tokens: jax.Array | np.ndarray  # int32[L]; numpy on the host until put on the devices
    context: int = struct.field(pytree_node=False)

    def sample(self, key: jax.Array, batch_size: int) -> Batch:
        starts = jax.random.randint(key, (batch_size, 1), 0, self.tokens.shape[0] - self.context)
        windows = self.tokens[starts + jnp.arange(self.context + 1)]  # [B, T + 1]
        return _shifted(windows, jnp.ones_like(windows))

    def tiled(self, max_windows: int) -> TokenRows:
        """Consecutive non-overlapping windows from the start, so each target is counted once."""
        count = min((self.tokens.shape[0] - 1) // self.context, max_windows)
        starts = np.arange(count)[:, None] * self.context
        windows = self.tokens[starts + np.arange(self.context + 1)]
        # The first token of each window is input only; later windows' first target is its successor.
        return TokenRows(windows, jnp.ones_like(windows, dtype=jnp.uint8))


def rows_from_sequences(sequences: list[list[int]], weights: list[list[int]], width: int, pad_id: int) -> TokenRows:
    """Right-pad variable-length sequences into a [N, width] table (padding has weight 0)."""
    chex.assert_equal(len(sequences), len(weights))
    tokens = np.full((len(sequences), width), pad_id, np.int32)
    table = np.zeros((len(sequences), width), np.uint8)
    for row, (ids, mask) in enumerate(zip(sequences, weights, strict=True)):
        tokens[row, : len(ids)] = ids
        table[row, : len(mask)] = mask
    return TokenRows(jnp.asarray(tokens), jnp.asarray(table))
