"""What JAX sees: its backend, every device (in this process and in others), and their memory.

`describe()` is what `jgpt devices` prints. It is the first thing to run on a
new machine: an accelerator install that silently fell back to the CPU shows up
here as `backend: cpu`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.runtime import process_settings


@dataclasses.dataclass(frozen=True)
class DeviceView:
    id: int
    platform: str  # "cpu", "gpu" (CUDA or ROCm) or "tpu"
    kind: str  # e.g. "NVIDIA H100 80GB HBM3", "TPU v5 lite", "cpu"
    process_index: int
    memory_bytes: int | None  # the allocator's limit where the backend reports one (not on CPU)


@dataclasses.dataclass(frozen=True)
class Devices:
    backend: str
    jax_version: str
    jaxlib_version: str
    process_index: int
    process_count: int
    local_device_count: int
    devices: tuple[DeviceView, ...]
    process_settings: str  # whether the malloc tunables are in force (jgpt.runtime.process_settings.describe)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def table(self) -> str:
        lines = [
            f"backend {self.backend}  jax {self.jax_version}  jaxlib {self.jaxlib_version}",
            (
                f"process {self.process_index} of {self.process_count}: {self.local_device_count} local device(s), "
                f"{len(self.devices)} in all"
            ),
            self.process_settings,
        ]
        for d in self.devices:
            memory = "" if d.memory_bytes is None else f"  {d.memory_bytes / 2**30:.1f} GiB"
            lines.append(f"  {d.id:>3}  {d.platform:<4} {d.kind}  process {d.process_index}{memory}")
        return "\n".join(lines)


def backend() -> str:
    """The platform JAX computes on, started now. A backend that cannot start (JAX_PLATFORMS naming one that
    is not installed, a plugin failing) is an ApiError naming JAX_PLATFORMS, not a traceback at first use."""
    import jax

    try:
        return jax.default_backend()
    except RuntimeError as error:
        raise ApiError("JAX_PLATFORMS", str(error)) from None


def describe() -> Devices:
    import jax
    import jaxlib

    return Devices(
        backend=backend(),
        jax_version=jax.__version__,
        jaxlib_version=jaxlib.__version__,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        local_device_count=jax.local_device_count(),
        devices=tuple(_view(d) for d in jax.devices()),
        process_settings=process_settings.describe(),
    )


def _view(device) -> DeviceView:
    # memory_stats() is None on CPU, and raises for a device of another process.
    stats = device.memory_stats() if device.process_index == device.client.process_index() else None
    limit = None if not stats else stats.get("bytes_limit")
    return DeviceView(device.id, device.platform, device.device_kind, device.process_index, limit)
