"""OutputMajor: a dense projection's matrix held as `[outputs, inputs]`, the layout XLA on CPU multiplies fastest.

The stored weights keep the spec's `[inputs, outputs]` (`x @ W`). XLA's CPU dot is
slow on that layout for the few rows of a batched decode step: measured on the
development machine (2 cores, loaded, min of 5-20 calls), 16 rows through
GPT-2-small's output projection [768, 50257] took 137-203 ms as `x @ W` and
52-76 ms as `W^T x^T` from a `[50257, 768]` copy, a feed-forward matrix
[768, 3072] 2.5 against 1.4 ms; one row and 512 rows (a prefill) ran the same
either way. So an execution may hold a transposed copy of its projections
(`jgpt.layer_strategy`), and `jgpt.operations.dense` multiplies an OutputMajor
as `(W^T x^T)^T`.

The product is the same sum over the same inputs; only the order XLA adds them
in may differ (tested against `x @ W` to 1e-5).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32


# A plain frozen dataclass registered by hand (not `jgpt.pytree.dataclass`) so the type checker sees its fields.
@functools.partial(jax.tree_util.register_dataclass, data_fields=["matrix"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class OutputMajor:
    matrix: jax.Array  # [O, I]: row o holds the input weights of output o

    @classmethod
    def of(cls, w: jax.Array) -> OutputMajor:
        """A transposed copy of a stored `[I, O]` projection, made once, outside jit."""
        return cls(jnp.asarray(np.ascontiguousarray(np.asarray(w).T)))

    @property
    def dtype(self):
        return self.matrix.dtype

    def astype(self, dtype) -> OutputMajor:
        """Like `jax.Array.astype`, so matmul operands are formed the same way for both layouts."""
        return OutputMajor(self.matrix.astype(dtype))

    def product(self, x: jax.Array, precision) -> jax.Array:
        """x [N, I] -> x @ W [N, O] float32, computed as (W^T x^T)^T."""
        over_inputs = (((1,), (1,)), ((), ()))
        y = jax.lax.dot_general(self.matrix, x, over_inputs, precision=precision, preferred_element_type=F32)  # [O, N]
        # The barrier keeps the product's [O, N] result: without it XLA folds the transpose into the dot's
        # output layout and runs the slow product again.
        return jax.lax.optimization_barrier(y).T
