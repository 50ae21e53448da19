"""The controls an experiment may set: each a dotted name, the concept that owns it, and its value check.

System controls are the dotted paths of kvsim's KVResidencySystemConfig fields
(`kv_cache.device_kv_bytes` sets KVResidencySystemConfig.kv_cache.device_kv_bytes),
so a resolved ExecutionSpec maps onto that config without a translation table.
Model and generation controls live under `model.` and `generation.`.

Two controls choose how an arm is executed rather than a value of the system:
`execution.runner` (kvsim simulates the arm, or the InferenceEngine serves it) and
`compute_service.model` (kvsim's roofline rates, or a service calibrated on engine
runs). Each has a `default`, today's behaviour, which a record leaves unwritten so
records of arms that keep it stay byte for byte what they were. The `decoding.`
controls (greedy or speculative, the draft, K) have defaults too: they choose how a
`generate` arm decodes, and no other arm reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import Description, Integer, Number, String, string

NO_DRAFT = "none"  # decoding.draft_model_id of a greedy arm


@dataclasses.dataclass(frozen=True)
class Control:
    """One settable knob: `owner` is the ontology concept whose mechanism or artifact it changes."""

    name: str
    owner: str
    kind: type
    description: str
    minimum: float | None = None
    strictly_positive: bool = False
    choices: tuple[str, ...] = ()
    default: Any = None  # set only for the controls that choose how an arm runs

    @property
    def rule(self) -> Description:
        """The values this control accepts: its check, and its part of the lab schema."""
        if self.kind is int:
            return Integer(None if self.minimum is None else int(self.minimum))
        if self.kind is float:
            return Number(self.minimum, exact=False, positive=self.strictly_positive)
        return String(self.choices or None)

    def check(self, value: Any, field: str) -> Any:
        """`value` if this control accepts it; ApiError naming `field` otherwise."""
        return self.rule.read(value, field)

    @property
    def system_path(self) -> tuple[str, ...] | None:
        """The path into KVResidencySystemConfig, or None for model, generation and runner controls."""
        head = self.name.split(".")[0]
        return None if head in ("model", "generation") or self.default is not None else tuple(self.name.split("."))


CONTROLS: dict[str, Control] = {
    control.name: control
    for control in (
        Control(
            "model.model_id",
            "ModelArtifact",
            str,
            "catalog id or artifact directory of the model; 'default' is the catalog's default",
        ),
        Control(
            "generation.max_new_tokens",
            "GenerationPolicy",
            int,
            "output-token budget per request, TURN_END included",
            minimum=1,
        ),
        Control("generation.selection", "GenerationPolicy", str, "token selection rule", choices=("greedy",)),
        Control("generation.stopping", "GenerationPolicy", str, "termination rule", choices=("turn_end_or_budget",)),
        Control("max_requests", "InferenceSystem", int, "most requests the system accepts in one run", minimum=1),
        Control(
            "max_new_tokens_cap", "InferenceSystem", int, "system ceiling on any request's output budget", minimum=1
        ),
        Control(
            "scheduling.max_active_requests",
            "RequestScheduling",
            int,
            "admission slots: requests active at once",
            minimum=1,
        ),
        Control(
            "scheduling.policy",
            "RequestScheduling",
            str,
            "how active requests share service",
            choices=("serialized", "continuous_batching"),
        ),
        Control("kv_cache.device_kv_bytes", "KVCache", int, "logical device KV budget in bytes", minimum=1),
        Control(
            "kv_cache.host_kv_bytes", "KVCache", int, "logical host KV budget in bytes (0: no host tier)", minimum=0
        ),
        Control(
            "kv_cache.retention_policy",
            "KVCache",
            str,
            "which finished prefixes are kept for reuse",
            choices=("lru", "none"),
        ),
        Control(
            "transfer.link_bytes_per_us", "StateTransfer", float, "host<->device link bandwidth", strictly_positive=True
        ),
        Control("transfer.link_latency_us", "StateTransfer", float, "startup delay of one transfer", minimum=0),
        Control(
            "compute_service.compute_flops_per_us",
            "ComputeService",
            float,
            "hypothetical matmul rate",
            strictly_positive=True,
        ),
        Control(
            "compute_service.memory_bytes_per_us",
            "ComputeService",
            float,
            "hypothetical memory-traffic rate",
            strictly_positive=True,
        ),
        Control(
            "execution.runner",
            "InferenceEngine",
            str,
            "kvsim simulates the arm, the InferenceEngine serves it on the wall "
            "clock, or generate decodes its requests one at a time on the wall clock (the decoding.* controls)",
            choices=("kvsim", "engine", "generate"),
            default="kvsim",
        ),
        Control(
            "compute_service.model",
            "ComputeService",
            str,
            "kvsim's service: hypothetical roofline rates, or calibrated on "
            "engine runs of the lab's calibration_workload",
            choices=("roofline", "calibrated"),
            default="roofline",
        ),
        Control(
            "decoding.rule",
            "Decoding",
            str,
            "greedy decoding, or greedy-exact speculative decoding (draft, then one target verify)",
            choices=("greedy", "speculative"),
            default="greedy",
        ),
        Control(
            "decoding.draft_model_id",
            "Decoding",
            str,
            "what proposes ids: a catalog id or artifact directory with the "
            "target's tokenizer, or 'prompt-lookup'; 'none' for greedy",
            default=NO_DRAFT,
        ),
        Control("decoding.speculation_tokens", "Decoding", int, "ids drafted per round (K)", minimum=1, default=4),
    )
}
DECODING_CONTROLS = ("decoding.rule", "decoding.draft_model_id", "decoding.speculation_tokens")


def decoding_refusal(assignments: Mapping[str, Any]) -> tuple[str, str] | None:
    """(control, reason) when an arm's decoding controls do not make one decoding, else None: speculative
    decoding needs a draft, greedy neither, and only a generate arm decodes (K's upper bound is the run's)."""
    rule, draft = chosen(assignments, "decoding.rule"), chosen(assignments, "decoding.draft_model_id")
    if chosen(assignments, "execution.runner") != "generate":
        assigned = [name for name in DECODING_CONTROLS if name in assignments]
        return (assigned[0], "applies only to arms with execution.runner=generate") if assigned else None
    if rule == "greedy":
        extra = [name for name in DECODING_CONTROLS[1:] if name in assignments]
        return (extra[0], "applies only to decoding.rule=speculative") if extra else None
    if draft == NO_DRAFT:
        return "decoding.draft_model_id", "speculative decoding needs a draft: a model id or 'prompt-lookup'"
    return None


def chosen(assignments: Mapping[str, Any], name: str) -> Any:
    """The value of a control that chooses how an arm runs: assigned, or its default (left unwritten)."""
    return assignments.get(name, CONTROLS[name].default)


def control(name: Any, field: str) -> Control:
    """The declared control called `name`; ApiError naming `field` otherwise."""
    string(name, field)
    if name not in CONTROLS:
        raise ApiError(field, f"unknown control {name!r}; declared controls: {', '.join(CONTROLS)}")
    return CONTROLS[name]
