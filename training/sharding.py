"""Training over a device mesh (`jgpt.runtime.mesh`): data parallel plus FSDP-style sharding, within and across processes.

The batch splits over the `data` axis; weights and both Adam moments split by
`jgpt.runtime.mesh.WEIGHT_ROLES` with the FSDP width split on (`state_shardings`), so
on a `data x model` mesh each device holds 1/(data x model) of every matrix
whose dimensions divide evenly.

Multi-process runs join the distributed system first (`initialize_distributed`);
`jax.devices()` then spans every process and the same mesh code shards over all
of them. On CPU the processes' collectives run over gloo (JAX's default there).
"""

from __future__ import annotations

import os
import re

import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from jgpt.foundation.errors import ApiError
from jgpt.runtime.devices import backend
from jgpt.runtime.mesh import DATA_AXIS, batch_sharding, mesh, replicated, tree_shardings

__all__ = ["batch_sharding", "check_batch_size", "data_mesh", "initialize_distributed", "main_process", "mesh",
           "replicated", "state_shardings", "to_host"]  # fmt: skip

# Set by multi-host launchers; when present, the run joins the distributed system.
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
# Read with the coordinator's address where no cluster (SLURM, Open MPI, Kubernetes...) is detected.
PROCESSES_ENV, PROCESS_ID_ENV = "JGPT_NUM_PROCESSES", "JGPT_PROCESS_ID"


def initialize_distributed() -> None:
    """Join the distributed system when a launcher set the coordinator's address (else nothing)."""
    address = os.environ.get(COORDINATOR_ENV)
    if not address or jax.distributed.is_initialized():
        return
    # JAX splits off the port unchecked: 'host' was an IndexError, ':' a native crash, port 0 a hang.
    port = re.fullmatch(r"(?:\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):([0-9]{1,5})", address)
    if not port or not 1 <= int(port[1]) <= 65535:
        raise ApiError(COORDINATOR_ENV, f"must be HOST:PORT with a port in 1..65535, got {address!r}")
    count, index = os.environ.get(PROCESSES_ENV), os.environ.get(PROCESS_ID_ENV)
    processes = process = None  # None: the process count and id come from the detected cluster
    if count is not None and index is not None:
        processes, process = (
            _environment_integer(PROCESSES_ENV, count, 1),
            _environment_integer(PROCESS_ID_ENV, index, 0),
        )
        if process >= processes:
            raise ApiError(PROCESS_ID_ENV, f"{process} is not below {PROCESSES_ENV}={processes}")
    try:
        jax.distributed.initialize(num_processes=processes, process_id=process)
    except (
        ValueError,
        TypeError,
        jax.errors.JaxRuntimeError,
    ) as error:  # no cluster detected, a bad device list, no coordinator
        hint = "" if processes else f" (outside a detected cluster, set {PROCESSES_ENV} and {PROCESS_ID_ENV})"
        raise ApiError(COORDINATOR_ENV, f"cannot join the distributed system at {address}: {error}{hint}") from None


def _environment_integer(name: str, value: str, minimum: int) -> int:
    if not value.isascii() or not value.isdigit() or not minimum <= int(value) < 1 << 20:  # 2^20: no cluster is larger
        raise ApiError(name, f"must be an integer in [{minimum}, 2^20), got {value!r}")
    return int(value)


def main_process() -> bool:
    """Whether this is process 0 (joining the distributed system first): the one that writes a run's files."""
    initialize_distributed()
    backend()  # the first use of JAX in `jgpt train`
    return jax.process_index() == 0


def data_mesh() -> Mesh:
    """Every device on the data axis."""
    return mesh(1)


def state_shardings(state, mesh: Mesh):
    """Where a TrainState lives: weights and optimizer moments split FSDP-style, counters replicated."""
    return tree_shardings(state, mesh, fsdp=True)


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    data = mesh.shape[DATA_AXIS]
    if batch_size % data:
        raise ApiError("batch_size", f"{batch_size} does not divide evenly over {data} data-parallel devices")


def to_host(tree):
    """The whole value of every array as numpy, also where some of its shards live in other processes."""
    if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(tree)):
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)
