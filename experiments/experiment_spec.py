"""ExperimentSpec (one control, its value, its ontology subjects) and ExecutionSpec (one setup).

An ExecutionSpec holds at most one assignment per control. A second assignment
of a control, whether in one list or when composing two specs, is an ApiError:
nothing is silently overridden. Unassigned controls take their value from
GenerationDefaults when a spec is resolved for execution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from experiments.controls import CONTROLS, control
from jgpt.foundation.errors import ApiError
from jgpt.foundation.ontology import ONTOLOGY_BINDING, OntologyBinding
from jgpt.foundation.validation import ListOf, Object, String, Tagged, array

# One setting: the control names the rule its value follows; a left-out binding binds the control's owner.
EXPERIMENT_SPEC = Tagged(
    "control",
    {name: Object({"control": String((name,)), "value": c.rule}, {"ontology_binding": ONTOLOGY_BINDING}, about=c.description)
     for name, c in CONTROLS.items()},
)  # fmt: skip
EXECUTION_SPEC = ListOf(EXPERIMENT_SPEC)


@dataclasses.dataclass(frozen=True)
class ExperimentSpec:
    """One declared intervention: set `control` to `value`, bound to the concept that owns the control."""

    control: str
    value: Any
    ontology_binding: OntologyBinding

    def __post_init__(self):
        _check(self.control, self.value, self.ontology_binding, "")

    @classmethod
    def of(cls, name: str, value: Any, related: Iterable[str] = ()) -> ExperimentSpec:
        """A spec bound to the owner of its control (the usual case)."""
        return cls(name, value, OntologyBinding(control(name, "control").owner, tuple(related)))

    @classmethod
    def from_json(cls, value: Any, field: str) -> ExperimentSpec:
        """Read one setting; `ontology_binding` may be left out, binding the control's owner."""
        EXPERIMENT_SPEC.read(value, field)
        owner = control(value["control"], f"{field}.control").owner
        if "ontology_binding" in value:
            binding = OntologyBinding.from_json(value["ontology_binding"], f"{field}.ontology_binding")
        else:
            binding = OntologyBinding(owner)
        _check(value["control"], value["value"], binding, field)
        return cls(value["control"], value["value"], binding)

    def to_json(self) -> dict[str, Any]:
        return {"control": self.control, "value": self.value, "ontology_binding": self.ontology_binding.to_json()}


def _check(name: str, value: Any, binding: OntologyBinding, field: str) -> None:
    prefix = f"{field}." if field else ""
    declared = control(name, f"{prefix}control")
    declared.check(value, f"{prefix}value")
    if binding.primary != declared.owner:
        raise ApiError(
            f"{prefix}ontology_binding.primary",
            f"control {name} acts on {declared.owner}, so its primary subject is {declared.owner}, not {binding.primary}",
        )


@dataclasses.dataclass(frozen=True)
class ExecutionSpec:
    """Controls used together for one execution; one assignment per control."""

    experiments: tuple[ExperimentSpec, ...] = ()

    def __post_init__(self):
        _check_one_assignment_per_control(self.experiments, "experiments")

    @classmethod
    def from_json(cls, value: Any, field: str = "experiments") -> ExecutionSpec:
        """Read a list of settings (the JSON form of ExecutionSpec.experiments)."""
        specs = tuple(ExperimentSpec.from_json(entry, f"{field}[{i}]") for i, entry in enumerate(array(value, field)))
        _check_one_assignment_per_control(specs, field)
        return cls(specs)

    def to_json(self) -> list[dict[str, Any]]:
        return [spec.to_json() for spec in self.experiments]

    @property
    def assignments(self) -> Mapping[str, Any]:
        return {spec.control: spec.value for spec in self.experiments}

    def compose(self, other: ExecutionSpec) -> ExecutionSpec:
        """Both specs' assignments together; a control assigned by both is an ApiError."""
        return ExecutionSpec(self.experiments + other.experiments)

    def over(self, defaults: ExecutionSpec) -> ExecutionSpec:
        """This spec completed with the defaults of every control it leaves unassigned."""
        mine = self.assignments
        return ExecutionSpec(self.experiments + tuple(s for s in defaults.experiments if s.control not in mine))

    def value(self, name: str) -> Any:
        if name not in CONTROLS:
            raise ApiError("control", f"unknown control {name!r}")
        try:
            return self.assignments[name]
        except KeyError:
            raise ApiError(name, "is not assigned in this execution spec") from None

    def system_config_json(self) -> dict[str, Any]:
        """The KVResidencySystemConfig document the system controls describe, nested by their dotted paths."""
        document: dict[str, Any] = {}
        for spec in self.experiments:
            path = CONTROLS[spec.control].system_path
            if path is None:
                continue
            node = document
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = spec.value
        return document


def _check_one_assignment_per_control(specs: tuple[ExperimentSpec, ...], field: str) -> None:
    first: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.control in first:
            j = first[spec.control]
            conflict = "conflicting values" if specs[j].value != spec.value else "the same value twice"
            raise ApiError(
                f"{field}[{i}].control",
                f"{spec.control} is already assigned by {field}[{j}] "
                f"({conflict}: {specs[j].value!r} and {spec.value!r}); one assignment per control",
            )
        first[spec.control] = i
