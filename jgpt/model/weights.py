"""ModelWeights: the numerical tensors the model consumes, as one immutable pytree.

Leaf names are the spec's. Block tensors carry a leading layer axis `[layers, ...]`
so that the forward pass scans over it. Projections are stored `[in, out]`, so a
projection is `x @ w`. The Llama alternative has no biases (those fields are None;
with `attention_bias`, Qwen2's, it has `query_bias`, `key_bias` and `value_bias`)
and adds `ff_gate`, the gate projection SwiGLU needs; GPT has no `ff_gate` and Llama
has no `position_embedding` (its positions are rotary).

An execution may hold each projection and `lm_head` as a `jgpt.model.output_major.OutputMajor`
instead, the same matrix transposed (`LayerStrategy.held_weights`, CPU's layout for
serving); the forward pass reads either, and `jgpt.model.layer_strategy.stored_layout` turns
them back. Checkpoints, training and identities see the stored layout only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import integer
from jgpt.model import pytree as struct
from jgpt.model.architecture import Architecture, LlamaArchitecture

INITIALIZER = "normal(0.02); residual output projections normal(0.02/sqrt(2*layers)); biases 0; scales 1"


@struct.dataclass
class ModelWeights:
    token_embedding: jax.Array  # [V, C]
    position_embedding: jax.Array | None  # [context, C]
    ln1_scale: jax.Array  # [L, C]
    ln1_bias: jax.Array | None  # [L, C]
    query: jax.Array  # [L, C, H*D]
    query_bias: jax.Array | None  # [L, H*D]
    key: jax.Array  # [L, C, K*D]
    key_bias: jax.Array | None  # [L, K*D]
    value: jax.Array  # [L, C, K*D]
    value_bias: jax.Array | None  # [L, K*D]
    attention_output: jax.Array  # [L, H*D, C]
    attention_output_bias: jax.Array | None  # [L, C]
    ln2_scale: jax.Array  # [L, C]
    ln2_bias: jax.Array | None  # [L, C]
    ff_gate: jax.Array | None  # [L, C, F]
    ff_up: jax.Array  # [L, C, F]
    ff_up_bias: jax.Array | None  # [L, F]
    ff_down: jax.Array  # [L, F, C]
    ff_down_bias: jax.Array | None  # [L, C]
    ln_final_scale: jax.Array  # [C]
    ln_final_bias: jax.Array | None  # [C]
    lm_head: jax.Array  # [C, V]
    lm_bias: jax.Array | None  # [V]

    def as_dict(self) -> dict[str, jax.Array]:
        """The present tensors by name, in the fixed (sorted) order identities rely on."""
        present = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {name: present[name] for name in sorted(present) if present[name] is not None}

    @classmethod
    def from_dict(cls, tensors: Mapping[str, Any]) -> ModelWeights:
        """Weights from tensors by name (absent names are None): jax or numpy arrays as read or made, or
        `jax.ShapeDtypeStruct`s for a skeleton (`abstract_weights`); the leaves are whatever was given."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(tensors) - names)
        if unknown:
            raise ApiError(unknown[0], "is not a ModelWeights name")
        # None for every absent name, required or not: check_weights names a missing required tensor.
        fields: dict[str, Any] = {name: tensors.get(name) for name in names}
        return cls(**fields)

    def block(self) -> dict[str, jax.Array]:
        """The layer-indexed tensors, ready to be scanned over their leading axis."""
        return {name: value for name, value in self.as_dict().items() if name in BLOCK_NAMES}


BLOCK_NAMES = frozenset({
    "ln1_scale", "ln1_bias", "query", "query_bias", "key", "key_bias", "value", "value_bias",
    "attention_output", "attention_output_bias", "ln2_scale", "ln2_bias",
    "ff_gate", "ff_up", "ff_up_bias", "ff_down", "ff_down_bias",
})  # fmt: skip


def weight_shapes(architecture: Architecture) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the architecture needs, in the order of `as_dict`."""
    a = architecture
    L, V, C, F, Q, K = a.layers, a.vocabulary, a.width, a.ffn, a.heads * a.head_dim, a.kv_width
    shapes = {
        "token_embedding": (V, C),
        "ln1_scale": (L, C),
        "query": (L, C, Q),
        "key": (L, C, K),
        "value": (L, C, K),
        "attention_output": (L, Q, C),
        "ln2_scale": (L, C),
        "ff_up": (L, C, F),
        "ff_down": (L, F, C),
        "ln_final_scale": (C,),
        "lm_head": (C, V),
    }
    if a.position == "learned":
        shapes["position_embedding"] = (a.context, C)
    if a.activation == "swiglu":
        shapes["ff_gate"] = (L, C, F)
    if isinstance(a, LlamaArchitecture) and a.attention_bias:
        shapes |= {"query_bias": (L, Q), "key_bias": (L, K), "value_bias": (L, K)}
    if a.has_biases:
        shapes |= {
            "ln1_bias": (L, C),
            "query_bias": (L, Q),
            "key_bias": (L, K),
            "value_bias": (L, K),
            "attention_output_bias": (L, C),
            "ln2_bias": (L, C),
            "ff_up_bias": (L, F),
            "ff_down_bias": (L, C),
            "ln_final_bias": (C,),
            "lm_bias": (V,),
        }
    return dict(sorted(shapes.items()))


def parameter_count(architecture: Architecture) -> int:
    return sum(math.prod(shape) for shape in weight_shapes(architecture).values())


def abstract_weights(architecture: Architecture) -> ModelWeights:
    """Shape/dtype skeleton of the weights (float32), e.g. as a restore target."""
    return ModelWeights.from_dict(
        {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in weight_shapes(architecture).items()}
    )


def check_weights(weights: ModelWeights, architecture: Architecture) -> None:
    """Reject weights whose names, shapes or dtype do not fit the architecture, naming the tensor."""
    expected = weight_shapes(architecture)
    present = weights.as_dict()
    for name in sorted(set(expected) | set(present)):
        if name not in present:
            raise ApiError(name, "is missing from the weights")
        if name not in expected:
            raise ApiError(name, f"is not used by {type(architecture).__name__}")
        tensor = present[name]
        if tuple(tensor.shape) != expected[name]:
            raise ApiError(name, f"has shape {tuple(tensor.shape)}, the architecture needs {expected[name]}")
        if np.dtype(tensor.dtype) != np.float32:
            raise ApiError(name, f"has dtype {tensor.dtype}; weights are stored as float32")


@dataclasses.dataclass(frozen=True)
class InitializationProvenance:
    """How freshly initialized weights were made: the initializer, the kind, and the seed."""

    initializer: str
    kind: str
    seed: int | None  # None where no seed applies (imported weights)

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def initialize(architecture: Architecture, seed: int) -> tuple[ModelWeights, InitializationProvenance]:
    """GPT-2-style random initialization from an explicit seed.

    Projections writing into the residual stream are scaled by 1/sqrt(2*layers) so
    that the stream's variance does not grow with depth.
    """
    integer(seed, "seed", minimum=None)
    weights = _initial_weights(architecture, jax.random.key(seed))
    return weights, InitializationProvenance(initializer=INITIALIZER, kind="random", seed=seed)


@functools.partial(jax.jit, static_argnums=0)
def _initial_weights(architecture: Architecture, key: jax.Array) -> ModelWeights:
    # One draw for all matrices, sliced in name order: a single random-bits kernel
    # compiles far faster on CPU than one per tensor.
    residual_std = 0.02 / math.sqrt(2 * architecture.layers)
    shapes = weight_shapes(architecture)
    drawn = [name for name in shapes if not name.endswith(("_scale", "_bias"))]
    sizes = [math.prod(shapes[name]) for name in drawn]
    noise = dict(zip(drawn, jnp.split(jax.random.normal(key, (sum(sizes),), jnp.float32), np.cumsum(sizes)[:-1])))

    def make(name: str, shape: tuple[int, ...]) -> jax.Array:
        if name.endswith("_scale"):
            return jnp.ones(shape, jnp.float32)
        if name.endswith("_bias"):
            return jnp.zeros(shape, jnp.float32)
        std = residual_std if name in ("attention_output", "ff_down") else 0.02
        return std * noise[name].reshape(shape)

    return ModelWeights.from_dict({name: make(name, shape) for name, shape in shapes.items()})
