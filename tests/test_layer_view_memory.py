"""The weights are held once: every array the per-layer view owns lies inside the stacked tensors'
buffers (checked by buffer address, shard by shard), whatever the widths and however the weights are
split over devices (a layer that cannot be a view is read from the stacked tensor instead), and an
execution holding its projections output-major holds them in place of the stored ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from inference.execution import ModelExecution
from jgpt.model.architecture import ModelArchitecture
from jgpt.model.kv_state import KVBuffers, StateIdentity
from jgpt.model.layer_strategy import LayerStrategy, per_layer_view
from jgpt.model.output_major import OutputMajor
from jgpt.model.transformer import forward
from jgpt.model.weights import initialize, parameter_count

REPO = Path(__file__).resolve().parent.parent
# Widths of 36 and 68 floats: a layer of a bias or norm scale starts off XLA's 64-byte alignment.
ODD = ModelArchitecture(vocabulary=61, width=36, ffn=68, context=24, layers=3, heads=2)
FORWARD = jax.jit(forward, static_argnames=("architecture", "observe", "unroll"))


def bytes_outside(view, stacked: dict) -> tuple[int, int]:
    """(bytes of the view's own arrays inside their stacked tensor's buffers, bytes outside them)."""
    inside = outside = 0
    for layer in view:
        for name, array in layer.own.items():
            for shard in array.addressable_shards:
                buffers = [(s.data.unsafe_buffer_pointer(), s.data.nbytes) for s in stacked[name].addressable_shards
                           if s.device == shard.device]  # fmt: skip
                start = shard.data.unsafe_buffer_pointer()
                if any(base <= start < base + size for base, size in buffers):
                    inside += shard.data.nbytes
                else:
                    outside += shard.data.nbytes
    return inside, outside


def test_odd_widths_keep_one_copy_and_read_the_unaligned_layers_from_the_stacked_tensors():
    weights = initialize(ODD, seed=2)[0]
    view = per_layer_view(weights)
    inside, outside = bytes_outside(view, weights.block())
    assert outside == 0 and inside > 0
    assert {name for layer in view for name in layer.stacked} >= {"ln1_scale", "query_bias"}  # off alignment
    assert {name for layer in view for name in layer.own} >= {"query", "ff_up"}  # matrices stay views
    for index, layer in enumerate(view):
        for name, stacked in weights.block().items():
            np.testing.assert_array_equal(layer[name], stacked[index])
    ids = jnp.asarray(np.random.default_rng(0).integers(0, ODD.vocabulary, (2, 7)), jnp.int32)
    scanned = FORWARD(weights, ODD, ids, cache=KVBuffers.empty(ODD, 2, 10)).logits
    layers = LayerStrategy.unrolled_layers().layer_weights(weights)  # the blocks run over the view
    unrolled = FORWARD(weights, ODD, ids, cache=KVBuffers.empty(ODD, 2, 10), layer_weights=layers).logits
    np.testing.assert_allclose(unrolled, scanned, atol=1e-6, rtol=0)


def held_bytes(tree) -> int:
    """Bytes of memory the arrays of `tree` occupy, a view inside another array's buffer counted once."""
    spans = sorted((s.data.unsafe_buffer_pointer(), s.data.nbytes) for leaf in jax.tree.leaves(tree)
                   for s in leaf.addressable_shards)  # fmt: skip
    total, covered = 0, 0
    for start, size in spans:
        total += max(0, start + size - max(start, covered))
        covered = max(covered, start + size)
    return total


def test_an_execution_holds_its_weights_once_in_the_output_major_layout():
    weights = initialize(ODD, seed=4)[0]
    identity = StateIdentity("c", "t", "float32")
    execution = ModelExecution(weights, ODD, identity, strategy=LayerStrategy.unrolled_layers(output_major=True))
    assert isinstance(execution.weights.ff_up, OutputMajor) and isinstance(execution.weights.lm_head, OutputMajor)
    held = (execution.weights, execution.layer_weights)
    assert held_bytes(held) == 4 * parameter_count(ODD)
    # The measure counts a second copy: the stored weights beside the execution's are twice the matrices.
    assert held_bytes((weights, *held)) > held_bytes(held) + 4 * ODD.vocabulary * ODD.width
    ids = [[3, 9, 27, 1, 5], [8, 2]]
    stored = ModelExecution(weights, ODD, identity, strategy=LayerStrategy.unrolled_layers())
    np.testing.assert_allclose(execution.prefill(ids)[0], stored.prefill(ids)[0], atol=1e-5, rtol=0)


def test_tensor_parallel_weights_are_held_once():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, __file__], cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    inside, outside = json.loads(done.stdout)
    assert outside == 0 and inside > 0


def _tensor_parallel_view() -> tuple[int, int]:
    """Bytes of a 2-way tensor-parallel execution's per-layer view inside and outside its split weights."""
    from inference.tensor_parallel import TensorParallelExecution
    from jgpt.runtime.mesh import mesh

    architecture = ModelArchitecture(vocabulary=260, width=32, ffn=64, context=64, layers=2, heads=4)
    one = ModelExecution(initialize(architecture, 3)[0], architecture, StateIdentity("c", "t", "float32"),
                         strategy=LayerStrategy.unrolled_layers())  # fmt: skip
    split = TensorParallelExecution.over(one, mesh(2))
    views = [leaf for leaf in jax.tree.leaves(split.layer_weights, is_leaf=lambda x: hasattr(x, "own"))
             if hasattr(leaf, "own")]  # fmt: skip
    return bytes_outside(views, split.weights.block())


if __name__ == "__main__":
    print(json.dumps(_tensor_parallel_view()))
