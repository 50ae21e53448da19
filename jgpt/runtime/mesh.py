"""The device mesh: a `data` axis that splits the batch and a `model` axis that splits heads and hidden units.

`WEIGHT_ROLES` says where every ModelWeights tensor lives on a mesh. Each weight
matrix is split over the `model` axis along its heads, feed-forward units,
vocabulary or positions: Megatron-style tensor parallelism, in which the query,
key, value and feed-forward-up projections are split by output column, the
attention-output and feed-forward-down projections by input row, and XLA adds
one reduction after each of those two. Training (`fsdp=True`) also splits the
residual width over the `data` axis, FSDP-style: each data replica stores one
slice of every weight and of its optimizer moments, and XLA gathers what a step
needs. Inference (`fsdp=False`) keeps weights whole along the width. The model
itself is not changed: the placement is on the arrays, and jit compiles the
same forward pass as one SPMD program.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import is_integer

DATA_AXIS = "data"
MODEL_AXIS = "model"

# The two roles a weight dimension can have: SPLIT runs over heads, feed-forward units, vocabulary or
# positions (the model axis divides it); WIDTH is the residual width (the data axis divides it under FSDP).
SPLIT, WIDTH = "split", "width"
WEIGHT_ROLES: dict[str, tuple[str | None, ...]] = {
    "token_embedding": (SPLIT, WIDTH),
    "position_embedding": (SPLIT, WIDTH),
    "query": (None, WIDTH, SPLIT), "key": (None, WIDTH, SPLIT), "value": (None, WIDTH, SPLIT),
    "query_bias": (None, SPLIT), "key_bias": (None, SPLIT), "value_bias": (None, SPLIT),
    "attention_output": (None, SPLIT, WIDTH),
    "ff_gate": (None, WIDTH, SPLIT), "ff_up": (None, WIDTH, SPLIT), "ff_up_bias": (None, SPLIT),
    "ff_down": (None, SPLIT, WIDTH),
    "lm_head": (WIDTH, SPLIT), "lm_bias": (SPLIT,),
}  # fmt: skip


def mesh(model: int = 1, devices=None) -> Mesh:
    """`devices` (default: every device) as a `data x model` grid; adjacent devices share a model group."""
    devices = jax.devices() if devices is None else list(devices)
    if not is_integer(model) or model < 1 or len(devices) % model:
        raise ApiError("model_axis", f"{model!r} does not divide the {len(devices)} devices")
    return Mesh(np.array(devices).reshape(-1, model), (DATA_AXIS, MODEL_AXIS))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the data axis, the same on every model-axis device."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def leaf_name(path: tuple) -> str:
    """The last named key of a pytree path: a dict key, dataclass field or attribute."""
    for entry in reversed(path):
        for attribute in ("key", "name"):
            name = getattr(entry, attribute, None)
            if isinstance(name, str):
                return name
    return ""


def weight_spec(name: str, shape: tuple[int, ...], mesh: Mesh, fsdp: bool) -> PartitionSpec:
    """How one weight (or one of its optimizer moments) splits: its roles' axes, where they divide evenly."""
    roles = WEIGHT_ROLES.get(name)
    if roles is None or len(roles) != len(shape):
        return PartitionSpec()
    axes = {SPLIT: MODEL_AXIS, WIDTH: DATA_AXIS if fsdp else None, None: None}
    chosen = [axes[role] for role in roles]
    return PartitionSpec(
        *(a if a is not None and size % mesh.shape[a] == 0 else None for a, size in zip(chosen, shape))
    )


def tree_shardings(tree, mesh: Mesh, fsdp: bool):
    """NamedShardings for a pytree holding weights: ModelWeights, a training state, per-layer weight dicts.

    A leaf is placed by its last name (optimizer moments carry their weight's name): a stacked block
    tensor by its rule, one layer of it (`model.split_layers`) by the rule without the layer axis;
    anything else (norm scales, step counters) is replicated.
    """

    def place(path, leaf) -> NamedSharding:
        name, shape = leaf_name(path), tuple(np.shape(leaf))
        roles = WEIGHT_ROLES.get(name, ())
        if len(roles) == len(shape) + 1 and roles[0] is None:  # one layer of a stacked tensor
            return NamedSharding(mesh, PartitionSpec(*weight_spec(name, (1, *shape), mesh, fsdp)[1:]))
        return NamedSharding(mesh, weight_spec(name, shape, mesh, fsdp))

    return jax.tree_util.tree_map_with_path(place, tree)


def addressable_bytes(tree) -> int:
    """Bytes of `tree`'s arrays stored on the first device: what one device holds of it."""
    device = jax.devices()[0]
    return sum(
        shard.data.nbytes
        for leaf in jax.tree.leaves(tree)
        for shard in leaf.addressable_shards
        if shard.device == device
    )
