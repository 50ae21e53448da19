"""OutputMajor: a dense projection's matrix held as `[outputs, inputs]`, the layout XLA on CPU multiplies fastest.

The stored weights keep the spec's `[inputs, outputs]` (`x @ W`). XLA's CPU dot is
slow on that layout for the few rows of a batched decode step: 16 rows through
GPT-2-small's projections run 2-3x faster as `W^T x^T` from an `[outputs, inputs]`
matrix. One row (a batch-1 decode step, a matrix-vector product bound by the bytes
it reads) and 512 rows (a prefill) run the same on either layout within the noise
(`bench/decode.py` prints each form's rate at 1, 16 and 512 rows). So an execution on CPU holds its
projections this way instead of as stored, converted once when it is bound
(`jgpt.model.layer_strategy.LayerStrategy.held_weights`), and
`jgpt.model.operations.dense` multiplies an OutputMajor as `(W^T x^T)^T` for a few rows.
For one row and for many (a prefill's hundreds) the same matrix is multiplied as
`x W` in one product without the barrier, which is faster there than the barrier
form (docs/inference.md, Speed).

This is the layout only: which kernel, if any, multiplies one row of it is the kernel
plan's choice (`jgpt.model.operations.dense`, `KernelCalls.one_row`).

The product is the same sum over the same inputs; only the order XLA adds them in
may differ (tested against `x @ W` to 1e-5).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32
# Rows from which `x W` (one product, no barrier) ran as fast as `(W^T x^T)^T` or faster on GPT-2-small's
# projections (quiet, alternating: the barrier form won at 16-64 rows, the two traded at 128, `x W` won at 256-512).
MANY_ROWS = 128


# A plain frozen dataclass registered by hand (not `jgpt.model.pytree.dataclass`) so the type checker sees its fields.
@functools.partial(jax.tree_util.register_dataclass, data_fields=["matrix"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class OutputMajor:
    matrix: jax.Array  # [..., O, I]: row o holds the input weights of output o (a leading layer axis, if stacked)

    @classmethod
    def of(cls, w: jax.Array) -> OutputMajor:
        """The transposed copy of a stored `[..., I, O]` projection (one layer or stacked), made outside jit."""
        return cls(_transposed(w))

    def stored(self) -> jax.Array:
        """The stored `[..., I, O]` layout again, as a new array."""
        return _transposed(self.matrix)

    @property
    def dtype(self):
        return self.matrix.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The held matrix's shape, `[..., O, I]`: the stored projection's with its last two axes swapped."""
        return tuple(self.matrix.shape)

    @property
    def ndim(self) -> int:
        return self.matrix.ndim

    def astype(self, dtype) -> OutputMajor:
        """Like `jax.Array.astype`, so matmul operands are formed the same way for both layouts."""
        return OutputMajor(self.matrix.astype(dtype))

    def product(self, x: jax.Array, precision) -> jax.Array:
        """x [N, I] -> x @ W [N, O] float32: as (W^T x^T)^T for a few rows (2 <= N < MANY_ROWS), else as x W."""
        over_inputs = (((1,), (1,)), ((), ()))
        if x.shape[0] == 1 or x.shape[0] >= MANY_ROWS:
            return jax.lax.dot_general(x, self.matrix, over_inputs, precision=precision, preferred_element_type=F32)
        y = jax.lax.dot_general(self.matrix, x, over_inputs, precision=precision, preferred_element_type=F32)  # [O, N]
        # The barrier keeps the product's [O, N] result: without it XLA folds the transpose into the dot's
        # output layout and runs the slow product again.
        return jax.lax.optimization_barrier(y).T


def _transposed(w: jax.Array) -> jax.Array:
    return jnp.asarray(np.ascontiguousarray(np.swapaxes(np.asarray(w), -1, -2)))
