"""Tensor-parallel inference: a ModelExecution whose weights and KV state are split over a mesh's model axis.

Nothing in the model is forked. The weights are placed by `jgpt.runtime.mesh.WEIGHT_ROLES`
(heads and feed-forward units over the `model` axis, whole along the width),
the KV state's key and value buffers by heads, and rows over the `data` axis
where they divide it; jit then compiles the same prefill and decode as one SPMD
program, with XLA adding a reduction after the attention-output and the
feed-forward-down projection of every layer. Each device stores 1/model of the
weight matrices and of the cache.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from inference.execution import ModelExecution
from jgpt.foundation.errors import ApiError
from jgpt.model.kv_state import KVState
from jgpt.model.layer_strategy import LayerView, stored_layout
from jgpt.runtime.mesh import DATA_AXIS, MODEL_AXIS, replicated, tree_shardings


@dataclasses.dataclass(frozen=True)
class TensorParallelExecution(ModelExecution):
    # Required: keyword-only, so it may follow ModelExecution's defaulted fields.
    mesh: Mesh = dataclasses.field(kw_only=True)

    @classmethod
    def over(cls, execution: ModelExecution, mesh: Mesh) -> TensorParallelExecution:
        """`execution` with its weights split over `mesh` (whose model axis must divide the heads)."""
        a, model = execution.architecture, mesh.shape[MODEL_AXIS]
        if a.heads % model or a.kv_heads % model:
            raise ApiError("model_axis", f"{model} devices do not split {a.heads} heads ({a.kv_heads} key/value heads)")
        fields = {f.name: getattr(execution, f.name) for f in dataclasses.fields(ModelExecution)}
        # The split follows the stored layout's axes (jgpt.runtime.mesh), so the blocks run over it, not output-major.
        strategy = dataclasses.replace(execution.strategy, output_major=False)
        stored = stored_layout(execution.weights)
        weights = jax.device_put(stored, tree_shardings(stored, mesh, fsdp=False))
        return cls(**fields | {"weights": weights, "strategy": strategy}, mesh=mesh)

    @functools.cached_property
    def layer_weights(self) -> LayerView | None:
        layers = super().layer_weights
        return None if layers is None else jax.device_put(layers, tree_shardings(layers, self.mesh, fsdp=False))

    def state_sharding(self, state: KVState) -> KVState:
        """NamedShardings shaped like `state`: buffers by heads (and rows over the data axis), ids replicated."""
        rows = DATA_AXIS if state.batch % self.mesh.shape[DATA_AXIS] == 0 else None
        buffers = NamedSharding(self.mesh, PartitionSpec(None, rows, MODEL_AXIS))
        whole = replicated(self.mesh)
        return state.replace(keys=buffers, values=buffers, token_ids=whole, lengths=whole)

    def empty_state(self, batch: int, capacity: int) -> KVState:
        state = super().empty_state(batch, capacity)
        return jax.device_put(state, self.state_sharding(state))
