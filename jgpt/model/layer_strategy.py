"""LayerStrategy: how the forward pass runs its decoder blocks, chosen by asking the backend.

Two ways, same results (tested to 1e-6):

* `LayerStrategy.unrolled_layers()`: straight-line code, one block after another, over
  each layer's own weight arrays (`per_layer_view`). No step slices a layer out of a
  stacked tensor, which XLA on CPU does by copying that layer's weights at every
  call. On CPU a decode step runs about twice as fast this way as either scan
  (`bench/decode.py --strategies` times the three; docs/inference.md).
* `LayerStrategy.scan(unroll)`: one `lax.scan` over the layer axis of the stacked
  tensors: one compiled block however deep the model, over the weights as stored
  (no per-layer arrays), the layout tensor-parallel sharding splits.

`LayerStrategy.for_backend()` takes the first on CPU, where it is faster, and the
rolled scan on GPU and TPU, where nothing has been measured yet and the scan is the
compact program.

The weights an execution holds are the strategy's too (`held_weights`): as stored, or,
`output_major`, with every projection and the output projection transposed once to
`OutputMajor` (`[outputs, inputs]`, `jgpt/model/output_major.py`), which XLA on CPU
multiplies 2-3x faster for the few rows of a batched decode step and as fast for one
row or hundreds. The transposed matrices replace the stored ones, so the weights stay
held once; every path (unrolled layers, scan, prefill, decode, head) reads them.
`for_backend` takes them on CPU. Which kernels multiply them, if any, is the kernel plan's
choice (`jgpt.kernels.plan.Kernels`), not the layout's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import numpy as np

from jgpt.foundation.errors import ApiError
from jgpt.model import pytree as struct
from jgpt.model.output_major import OutputMajor
from jgpt.model.weights import ModelWeights

# The stored [inputs, outputs] projections of a block, and with the output projection what output-major weights
# hold transposed.
PROJECTIONS = ("query", "key", "value", "attention_output", "ff_gate", "ff_up", "ff_down")
HELD_OUTPUT_MAJOR = (*PROJECTIONS, "lm_head")
Tensor = jax.Array | OutputMajor  # a weight as held: stored, or (a projection) output-major


@struct.dataclass
class LayerView:
    """What `forward(layer_weights=...)` runs its blocks over instead of the stacked tensors."""

    layers: tuple[LayerWeights, ...]  # one layer's block tensors each


@dataclasses.dataclass(frozen=True)
class LayerStrategy:
    per_layer: bool  # straight-line blocks over per-layer arrays, else a scan over the stacked tensors
    unroll: int | bool = 1  # the scan's unroll (True: fully); 1 for per-layer blocks
    output_major: bool = False  # projections and the output projection held as OutputMajor (per-layer blocks only)

    def __post_init__(self):
        flag = isinstance(self.unroll, bool)
        if not flag and (not isinstance(self.unroll, int) or self.unroll <= 0):
            raise ApiError("unroll", f"must be true, false or a positive integer, got {self.unroll!r}")
        if self.per_layer and (flag or self.unroll != 1):
            raise ApiError("unroll", "applies to the layer scan only; unrolled layers run each block once already")
        if self.output_major and not self.per_layer:
            raise ApiError("output_major", "applies to unrolled layers only, where it was measured faster")

    @classmethod
    def unrolled_layers(cls, output_major: bool = False) -> LayerStrategy:
        return cls(per_layer=True, output_major=output_major)

    @classmethod
    def scan(cls, unroll: int | bool = 1) -> LayerStrategy:
        return cls(per_layer=False, unroll=unroll)

    @classmethod
    def for_backend(cls, backend: str | None = None) -> LayerStrategy:
        """The measured-faster unrolled, output-major layers on CPU; the rolled scan on GPU and TPU. `backend`
        defaults to `jax.default_backend()`."""
        return cls.unrolled_layers(output_major=True) if (backend or jax.default_backend()) == "cpu" else cls.scan()

    def held_weights(self, weights: ModelWeights) -> ModelWeights:
        """`weights` as an execution under this strategy holds them, once: output-major, every projection and
        the output projection transposed to OutputMajor in place of the stored array; else as given. Converts
        only what is not output-major already (a copy, made outside jit), so applying it twice costs nothing."""
        if not self.output_major:
            return weights
        return _with_projections(weights, lambda t: t if isinstance(t, OutputMajor) else OutputMajor.of(t))

    def layer_weights(self, weights: ModelWeights) -> LayerView | None:
        """What `forward(layer_weights=...)` takes under this strategy: the per-layer view of `held_weights(weights)`,
        or None to scan."""
        return LayerView(per_layer_view(self.held_weights(weights))) if self.per_layer else None

    def __str__(self) -> str:
        if self.per_layer:
            return "unrolled layers, output-major" if self.output_major else "unrolled layers"
        return f"scan (unroll={self.unroll})"


def stored_layout(weights: ModelWeights) -> ModelWeights:
    """`weights` with every OutputMajor projection back in the stored `[..., I, O]` layout (a copy of those)."""
    return _with_projections(weights, lambda t: t.stored() if isinstance(t, OutputMajor) else t)


def _with_projections(weights: ModelWeights, convert) -> ModelWeights:
    tensors = weights.as_dict()
    return ModelWeights.from_dict(
        tensors | {name: convert(tensors[name]) for name in HELD_OUTPUT_MAJOR if name in tensors}
    )


def per_layer_view(weights: ModelWeights) -> tuple[LayerWeights, ...]:
    """The block tensors as one mapping per layer, for `forward(layer_weights=...)`. Call it outside jit.

    The weights stay held once. A layer's array is a view into the stacked tensor where the
    device lets it be one: on CPU, shard by shard when the tensor is split over devices along
    another axis, if the layer's bytes start on XLA's 64-byte alignment. Any other layer (a
    bias of odd width, a tensor on a GPU or TPU) is read from the stacked tensor where the
    program uses it, which costs that slice's copy at every call instead of a second copy held.
    """
    block = weights.block()
    layers = next(iter(block.values())).shape[0]
    views = {name: [_layer_view(tensor, index) for index in range(layers)] for name, tensor in block.items()}
    return tuple(
        LayerWeights({name: view for name in block if (view := views[name][index]) is not None},
                     {name: tensor for name, tensor in block.items() if views[name][index] is None}, index)
        for index in range(layers)
    )  # fmt: skip


@jax.tree_util.register_pytree_with_keys_class
class LayerWeights(Mapping[str, Tensor]):
    """One layer's block tensors by name: its own arrays (views into the stacked tensors), and the stacked
    tensors of the rest, sliced at `index` where a name is read."""

    def __init__(self, own: dict[str, Tensor], stacked: dict[str, Tensor], index: int):
        self.own, self.stacked, self.index = own, stacked, index

    def __getitem__(self, name: str) -> Tensor:
        return self.own[name] if name in self.own else jax.tree.map(lambda t: t[self.index], self.stacked[name])

    def __iter__(self):
        return iter([*self.own, *self.stacked])

    def __len__(self) -> int:
        return len(self.own) + len(self.stacked)

    def tree_flatten_with_keys(self):
        children = [
            (jax.tree_util.DictKey(name), array) for part in (self.own, self.stacked) for name, array in part.items()
        ]
        return children, (tuple(self.own), tuple(self.stacked), self.index)

    @classmethod
    def tree_unflatten(cls, names, arrays):
        own, stacked, index = names
        return cls(dict(zip(own, arrays[: len(own)])), dict(zip(stacked, arrays[len(own) :])), index)


def _layer_view(tensor: Tensor, index: int) -> Tensor | None:
    """Layer `index` of a stacked tensor (or of an OutputMajor's stacked matrix) sharing its memory, or None."""
    if isinstance(tensor, OutputMajor):
        matrix = _view(tensor.matrix, index)
        return None if matrix is None else dataclasses.replace(tensor, matrix=matrix)
    return _view(tensor, index)


def _view(tensor: jax.Array, index: int) -> jax.Array | None:
    """Layer `index` of `tensor` sharing its memory, or None where it cannot."""
    sharding = _layer_sharding(tensor.sharding)
    shards = tensor.addressable_shards
    if sharding is None or not tensor.is_fully_addressable or any(s.device.platform != "cpu" for s in shards):
        return None
    parts = []
    for shard in shards:
        # A CPU buffer reads back as a numpy view of itself, and device_put may alias an aligned slice
        # of that view instead of copying it; where it copied, the layer has no view.
        part = jax.device_put(np.asarray(shard.data)[index], shard.device, may_alias=True)
        if part.unsafe_buffer_pointer() != shard.data.unsafe_buffer_pointer() + index * part.nbytes:
            return None
        parts.append(part)
    return jax.make_array_from_single_device_arrays(tensor.shape[1:], sharding, parts)


def _layer_sharding(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding | None:
    """How one layer of a stacked tensor lies over the devices: as the tensor does, less its layer axis
    (None where the layer axis itself is split, or the sharding is of another kind)."""
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return sharding
    if isinstance(sharding, jax.sharding.NamedSharding) and (not sharding.spec or sharding.spec[0] is None):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*sharding.spec[1:]))
    return None
