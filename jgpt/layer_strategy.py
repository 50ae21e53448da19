"""LayerStrategy: how the forward pass runs its decoder blocks, chosen by asking the backend.

Two ways, same results (tested to 1e-6):

* `LayerStrategy.unrolled_layers()`: straight-line code, one block after another, over
  each layer's own weight arrays (`per_layer_view`). No step slices a layer out of a
  stacked tensor, which XLA on CPU does by copying that layer's weights at every
  call. Measured on CPU (`bench/decode.py`, docs/inference.md), a decode step of
  the tiny GPT took 0.10 ms this way against 0.20-0.33 ms for a rolled scan and
  0.15-0.23 ms for a scan unrolled over the stacked tensors; at GPT-2-small size
  28.8-32.9 ms against 30-48 ms and 61-63 ms.
* `LayerStrategy.scan(unroll)`: one `lax.scan` over the layer axis of the stacked
  tensors: one compiled block however deep the model, over the weights as stored
  (no per-layer arrays), the layout tensor-parallel sharding splits.

`LayerStrategy.for_backend()` takes the first on CPU, where it was measured faster,
and the rolled scan on GPU and TPU, where nothing has been measured yet and the
scan is the compact program with no second layout of the weights.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jgpt.errors import ApiError
from jgpt.weights import ModelWeights


@dataclasses.dataclass(frozen=True)
class LayerStrategy:
    per_layer: bool  # straight-line blocks over per-layer arrays, else a scan over the stacked tensors
    unroll: int | bool = 1  # the scan's unroll (True: fully); 1 for per-layer blocks

    def __post_init__(self):
        flag = isinstance(self.unroll, bool)
        if not flag and (not isinstance(self.unroll, int) or self.unroll <= 0):
            raise ApiError("unroll", f"must be true, false or a positive integer, got {self.unroll!r}")
        if self.per_layer and (flag or self.unroll != 1):
            raise ApiError("unroll", "applies to the layer scan only; unrolled layers run each block once already")

    @classmethod
    def unrolled_layers(cls) -> LayerStrategy:
        return cls(per_layer=True)

    @classmethod
    def scan(cls, unroll: int | bool = 1) -> LayerStrategy:
        return cls(per_layer=False, unroll=unroll)

    @classmethod
    def for_backend(cls, backend: str | None = None) -> LayerStrategy:
        """The measured-faster unrolled layers on CPU; the rolled scan on GPU and TPU. `backend` defaults
        to `jax.default_backend()`."""
        return cls.unrolled_layers() if (backend or jax.default_backend()) == "cpu" else cls.scan()

    def layer_weights(self, weights: ModelWeights) -> tuple[dict[str, jax.Array], ...] | None:
        """What `forward(layer_weights=...)` takes under this strategy: the per-layer view, or None to scan."""
        return per_layer_view(weights) if self.per_layer else None

    def __str__(self) -> str:
        return "unrolled layers" if self.per_layer else f"scan (unroll={self.unroll})"


def per_layer_view(weights: ModelWeights) -> tuple[dict[str, jax.Array], ...]:
    """The block tensors as one dict of arrays per layer, for `forward(layer_weights=...)`. Call it outside jit.

    On a CPU device each layer's array is a view into the stacked tensor, so the weights are
    held once: a layer whose bytes start off XLA's 64-byte alignment (a bias of odd width) is
    copied. On other devices each layer is a copy of its slice.
    """
    block = weights.block()
    layers = next(iter(block.values())).shape[0]
    return tuple({name: _layer(tensor, i) for name, tensor in block.items()} for i in range(layers))


def _layer(tensor: jax.Array, index: int) -> jax.Array:
    devices = tensor.sharding.device_set
    if len(devices) == 1 and next(iter(devices)).platform == "cpu":
        # A CPU array reads back as a numpy view of its own buffer, and device_put may alias an aligned
        # slice of that view instead of copying it.
        return jax.device_put(np.asarray(tensor)[index], tensor.sharding, may_alias=True)
    return tensor[index]
