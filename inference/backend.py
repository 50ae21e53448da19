"""ExecutionBackend and ExecutionProvenance: what actually executed the work, and from which sources."""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import subprocess
from typing import Any

from jgpt.foundation.identity import REPOSITORY, source_hashes

# The code whose behaviour a recorded computation depends on.
SOURCE_PACKAGES = ("jgpt", "inference")


@dataclasses.dataclass(frozen=True)
class ExecutionBackend:
    compute_device: str  # e.g. "cpu: TFRT_CPU_0 (2 cores)"
    device_state_storage: str  # where KVState buffers live during execution
    host_state_storage: str  # where KVState lives between requests
    library: str
    precision: str

    @classmethod
    def current(cls, precision: str) -> ExecutionBackend:
        import jax
        import jaxlib

        device = jax.devices()[0]
        return cls(
            compute_device=f"{device.platform}: {device.device_kind} ({jax.device_count()} device(s))",
            device_state_storage=f"XLA {device.platform} buffers, preallocated "
            "[layers, batch, kv_heads, slots, head_dim], updated in place inside the jitted loop",
            host_state_storage="none: states stay in device buffers between requests",
            library=f"jax {jax.__version__}, jaxlib {jaxlib.__version__}",
            precision=precision,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ExecutionProvenance:
    python: str
    revision: str  # git commit, with "+dirty" when sources differ from it
    source_sha256: str  # over `sources`, in path order
    sources: dict[str, str]  # repository-relative path -> sha256 of every source file that executed
    backend: ExecutionBackend

    @classmethod
    def current(cls, backend: ExecutionBackend) -> ExecutionProvenance:
        sources = source_hashes(SOURCE_PACKAGES)
        digest = hashlib.sha256("".join(f"{path}\0{sha}\n" for path, sha in sources.items()).encode())
        return cls(
            python=platform.python_version(),
            revision=_git_revision(),
            source_sha256=digest.hexdigest(),
            sources=sources,
            backend=backend,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _git_revision() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--", *SOURCE_PACKAGES)
    return commit + ("+dirty" if dirty else "")
