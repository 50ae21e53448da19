"""The fused batch-1 decode blocks (jgpt.kernels.fused_decode, the plan's decode="fused"): the same stream, cache and
selected ids as XLA's blocks, for the GPT baseline and for Llama (grouped key/value heads too), where its rule admits
a pass and nowhere else, and an auto plan of XLA's blocks, silently, where it cannot be built."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference.execution import ModelExecution
from inference.generation import generate
from inference.policy import GenerationPolicy, InferenceRequest
from jgpt.kernels import fused_decode
from jgpt.kernels.plan import XLA, Kernels
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.kv_state import KVBuffers, StateIdentity
from jgpt.model.layer_strategy import LayerStrategy, LayerWeights
from jgpt.model.transformer import forward
from jgpt.model.weights import initialize

REPO = Path(__file__).resolve().parent.parent
AVX512 = "avx512f" in Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else False
# Heads of 28 (one vector and a masked part) and widths, an ffn and a vocabulary that are not multiples of 16, of
# the loop's 4-row groups or of a 2-thread split; layers of about 1 MB, so fused_decode.SMALLEST_BYTES lets them in.
GPT = ModelArchitecture(vocabulary=97, width=168, ffn=420, context=40, layers=3, heads=6)
# Heads of 24, two query heads per key/value head.
LLAMA = LlamaArchitecture(vocabulary=97, width=192, ffn=400, context=40, layers=3, heads=8, kv_heads=4)
ARCHITECTURES = {
    "gpt, gelu": GPT,
    "gpt, gelu_tanh": ModelArchitecture(**{**GPT.to_json(), "activation": "gelu_tanh"}),
    "llama, grouped": LLAMA,
    "llama": LlamaArchitecture(**{**LLAMA.to_json(), "kv_heads": 8}),
}
SLOTS = 24
OUTPUT_MAJOR = LayerStrategy.unrolled_layers(output_major=True)
AUTO = Kernels.auto()


@functools.cache
def decode_step(name: str, plan: Kernels):
    """One decode step of the architecture `name` with its seed-3 weights under `plan`, jitted once for every
    position and cache a case gives it."""
    architecture = ARCHITECTURES[name]
    weights = initialize(architecture, seed=3)[0]
    held, layers = OUTPUT_MAJOR.held_weights(weights), OUTPUT_MAJOR.layer_weights(weights)
    calls = plan.calls()
    return jax.jit(lambda ids, p, c: forward(held, architecture, ids, positions=p, cache=c, layer_weights=layers,
                                             kernels=calls))  # fmt: skip


def one_step(name: str, plan: Kernels, position: int, cache: KVBuffers):
    step = decode_step(name, plan)
    args = (jnp.array([[5]], jnp.int32), jnp.array([[position]], jnp.int32), cache)
    return step(*args), "jgpt_fused_decode" in step.lower(*args).as_text()


def random_cache(architecture, seed: int) -> KVBuffers:
    a = architecture
    keys, values = jax.random.normal(jax.random.PRNGKey(seed), (2, a.layers, 1, a.kv_heads, SLOTS, a.head_dim))
    return KVBuffers(keys=keys, values=values)


def test_the_kernel_is_available_exactly_on_a_cpu_with_avx512f():
    assert fused_decode.available() == (jax.default_backend() == "cpu" and AVX512)
    assert not fused_decode.available("gpu")
    assert (AUTO.decode == "fused") == fused_decode.available()


# Positions: the first slot, one inside, the last slot, and past the cache (the write is dropped, every slot seen).
@pytest.mark.parametrize("name", ARCHITECTURES)
@pytest.mark.parametrize("position", [0, 9, SLOTS - 1, SLOTS + 6])
def test_one_step_matches_xlas_blocks_within_1e_5(name, position):
    cache = random_cache(ARCHITECTURES[name], position)
    (got, used), (want, not_used) = (one_step(name, plan, position, cache) for plan in (AUTO, XLA))
    assert used == fused_decode.available() and not not_used
    for name, g, w in (("logits", got.logits, want.logits), ("keys", got.cache.keys, want.cache.keys),
                       ("values", got.cache.values, want.cache.values)):  # fmt: skip
        w = np.asarray(w, np.float64)
        assert np.abs(np.asarray(g) - w).max() <= 1e-5 * np.abs(w).max(), name
    # The new key lands in slot `position` of every layer (or nowhere past the cache); every other slot is kept.
    changed = np.any(np.asarray(got.cache.keys) != np.asarray(cache.keys), axis=(0, 1, 2, 4))
    assert changed.tolist() == [slot == position for slot in range(SLOTS)]


@pytest.mark.parametrize("a", [GPT, LLAMA], ids=["gpt", "llama"])
def test_a_greedy_generation_selects_the_same_ids_with_the_fused_blocks_and_with_xlas(a):
    weights = initialize(a, seed=11)[0]
    identity = StateIdentity("c", "t", "float32")
    on, off = (ModelExecution(weights, a, identity, strategy=OUTPUT_MAJOR, kernels=plan) for plan in (AUTO, XLA))
    assert on.kernels.decode == AUTO.decode and off.kernels.decode == "xla"
    requests = [InferenceRequest("r", (5, 17, 90, 3, 88, 60, 1), GenerationPolicy(30))]
    ids_on, ids_off = (generate(e, requests).responses[0].output_ids for e in (on, off))
    assert len(ids_on) == 30 and ids_on == ids_off
    (logits_on, state_on), (logits_off, state_off) = (e.decode(e.prefill([[5, 17, 90]])[1], [9]) for e in (on, off))
    reference = np.asarray(logits_off, np.float64)
    assert np.abs(np.asarray(logits_on) - reference).max() <= 1e-5 * np.abs(reference).max()
    assert int(state_on.lengths[0]) == int(state_off.lengths[0]) == 4


def test_its_rule_admits_one_float32_token_over_output_major_layers_only():
    weights = initialize(GPT, seed=1)[0]
    layers = OUTPUT_MAJOR.layer_weights(weights).layers
    assert fused_decode.admits(GPT, 1, jnp.float32, layers)
    assert not fused_decode.admits(GPT, 2, jnp.float32, layers)  # two rows, or two tokens of one row
    assert not fused_decode.admits(GPT, 1, jnp.bfloat16, layers)  # a bf16 KV state
    assert not fused_decode.admits(GPT, 1, jnp.float32, None)  # the layer scan
    stored = LayerStrategy.unrolled_layers(output_major=False)
    assert not fused_decode.admits(GPT, 1, jnp.float32, stored.layer_weights(weights).layers)
    bf16 = ModelArchitecture(**{**GPT.to_json(), "precision": "bfloat16"})
    assert not fused_decode.admits(bf16, 1, jnp.float32, layers)
    llama_layers = OUTPUT_MAJOR.layer_weights(initialize(LLAMA, seed=1)[0]).layers
    assert fused_decode.admits(LLAMA, 1, jnp.float32, llama_layers)
    assert not fused_decode.admits(GPT, 1, jnp.float32, llama_layers)  # not the tensors the architecture has
    small = ModelArchitecture(vocabulary=97, width=64, ffn=128, context=40, layers=2, heads=4)  # 0.26 MB of blocks
    small_layers = OUTPUT_MAJOR.layer_weights(initialize(small, seed=1)[0]).layers
    assert not fused_decode.admits(small, 1, jnp.float32, small_layers)
    # What no pass of an execution can use, its plan says it does not: bound once, as the evidence records it.
    fused = Kernels(decode="fused")
    assert fused.for_execution(GPT, output_major=True).decode == "fused"
    for architecture, output_major in ((GPT, False), (bf16, True), (small, True)):
        assert fused.for_execution(architecture, output_major).decode == "xla"
    assert XLA.calls().decode_blocks is None


def test_observing_a_step_runs_xlas_blocks():
    weights = initialize(GPT, seed=2)[0]
    held, layers, calls = OUTPUT_MAJOR.held_weights(weights), OUTPUT_MAJOR.layer_weights(weights), AUTO.calls()
    step = jax.jit(lambda ids, p, c: forward(held, GPT, ids, positions=p, cache=c, layer_weights=layers, observe=True,
                                             kernels=calls))  # fmt: skip
    lowered = step.lower(jnp.array([[5]], jnp.int32), jnp.array([[3]], jnp.int32), random_cache(GPT, 0)).as_text()
    assert "jgpt_fused_decode" not in lowered


def test_blocks_reject_shapes_the_architecture_does_not_have():
    weights = initialize(GPT, seed=2)[0]
    layers = OUTPUT_MAJOR.layer_weights(weights).layers
    cache = random_cache(GPT, 0)
    with pytest.raises(ValueError, match="takes x"):
        fused_decode.blocks(jnp.ones((2, GPT.width)), jnp.int32(0), cache.keys, cache.values, layers, GPT)
    with pytest.raises(ValueError, match="takes x"):
        fused_decode.blocks(jnp.ones((1, GPT.width)), jnp.int32(0), cache.keys[:2], cache.values[:2], layers, GPT)
    with pytest.raises(ValueError, match="layers' weights"):
        fused_decode.blocks(jnp.ones((1, GPT.width)), jnp.int32(0), cache.keys, cache.values, layers[:2], GPT)
    x = jnp.ones((1, GPT.width))
    missing = LayerWeights({n: t for n, t in layers[0].items() if n != "ln2_bias"}, {}, 0)
    with pytest.raises(ValueError, match="layer 0 holds"):
        fused_decode.blocks(x, jnp.int32(0), cache.keys, cache.values, (missing, *layers[1:]), GPT)
    # A stored (not output-major) projection, a wrong-sized bias, a bfloat16 scale: each refused before the kernel
    # reads it.
    stored = LayerStrategy.unrolled_layers(output_major=False).layer_weights(initialize(GPT, seed=2)[0]).layers
    for name, tensor, message in (
        ("query", stored[1]["query"], "output-major"),
        ("ff_up_bias", jnp.ones(GPT.ffn - 1), r"ff_up_bias is float32 \(419,\)"),
        ("ln1_scale", jnp.ones(GPT.width, jnp.bfloat16), "ln1_scale is bfloat16"),
    ):
        bad = LayerWeights({**dict(layers[1].items()), name: tensor}, {}, 1)
        with pytest.raises(ValueError, match=message):
            fused_decode.blocks(x, jnp.int32(0), cache.keys, cache.values, (layers[0], bad, layers[2]), GPT)


def test_without_a_compiler_decode_keeps_xlas_blocks_silently(tmp_path):
    # A fresh process with no kernel cached and a compiler that does not exist: no kernel, no warning, an auto plan
    # of XLA's blocks (though the pass is one the kernel's rule admits).
    script = """
import warnings, jax, jax.numpy as jnp
warnings.simplefilter("error")
from jgpt.model.architecture import ModelArchitecture
from jgpt.kernels import fused_decode
from jgpt.kernels.plan import Kernels
from jgpt.model.layer_strategy import LayerStrategy
from jgpt.model.weights import initialize
a = ModelArchitecture(vocabulary=97, width=168, ffn=420, context=40, layers=3, heads=6)
layers = LayerStrategy.unrolled_layers(output_major=True).layer_weights(initialize(a, seed=1)[0])
print(fused_decode.available(), fused_decode.admits(a, 1, jnp.float32, layers.layers), Kernels.auto().decode)
"""
    env = {**os.environ, "CXX": str(tmp_path / "no-compiler"), "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "xla"]
