"""The kernel plan (jgpt.kernels.plan.Kernels): one frozen value, resolved once, recorded, and parity both ways.

Parity (tools/kernel_parity.py computes the table): every kernel against the pure-JAX plan within 1e-5 of the
reference's largest magnitude (outputs, and every gradient of a train step's loss where it trains); with every
kernel's loader failing (a CPU without AVX-512F, no compiler) an execution's auto plan is the xla plan, and its
results are the xla plan's bit for bit, while a training plan that names a kernel is refused.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from inference.execution import ModelExecution
from inference.generation import generate
from inference.policy import GenerationPolicy, InferenceRequest
from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_matvec, fused_decode, plan
from jgpt.kernels.plan import XLA, Kernels
from jgpt.model.kv_state import StateIdentity
from jgpt.model.layer_strategy import LayerStrategy
from jgpt.model.operations import REFERENCE
from jgpt.model.weights import initialize
from training import config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import kernel_parity  # noqa: E402

TOLERANCE = 1e-5
REPO = Path(__file__).resolve().parents[1]


def test_the_plan_is_a_frozen_validated_value_with_the_reference_as_default():
    assert XLA == Kernels() and XLA.to_json() == {"products": "xla", "attention": "full", "decode": "xla",
                                                  "one_row": "xla"}  # fmt: skip
    assert XLA.calls() == REFERENCE  # the reference plan plugs nothing in
    with pytest.raises(dataclasses.FrozenInstanceError):
        XLA.decode = "fused"  # type: ignore[misc]
    for field, value in (("products", "mkl"), ("attention", "flash"), ("decode", "yes"), ("one_row", True)):
        with pytest.raises(ApiError, match=f"kernels.{field}"):
            Kernels(**{field: value})
    with pytest.raises(ApiError, match="kernels"):
        Kernels.named("fast")
    assert Kernels.named("xla") == XLA
    # The training configuration spells the same choices without importing jax.
    assert (config.PRODUCTS, config.ATTENTIONS) == (plan.PRODUCTS, plan.ATTENTIONS)


def test_the_reference_computation_loads_no_kernel_module_even_indirectly():
    script = "import sys, jgpt.model.transformer, jgpt.model.operations; print(sorted(m for m in sys.modules if m.startswith('jgpt.kernels')))"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]"]


def test_auto_is_resolved_once_to_what_runs_here():
    auto = Kernels.named("auto")
    assert auto == Kernels(decode="fused" if fused_decode.available() else "xla",
                           one_row="kernel" if blas_matvec.available() else "xla")  # fmt: skip
    assert (auto.products, auto.attention) == ("xla", "full")  # the shipped models' training arithmetic
    assert (auto.calls().decode_blocks is not None) == fused_decode.available()
    assert (auto.calls().one_row is not None) == blas_matvec.available()


def test_with_the_kernels_unavailable_auto_is_the_xla_plan_and_an_execution_computes_its_results():
    a = kernel_parity.DECODE_MODELS["gpt"]
    weights, identity = initialize(a, seed=5)[0], StateIdentity("c", "t", "float32")
    strategy = LayerStrategy.unrolled_layers(output_major=True)
    with kernel_parity.kernels_unavailable():
        assert Kernels.auto() == XLA
        fallen_back = ModelExecution(weights, a, identity, strategy=strategy)  # the default plan: auto
    assert fallen_back.kernels == XLA and fallen_back.kernels.to_json() == XLA.to_json()  # what evidence records
    reference = ModelExecution(weights, a, identity, strategy=strategy, kernels=XLA)
    requests = [InferenceRequest("r", (5, 17, 90, 3), GenerationPolicy(6))]
    assert (
        generate(fallen_back, requests).responses[0].output_ids == generate(reference, requests).responses[0].output_ids
    )
    (got, _), (want, _) = (e.decode(e.prefill([[5, 17, 90]])[1], [9]) for e in (fallen_back, reference))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_each_kernel_matches_the_xla_plan_here_and_the_reference_runs_where_it_is_unavailable():
    rows = kernel_parity.table()
    assert {r.kernel for r in rows} == {"fused_decode", "blas_matvec", "blas_matmul", "(XLA blocks)", "blas_attention"}
    for r in rows:
        assert r.relative <= TOLERANCE, r
        if r.kernel in ("fused_decode", "blas_matvec"):  # an execution's auto plan falls back to the reference
            assert r.unavailable_plan == "the xla plan" and r.unavailable_max_abs == 0.0, r
        elif r.kernel == "(XLA blocks)":  # no kernel: the same XLA computation runs
            assert r.unavailable_plan == r.plan and r.unavailable_max_abs == r.max_abs, r
        else:  # a training recipe is refused, never silently changed
            assert r.unavailable_plan == "refused" and r.unavailable_max_abs is None, r
    # Where a kernel runs here the plans really differ (its rounding is not XLA's); else they compare XLA with XLA.
    decode = [r for r in rows if r.kernel == "fused_decode"]
    assert all((r.max_abs > 0) == fused_decode.available() for r in decode)


def test_a_bfloat16_or_stored_layout_execution_records_no_decode_kernel():
    a = kernel_parity.DECODE_MODELS["gpt"]
    weights, identity = initialize(a, seed=5)[0], StateIdentity("c", "t", "bfloat16")
    bf16 = dataclasses.replace(a, precision="bfloat16")
    fused = Kernels(decode="fused", one_row="kernel")
    on_bf16 = ModelExecution(weights, bf16, identity, strategy=LayerStrategy.unrolled_layers(True), kernels=fused)
    assert on_bf16.kernels == Kernels(one_row="kernel")
    scanned = ModelExecution(weights, a, identity, strategy=LayerStrategy.scan(), kernels=fused)
    assert scanned.kernels == XLA
    assert jnp.dtype(on_bf16.architecture.precision) == jnp.bfloat16
