"""KVState: the immutable keys and values of a processed prefix, bound to its identity.

A KVState is a pytree. Its array leaves are the model's K/V buffers, stored
head-major (`[layers, B, kv_heads, S, head_dim]`, slot = absolute position: the
order attention reads them in; `channels()` gives the design's
`[layers, B, S, kv_width]` view), the token ids that produced them (`[B, S]`) and
each row's prefix length (`[B]`); slots at or beyond a row's
length hold nothing meaningful and the model never lets a query see them. Its
static fields are the identity the spec binds a state to: the checkpoint, the
tokenizer and the precision. Because identities are static, a state passes
through `jax.jit` unchanged in structure, and one compiled step serves every
state of a model.

Nothing mutates a KVState: continuing one returns a new one, so a snapshot can
be continued any number of times, independently.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.model import pytree as struct
from jgpt.model.architecture import Architecture


@struct.dataclass
class KVBuffers:
    """Keys and values by layer, row, head and slot (slot = absolute position): [layers, B, kv_heads, S, head_dim].

    The arrays the forward pass writes into and attends over; a KVState is these
    buffers bound to the tokens that produced them and to an identity.

    Head-major, so that every head's keys and values are one [S, head_dim] matrix that
    attention's products read as stored. With the heads inside the channels
    ([layers, B, S, kv_width]) XLA on CPU copied every layer's keys and values into
    that order at every decode step.
    """

    keys: jax.Array
    values: jax.Array

    @classmethod
    def empty(cls, architecture: Architecture, batch: int, slots: int) -> KVBuffers:
        """Zeroed buffers in the architecture's compute dtype, for `slots` positions per row."""
        a = architecture
        shape = (a.layers, batch, a.kv_heads, slots, a.head_dim)
        dtype = jnp.dtype(a.precision)
        # Two distinct buffers, so that a jitted step may donate both.
        return cls(keys=jnp.zeros(shape, dtype), values=jnp.zeros(shape, dtype))


@dataclasses.dataclass(frozen=True)
class StateIdentity:
    """What a KVState is bound to: it is valid only for this checkpoint, tokenizer and precision."""

    checkpoint_sha256: str
    tokenizer_sha256: str
    precision: str


@struct.dataclass
class KVState(struct.Replaceable):
    keys: jax.Array  # [layers, B, kv_heads, S, head_dim]
    values: jax.Array  # [layers, B, kv_heads, S, head_dim]
    token_ids: jax.Array  # int32 [B, S]; row b is meaningful in [0, lengths[b])
    lengths: jax.Array  # int32 [B]: processed positions per row
    checkpoint_sha256: str = struct.field(pytree_node=False)
    tokenizer_sha256: str = struct.field(pytree_node=False)
    precision: str = struct.field(pytree_node=False)

    @classmethod
    def empty(
        cls, identity: StateIdentity, layers: int, batch: int, capacity: int, kv_heads: int, head_dim: int
    ) -> KVState:
        shape = (layers, batch, kv_heads, capacity, head_dim)
        dtype = jnp.dtype(identity.precision)
        return cls(
            keys=jnp.zeros(shape, dtype),
            values=jnp.zeros(shape, dtype),
            token_ids=jnp.zeros((batch, capacity), jnp.int32),
            lengths=jnp.zeros((batch,), jnp.int32),
            **dataclasses.asdict(identity),
        )

    @property
    def identity(self) -> StateIdentity:
        return StateIdentity(self.checkpoint_sha256, self.tokenizer_sha256, self.precision)

    @property
    def buffers(self) -> KVBuffers:
        return KVBuffers(keys=self.keys, values=self.values)

    def channels(self) -> tuple[jax.Array, jax.Array]:
        """Keys and values by layer, row, slot and channel: each [layers, B, S, kv_width],
        channel = head * head_dim + d (the model's key and value projection order)."""
        by_channel = lambda x: jnp.moveaxis(x, 2, 3).reshape(*x.shape[:2], x.shape[3], -1)
        return by_channel(self.keys), by_channel(self.values)

    @property
    def batch(self) -> int:
        return self.token_ids.shape[0]

    @property
    def capacity(self) -> int:
        """Slots per row: the most positions a row can hold without growing the state."""
        return self.token_ids.shape[1]

    def prefixes(self) -> tuple[tuple[int, ...], ...]:
        """Each row's processed token ids (reads the state back to the host)."""
        ids, lengths = np.asarray(self.token_ids), np.asarray(self.lengths)
        return tuple(tuple(int(t) for t in row[:n]) for row, n in zip(ids, lengths))

    def row(self, b: int) -> KVState:
        """The state of row `b` alone, as a batch of one."""
        pick = lambda x, axis: jax.lax.slice_in_dim(x, b, b + 1, axis=axis)
        return self.replace(
            keys=pick(self.keys, 1), values=pick(self.values, 1),
            token_ids=pick(self.token_ids, 0), lengths=pick(self.lengths, 0),
        )  # fmt: skip

    def with_capacity(self, capacity: int) -> KVState:
        """The same prefix in a state with at least `capacity` slots (a new value; this one is untouched)."""
        extra = capacity - self.capacity
        if extra <= 0:
            return self
        grow = lambda x, axis: jnp.pad(x, [(0, extra if a == axis else 0) for a in range(x.ndim)])
        return self.replace(keys=grow(self.keys, 3), values=grow(self.values, 3), token_ids=grow(self.token_ids, 1))

    def require_identity(self, identity: StateIdentity) -> None:
        """Refuse a state made by another checkpoint, tokenizer or precision, naming the field."""
        for field in ("checkpoint_sha256", "tokenizer_sha256", "precision"):
            have, want = getattr(self, field), getattr(identity, field)
            if have != want:
                raise ApiError(f"state.{field}", f"the KVState was made with {have!r}, this model has {want!r}")
