"""Every CPU-specific choice is taken by asking the backend, and has its GPU/TPU counterpart.

The table in docs/accelerators.md ("What depends on the backend") lists them;
this file checks each answer for "cpu", "gpu" and "tpu" without needing the device.
"""

from __future__ import annotations

import pytest

from jgpt.cli import main as cli
from jgpt.kernels.plan import Kernels
from jgpt.model import bf16_matmul
from jgpt.model.layer_strategy import LayerStrategy


def test_the_layer_strategy_unrolls_on_a_cpu_and_scans_the_stacked_weights_elsewhere():
    assert LayerStrategy.for_backend("cpu") == LayerStrategy.unrolled_layers(output_major=True)
    assert LayerStrategy.for_backend("gpu") == LayerStrategy.for_backend("tpu") == LayerStrategy.scan()


def test_the_auto_kernel_plan_is_the_pure_jax_one_off_a_cpu():
    # On a CPU it takes the decode kernels where they build and the CPU has AVX-512F (tests/test_kernel_plan.py).
    assert Kernels.auto("gpu") == Kernels.auto("tpu") == Kernels.xla()


def test_bf16_matmuls_are_rounded_operands_on_a_cpu_and_native_elsewhere():
    assert [bf16_matmul.native(backend) for backend in ("cpu", "gpu", "tpu")] == [False, True, True]


@pytest.mark.parametrize(("platforms", "accelerator"), [("cpu", False), ("cuda", True), ("tpu", True), ("cuda,cpu", True),
                                                        ("cpu,cuda", False)])  # fmt: skip
def test_the_huge_page_restart_asks_which_backend_jax_will_start(monkeypatch, platforms, accelerator):
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    assert cli._accelerator_backend() is accelerator


def test_without_jax_platforms_an_installed_accelerator_plugin_decides(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert cli._accelerator_backend() is False  # this CPU install has no plugin
    plugin = tmp_path / "jax_plugins" / "xla_cuda12"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli._accelerator_backend() is True
