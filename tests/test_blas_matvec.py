"""The one-row kernel (jgpt.kernels.blas_matvec, the plan's one_row="kernel"): the same products as XLA's dot and a
float64 reference, on odd shapes, through an OutputMajor projection and whole greedy decodes, and the plan that
turns it off."""

from __future__ import annotations

import dataclasses
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
from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_matvec
from jgpt.kernels.plan import XLA, Kernels
from jgpt.model.architecture import ModelArchitecture
from jgpt.model.kv_state import StateIdentity
from jgpt.model.layer_strategy import LayerStrategy
from jgpt.model.operations import dense
from jgpt.model.output_major import OutputMajor
from jgpt.model.weights import initialize

REPO = Path(__file__).resolve().parent.parent
# The kernel runs where the CPU has AVX-512F; elsewhere the auto plan says one_row="xla" and these parities compare
# XLA with itself, so the first test pins which of the two this machine is.
AVX512 = "avx512f" in Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else False
OVER_INPUTS = (((1,), (1,)), ((), ()))
# Vocabulary 261 (not a multiple of 4, 16 or the 2 parts of a 2-thread pool), width 40 (not a multiple of 16).
ODD = ModelArchitecture(vocabulary=261, width=40, ffn=88, context=48, layers=2, heads=4)


def planned_product(plan: Kernels):
    """One output-major projection under `plan`, as the forward pass multiplies it (`jgpt.model.operations.dense`)."""
    return lambda x, m: dense(x, OutputMajor(m), None, jnp.float32, plan.calls())


def xla_product(x, matrix):
    return jax.lax.dot_general(x, matrix, OVER_INPUTS, precision=jax.lax.Precision.HIGHEST)


def test_the_kernel_is_available_exactly_on_a_cpu_with_avx512f():
    assert blas_matvec.available() == (jax.default_backend() == "cpu" and AVX512)
    assert not blas_matvec.available("gpu")
    assert (Kernels.auto().one_row == "kernel") == blas_matvec.available()


# Outputs not a multiple of 4 (the loop's row group), 16 (a part's granule) or 2 (the pool's parts); inputs not a
# multiple of 16 (the masked tail), below 16, and GPT-2's output projection.
@pytest.mark.parametrize("outputs, inputs", [(1, 3), (7, 5), (131, 771), (259, 16), (1001, 40), (50257, 768)])
def test_one_row_through_an_output_major_matrix_matches_xla_and_float64_within_1e_5(outputs, inputs):
    keys = jax.random.split(jax.random.PRNGKey(outputs + inputs), 2)
    x = jax.random.normal(keys[0], (1, inputs))
    matrix = jax.random.normal(keys[1], (outputs, inputs)) / np.sqrt(inputs)
    kernel = jax.jit(planned_product(Kernels.auto()))
    assert ("jgpt_matvec" in kernel.lower(x, matrix).as_text()) == blas_matvec.available()
    got = np.asarray(kernel(x, matrix))
    reference = np.asarray(x, np.float64) @ np.asarray(matrix, np.float64).T
    scale = np.abs(reference).max()
    assert got.shape == (1, outputs)
    assert np.abs(got - reference).max() <= 1e-5 * scale
    assert np.abs(got - np.asarray(jax.jit(xla_product)(x, matrix))).max() <= 1e-5 * scale


def test_the_kernel_is_used_for_one_float32_row_only():
    matrix = jnp.ones((64, 32))
    auto = Kernels.auto()
    lowered = lambda x, plan=auto, dtype=jnp.float32: (
        jax.jit(lambda x: dense(x, OutputMajor(matrix), None, dtype, plan.calls())).lower(x).as_text()
    )
    assert ("jgpt_matvec" in lowered(jnp.ones((1, 32)))) == blas_matvec.available()
    assert "jgpt_matvec" not in lowered(jnp.ones((2, 32)))
    # A bfloat16 computation's operands are bf16-rounded float32 on a CPU (jgpt.model.bf16_matmul.operand): a float32
    # row again, which the kernel takes; where bfloat16 is native the rule keeps XLA's dot.
    assert ("jgpt_matvec" in lowered(jnp.ones((1, 32)), dtype=jnp.bfloat16)) == blas_matvec.available()
    assert "jgpt_matvec" not in lowered(jnp.ones((1, 32)), XLA)


def test_the_kernel_differentiates_and_vectorizes_as_xla_does():
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    x, matrix = jax.random.normal(keys[0], (1, 37)), jax.random.normal(keys[1], (150, 37))
    if not blas_matvec.available():
        with pytest.raises(RuntimeError, match="not available"):
            blas_matvec.matvec(x, matrix)
        return
    weights = jax.random.normal(keys[2], (1, 150))
    loss = lambda product: lambda x, m: jnp.sum(weights * product(x, m))
    got = jax.jit(jax.grad(loss(blas_matvec.matvec), argnums=(0, 1)))(x, matrix)
    expected = jax.jit(jax.grad(loss(xla_product), argnums=(0, 1)))(x, matrix)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-5 * float(np.abs(e).max()))
    rows = jax.random.normal(keys[2], (3, 1, 37))
    np.testing.assert_allclose(
        jax.jit(jax.vmap(blas_matvec.matvec, (0, None)))(rows, matrix),
        jax.vmap(xla_product, (0, None))(rows, matrix),
        rtol=0, atol=1e-5 * float(np.abs(rows).max() * np.abs(matrix).sum(1).max()),
    )  # fmt: skip


@pytest.mark.parametrize(
    "x, matrix, message",
    [((2, 8), (4, 8), "x \\[1, I\\]"), ((1, 8), (4, 9), "x \\[1, I\\]"), ((1, 8), (4, 8, 1), "x \\[1, I\\]")],
)
def test_the_kernel_rejects_other_shapes(x, matrix, message):
    with pytest.raises(ApiError, match=message):
        blas_matvec.matvec(jnp.ones(x), jnp.ones(matrix))


def test_the_kernel_rejects_other_dtypes():
    with pytest.raises(ApiError, match="float32"):
        blas_matvec.matvec(jnp.ones((1, 8), jnp.bfloat16), jnp.ones((4, 8)))


def test_a_greedy_decode_selects_the_same_ids_and_logits_with_the_kernel_on_and_off():
    weights = initialize(ODD, seed=7)[0]
    identity = StateIdentity("c", "t", "float32")
    on, off = (
        ModelExecution(weights, ODD, identity, strategy=LayerStrategy.unrolled_layers(True), kernels=plan)
        for plan in (Kernels.auto(), XLA)
    )
    assert on.kernels.one_row == ("kernel" if blas_matvec.available() else "xla") and off.kernels.one_row == "xla"
    requests = [InferenceRequest("r", (5, 17, 200, 3, 88, 260, 1), GenerationPolicy(24))]
    ids_on, ids_off = (generate(e, requests).responses[0].output_ids for e in (on, off))
    assert len(ids_on) == 24 and ids_on == ids_off
    # One decode step's logits, each side from its own prefill of the same prompt.
    (logits_on, _), (logits_off, _) = (e.decode(e.prefill([[5, 17, 200]])[1], [9]) for e in (on, off))
    reference = np.asarray(logits_off, np.float64)
    assert np.abs(np.asarray(logits_on) - reference).max() <= 1e-5 * np.abs(reference).max()


def test_no_environment_switch_and_held_weights_carry_only_the_layout(monkeypatch):
    """The plan alone says whether the kernel runs: the environment variable that once turned it off is not read,
    and an output-major projection holds its matrix and nothing else."""
    monkeypatch.setenv("JGPT_MATVEC_KERNEL", "0")
    assert Kernels.auto().one_row == ("kernel" if blas_matvec.available() else "xla")
    assert Kernels.named("xla").one_row == "xla"
    strategy = LayerStrategy.for_backend("cpu")
    assert strategy == LayerStrategy.unrolled_layers(output_major=True)
    held = strategy.held_weights(initialize(ODD, seed=1)[0])
    assert [f.name for f in dataclasses.fields(held.ff_up)] == ["matrix"]
    assert strategy.held_weights(held).ff_up is held.ff_up  # applying it twice copies nothing


def test_without_a_compiler_one_row_keeps_xlas_dot_silently(tmp_path):
    # A fresh process with no kernel cached and a compiler that does not exist: the auto plan says one_row="xla",
    # no warning, XLA's product.
    script = """
import warnings, jax, jax.numpy as jnp, numpy as np
warnings.simplefilter("error")
from jgpt.kernels import blas_matvec
from jgpt.kernels.plan import Kernels
from jgpt.model.operations import dense
from jgpt.model.output_major import OutputMajor
x, m = jnp.arange(40.0).reshape(1, 40) / 40, jnp.arange(280.0).reshape(7, 40) / 280
plan = Kernels.auto()
assert plan.one_row == "xla", plan
product = jax.jit(lambda x, m: dense(x, OutputMajor(m), None, jnp.float32, plan.calls()))
assert "jgpt_matvec" not in product.lower(x, m).as_text()
reference = np.asarray(x, np.float64) @ np.asarray(m, np.float64).T
assert np.abs(np.asarray(product(x, m)) - reference).max() <= 1e-5 * np.abs(reference).max()
print(blas_matvec.available())
"""
    env = {**os.environ, "CXX": str(tmp_path / "no-compiler"), "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
