"""bfloat16 matmuls: on the backend's own bf16 units, or as float32 products of bf16-rounded operands.

A bf16 matmul that accumulates in float32 (`preferred_element_type=float32`)
computes, up to the order of its float32 sums, what a float32 matmul computes
on operands first rounded to bf16: a product of two bf16 values (8-bit
significands) is exact in float32 (24 bits). GPUs and TPUs have bf16 matrix
units, and there the real bf16 dot is the fast one. XLA's CPU backend has none:
it turns every bf16 dot into a float32 dot between conversions, and a bf16
train step ran slower than the float32 one (`bench/bf16_train_step.py`,
docs/accelerators.md). On a CPU the operands are rounded to bf16 and multiplied
as float32 instead: the float32 program plus the roundings (the shipped
recipe's train step compiles to a few more fusions and copies than in float32
this way, and to many more with bf16 dots).

`native` is the one place that asks the backend; `operand` forms every matmul
operand of `jgpt.model.operations` by its answer. The answer is taken when a function
is traced, so one compiled program holds one of the two forms.

What a bf16 compute dtype rounds: the operands of the dense products (the
query, key, value and attention-output projections, the feed-forward network
and the output projection), where nearly all of a step's FLOPs are. Attention's
own two products, the scores q·k and the softmax-weighted mix of the values,
take operands of at least float32 (`attention_dtype`), as standard mixed precision keeps
the attention logits and softmax in float32: rounding the softmax weights to
bf16 (8 significant bits) rounds the gradient reaching them too, and the
softmax backward takes differences of those. Measured on the shipped model's
development rows, this brought a bf16 gradient closer to the float32 one
(docs/accelerators.md). A bf16 KV state still stores keys and values in bf16;
they are widened for the products.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import jax
import jax.numpy as jnp

F32 = jnp.float32
# Backends without bf16 matrix units: `jax.default_backend()` names.
ROUNDED_BACKENDS: tuple[str, ...] = ("cpu",)


def native(backend: str | None = None) -> bool:
    """Whether `backend` (default: JAX's default backend) multiplies bf16 operands on its own units."""
    return (backend or jax.default_backend()) not in ROUNDED_BACKENDS


def attention_dtype(dtype) -> jnp.dtype:
    """The operand dtype of attention's products (scores and value mix) under compute dtype `dtype`:
    at least float32 (bf16 widens, a float64 reference stays float64)."""
    return jnp.promote_types(dtype, F32)


class Held(Protocol):
    """A matrix as held (a jax.Array or an OutputMajor): what forming an operand reads."""

    @property
    def dtype(self) -> Any: ...

    def astype(self: H, dtype: Any) -> H: ...


H = TypeVar("H", bound=Held)


def operand(x: H, dtype) -> H:
    """`x` as a matmul operand of compute dtype `dtype`: rounded to it and, on a backend without native
    units for it, widened back to float32 (exactly: every bf16 value is a float32 value)."""
    x = x.astype(dtype)
    return x.astype(F32) if x.dtype == jnp.bfloat16 and not native() else x
