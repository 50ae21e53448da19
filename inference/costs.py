"""Analytic work counts of forward work: matmul FLOPs and logical memory bytes.

Definitions (the spec's, made exact here; `docs/recorded-computations.md` repeats them):

* `matmul_flops` counts two FLOPs per multiply-add of the dense projections
  (query, key, value, attention output, feed-forward matrices, lm_head) and of the
  attention matmuls (scores QK^T and the weighted sum over values), excluding
  normalization, activations and softmax. Attention is counted causally: a query at
  position p meets the p + 1 keys of positions 0..p, or under a sliding window W the
  min(p + 1, W) keys of positions p - W + 1..p. Every processed position is
  projected to logits, because the forward pass computes them all.
* `reference_matmul_flops` of a work that ends at position e - 1 is what a
  full-prefix recompute of positions 0..e-1 would cost.
* `logical_memory_bytes` are the bytes a work must move at least: every weight read
  once (embedding tables only for the rows gathered), and for each processed
  position its embedding rows, the keys and values of the positions before it that
  it attends to read, its own keys and values written, and its logits written.

Costs split into a part fixed per work and a part per processed position that
depends only on the position, so the cost of any prefix reuse is a sum.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jgpt.model.architecture import Architecture, LlamaArchitecture
from jgpt.model.weights import ModelWeights

# Tables read one row per position, not as a whole.
GATHERED_TABLES = ("token_embedding", "position_embedding")
LOGITS_ITEMSIZE = 4  # logits are float32 at every precision


def _arithmetic_series(start: int, stop: int) -> int:
    """sum(range(start, stop))."""
    return (stop * (stop - 1) - start * (start - 1)) // 2


def _visible_keys(start: int, stop: int, window: int | None) -> int:
    """sum(min(p + 1, window) for p in range(start, stop)): the keys the queries of positions start..stop-1 meet."""
    if window is None:
        return _arithmetic_series(start + 1, stop + 1)
    growing = min(stop, max(start, window - 1))  # positions below window - 1 meet p + 1 < window keys
    return _arithmetic_series(start + 1, growing + 1) + window * (stop - growing)


@dataclasses.dataclass(frozen=True)
class WorkCosts:
    """The analytic cost model of one model at one precision."""

    dense_flops_per_position: int  # all dense projections of one position, lm_head included
    attention_flops_per_key: int  # QK^T and weights@V over all layers, per visible key
    fixed_memory_bytes: int  # weights read once per work
    row_bytes_per_position: int  # embedding rows read and logits written per position
    kv_bytes_per_position: int  # keys and values of one position over all layers
    window: int | None = None  # the sliding window bounding the keys a query meets, if any

    @classmethod
    def of(cls, architecture: Architecture, weights: ModelWeights, kv_itemsize: int) -> WorkCosts:
        a = architecture
        feed_forward_matrices = 3 if a.activation == "swiglu" else 2
        per_layer = (
            2 * a.width * (2 * a.heads * a.head_dim + 2 * a.kv_width) + feed_forward_matrices * 2 * a.width * a.ffn
        )
        tensors = weights.as_dict()
        nbytes = lambda x: int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
        gathered = [tensors[name] for name in GATHERED_TABLES if name in tensors]
        return cls(
            dense_flops_per_position=a.layers * per_layer + 2 * a.width * a.vocabulary,
            attention_flops_per_key=a.layers * 2 * 2 * a.heads * a.head_dim,
            fixed_memory_bytes=sum(nbytes(x) for name, x in tensors.items() if name not in GATHERED_TABLES),
            row_bytes_per_position=sum(nbytes(t) // t.shape[0] for t in gathered) + a.vocabulary * LOGITS_ITEMSIZE,
            kv_bytes_per_position=2 * a.layers * a.kv_width * kv_itemsize,
            window=a.attention_window if isinstance(a, LlamaArchitecture) else None,
        )

    def position_matmul_flops(self, position: int) -> int:
        return self.dense_flops_per_position + self.attention_flops_per_key * _visible_keys(
            position, position + 1, self.window
        )

    def position_memory_bytes(self, position: int) -> int:
        # Read the K/V of the earlier positions it attends to, write its own.
        return self.row_bytes_per_position + self.kv_bytes_per_position * _visible_keys(
            position, position + 1, self.window
        )

    def matmul_flops(self, start: int, stop: int) -> int:
        """Processing positions start..stop-1 with positions 0..start-1 already in the state."""
        return self.dense_flops_per_position * (stop - start) + self.attention_flops_per_key * _visible_keys(
            start, stop, self.window
        )

    def reference_matmul_flops(self, stop: int) -> int:
        """A full-prefix recompute of positions 0..stop-1."""
        return self.matmul_flops(0, stop)

    def memory_bytes(self, start: int, stop: int) -> int:
        return (
            self.fixed_memory_bytes
            + self.row_bytes_per_position * (stop - start)
            + self.kv_bytes_per_position * _visible_keys(start, stop, self.window)
        )
