"""Inference at a chosen precision: the weights each step reads, and the KV state, stored in the compute dtype.

An artifact stores float32 weights; its architecture's `precision` is the dtype
of matmul operands (`jgpt.model.operations`). Serving in bfloat16 also halves what a
decode step reads: the projection matrices are stored in bfloat16 once, up
front, instead of being rounded at every step, and the KV state's buffers are
bfloat16 (`KVState.empty` takes the identity's precision, which `KVState`s are
bound to). The embedding tables stay float32: a step gathers a few rows of
them, and their rounding would enter the float32 residual stream. Norm scales
and biases stay float32 as well; they act on float32 values.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from inference.costs import GATHERED_TABLES
from inference.execution import ModelExecution
from jgpt.foundation.errors import ApiError
from jgpt.model.architecture import PRECISIONS
from jgpt.model.weights import BLOCK_NAMES


def at_precision(execution: ModelExecution, precision: str) -> ModelExecution:
    """`execution` computing, and storing its matrices and KV state, in `precision` (a PRECISIONS name).

    Arrays already stored in their dtype are kept as they are: an f32 model at f32 is not copied.
    """
    if precision not in PRECISIONS:
        raise ApiError("precision", f"unknown value {precision!r}; supported: {', '.join(PRECISIONS)}")
    dtype = jnp.dtype(precision)
    # A projection matrix is two-dimensional per layer (block tensors carry a leading layer axis).
    matrix = lambda name, x: x.ndim - (name in BLOCK_NAMES) == 2 and name not in GATHERED_TABLES
    store = lambda name, x: x.astype(dtype) if matrix(name, x) and x.dtype != dtype else x
    weights = execution.weights.from_dict({name: store(name, x) for name, x in execution.weights.as_dict().items()})
    return dataclasses.replace(
        execution,
        weights=weights,
        architecture=dataclasses.replace(execution.architecture, precision=precision),
        identity=dataclasses.replace(execution.identity, precision=precision),
    )
