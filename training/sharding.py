"""Data parallelism: a one-axis Mesh over every device, batch sharded, everything else replicated.

Multi-host runs call `jax.distributed.initialize()` first (it reads the
coordinator address, process count and id from the environment of the usual
cluster launchers); `jax.devices()` then spans every host and the same Mesh
code shards the batch across all of them.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jgpt.errors import ApiError

DATA_AXIS = "data"
# Set by multi-host launchers; when present, the run joins the distributed system.
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"


def initialize_distributed() -> None:
    if os.environ.get(COORDINATOR_ENV):
        jax.distributed.initialize()


def data_mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the data axis."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    if batch_size % mesh.size:
        raise ApiError("batch_size", f"{batch_size} does not divide evenly over {mesh.size} devices")
