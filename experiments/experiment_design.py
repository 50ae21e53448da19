"""ExperimentDesign (a lab), its AbstractionContract, and the ExperimentCatalog of labs as data files.

A lab asks one question, binds it to ontology subjects, and fixes the controls it
applies together (`settings`, a valid ExecutionSpec). Two additions to the spec's
fields make a lab runnable on its own:

* `workload` (optional): the customer input the question needs; without it the
  lab runs on GenerationDefaults' workload. ExecutionSpec excludes customer input,
  so it sits beside the settings, never inside them.
* `sweep` (optional): axes of values for controls the settings leave unassigned.
  Each point of the product is one arm, a complete ExecutionSpec of its own; a
  control in both settings and sweep is an ApiError (one assignment per control).
  An axis without `control` lists points that each assign several controls
  together (`{"values": [{"execution.runner": "engine"}, {"compute_service.model":
  "calibrated"}]}`), for comparisons that are not a product of single controls.
* `calibration_workload` (required exactly when an arm sets `compute_service.model`
  to `calibrated`): the workload served on the InferenceEngine, before the arms,
  to fit the calibrated service, so the arms' predictions are out of sample.
* `answer` (optional; every built-in lab has one): how the question is answered
  from the arms (experiments/lab_answer.py), which the report opens with.

A lab with any `missing_controls` is planned: it validates but refuses to run.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.controls import CONTROLS, chosen, control, decoding_refusal
from experiments.experiment_spec import EXECUTION_SPEC, ExecutionSpec, ExperimentSpec
from experiments.lab_answer import ANSWER, read_answer
from experiments.lab_workload import WORKLOAD, LabWorkload, read_workload
from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import read_json
from jgpt.foundation.ontology import ONTOLOGY_BINDING, OntologyBinding
from jgpt.foundation.validation import Anything, ListOf, Object, RelativePath, String, Text
from kvsim import check_wall_clock

LABS = Path(__file__).with_name("labs")
REPOSITORY = Path(__file__).resolve().parents[1]
_ID = r"^[a-z0-9]+(-[a-z0-9]+)*$"


@dataclasses.dataclass(frozen=True)
class AbstractionContract:
    """What a lab's model of the system keeps, leaves out, and how far its conclusions reach."""

    target_regime: str
    preserved: str
    omissions: str
    evidence_plan: str
    limits: str

    @classmethod
    def from_json(cls, value: Any, field: str) -> AbstractionContract:
        return cls(**CONTRACT.read(value, field))


@dataclasses.dataclass(frozen=True)
class ExperimentSource:
    title: str
    url: str

    @classmethod
    def from_json(cls, value: Any, field: str) -> ExperimentSource:
        return cls(**SOURCE.read(value, field))


CONTRACT = Object(
    {f.name: Text() for f in dataclasses.fields(AbstractionContract)},
    about="AbstractionContract: what the lab's model keeps, leaves out, and how far it reaches.",
)
SOURCE = Object({"title": Text(), "url": String(pattern="^https://", meaning="an https URL")})
# An axis with `control` lists that control's values; one without lists points of {control: value, ...}.
SWEEP_AXIS = Object({"values": ListOf(Anything("values of the axis's control, or {control: value} points"), 2)},
                    {"control": String(tuple(CONTROLS))})  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SweepAxis:
    control: str | None  # None: each value is a dict of controls assigned together
    values: tuple[Any, ...]

    def point(self, value: Any) -> tuple[ExperimentSpec, ...]:
        if self.control is not None:
            return (ExperimentSpec.of(self.control, value),)
        return tuple(ExperimentSpec.of(name, item) for name, item in value.items())


@dataclasses.dataclass(frozen=True)
class Arm:
    """One point of a lab's sweep: a label and the complete settings it runs with."""

    label: str
    execution: ExecutionSpec


LAB = Object(
    {"id": String(pattern=_ID, meaning="lowercase words joined by '-'"), "name": Text(), "question": Text(),
     "ontology_binding": ONTOLOGY_BINDING, "settings": EXECUTION_SPEC, "missing_controls": ListOf(Text()),
     "contract": CONTRACT, "sources": ListOf(SOURCE, 1), "evidence": ListOf(RelativePath())},
    {"workload": WORKLOAD, "sweep": ListOf(SWEEP_AXIS), "calibration_workload": WORKLOAD, "answer": ANSWER},
    about="ExperimentDesign: a lab file under experiments/labs/ (docs/experiments.md).",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ExperimentDesign:
    id: str
    name: str
    question: str
    ontology_binding: OntologyBinding
    settings: ExecutionSpec
    missing_controls: tuple[str, ...]
    contract: AbstractionContract
    sources: tuple[ExperimentSource, ...]
    evidence: tuple[str, ...]
    workload: LabWorkload | None = None
    sweep: tuple[SweepAxis, ...] = ()
    calibration_workload: LabWorkload | None = None
    answer: dict[str, Any] | None = None  # the validated declaration (experiments/lab_answer.py)

    @property
    def planned(self) -> bool:
        return bool(self.missing_controls)

    @property
    def served(self) -> bool:
        """Whether running the lab measures anything on the wall clock (engine or generate arms, or a calibration)."""
        return self.calibration_workload is not None or any(
            chosen(arm.execution.assignments, "execution.runner") != "kvsim" for arm in self.arms()
        )

    def arms(self) -> tuple[Arm, ...]:
        """Every point of the sweep (one arm, labelled 'settings', when there is none)."""
        if not self.sweep:
            return (Arm("settings", self.settings),)
        arms = []
        for point in itertools.product(*(axis.values for axis in self.sweep)):
            chosen = tuple(spec for axis, value in zip(self.sweep, point) for spec in axis.point(value))
            label = ", ".join(f"{spec.control}={spec.value}" for spec in chosen)
            arms.append(Arm(label, self.settings.compose(ExecutionSpec(chosen))))
        return tuple(arms)

    def refuse_if_planned(self) -> None:
        if self.planned:
            raise ApiError(
                "missing_controls",
                f"lab {self.id} is planned, not executable: the system cannot yet express "
                f"{', '.join(self.missing_controls)}",
            )

    @classmethod
    def from_json(cls, value: Any, field: str = "") -> ExperimentDesign:
        at = (lambda name: f"{field}.{name}") if field else (lambda name: name)
        value = LAB.read(value, field)
        settings = ExecutionSpec.from_json(value["settings"], at("settings"))
        design = cls(
            id=value["id"],
            name=value["name"],
            question=value["question"],
            ontology_binding=OntologyBinding.from_json(value["ontology_binding"], at("ontology_binding")),
            settings=settings,
            missing_controls=tuple(value["missing_controls"]),
            contract=AbstractionContract(**value["contract"]),
            sources=tuple(ExperimentSource(**source) for source in value["sources"]),
            evidence=tuple(value["evidence"]),
            workload=read_workload(value["workload"], at("workload")) if "workload" in value else None,
            sweep=_sweep(value.get("sweep", []), settings, at("sweep")),
            calibration_workload=read_workload(value["calibration_workload"], at("calibration_workload"))
            if "calibration_workload" in value
            else None,
        )
        _check_runners(design, at)
        _check_wall_clock(design, at)
        if "answer" in value:
            arms = None if design.planned else [arm.execution.assignments for arm in design.arms()]
            names = [*CONTROLS, *design.missing_controls]
            design = dataclasses.replace(design, answer=read_answer(value["answer"], at("answer"), arms, names))
        return design

    def to_json(self) -> dict[str, Any]:
        document = {
            "id": self.id,
            "name": self.name,
            "question": self.question,
            "ontology_binding": self.ontology_binding.to_json(),
            "settings": self.settings.to_json(),
            "missing_controls": list(self.missing_controls),
            "contract": dataclasses.asdict(self.contract),
            "sources": [dataclasses.asdict(source) for source in self.sources],
            "evidence": list(self.evidence),
        }
        if self.workload is not None:
            document["workload"] = self.workload.source
        if self.sweep:
            document["sweep"] = [
                ({} if a.control is None else {"control": a.control}) | {"values": list(a.values)} for a in self.sweep
            ]
        if self.calibration_workload is not None:
            document["calibration_workload"] = self.calibration_workload.source
        if self.answer is not None:
            document["answer"] = self.answer
        return document


def _check_runners(design: ExperimentDesign, at) -> None:
    """A calibrated service is kvsim's, and it needs a calibration workload to be fitted on (and only then);
    the decoding controls make one decoding of a generate arm."""
    calibrated = False
    for arm in design.arms():
        assignments = arm.execution.assignments
        refusal = decoding_refusal(assignments)
        if refusal is not None:
            raise ApiError(
                at("sweep") if design.sweep else at("settings"), f"arm {arm.label!r}: {refusal[0]}: {refusal[1]}"
            )
        if chosen(assignments, "compute_service.model") == "calibrated":
            calibrated = True
            if chosen(assignments, "execution.runner") != "kvsim":
                raise ApiError(
                    at("sweep") if design.sweep else at("settings"),
                    f"arm {arm.label!r}: compute_service.model chooses kvsim's service; an engine or generate "
                    "arm is measured",
                )
    if calibrated and design.calibration_workload is None:
        raise ApiError(
            at("calibration_workload"), "a calibrated arm needs a calibration workload to fit its service on"
        )
    if design.calibration_workload is not None and not calibrated:
        raise ApiError(
            at("calibration_workload"), "is served only to calibrate; no arm sets compute_service.model to calibrated"
        )


def _check_wall_clock(design: ExperimentDesign, at) -> None:
    """A workload the InferenceEngine serves (an engine arm's, a calibration's) is waited for on the wall clock:
    every declared arrival and action at most kvsim.workload.WALL_CLOCK_LIMIT_US, refused before anything runs."""
    engine = any(chosen(arm.execution.assignments, "execution.runner") == "engine" for arm in design.arms())
    served = [("workload", design.workload)] if engine else []
    for name, workload in [*served, ("calibration_workload", design.calibration_workload)]:
        if workload is None:
            continue
        for request in workload.requests:
            check_wall_clock(request.arrival_us, f"{at(name)}: request {request.request_id!r}: arrival_us")
        for index, action in enumerate(workload.interaction.actions if workload.interaction else ()):
            check_wall_clock(action.at_us, f"{at(name)}.actions[{index}].at_us")


def _sweep(value: Any, settings: ExecutionSpec, field: str) -> tuple[SweepAxis, ...]:
    axes, seen = [], set(settings.assignments)
    for i, entry in enumerate(value):
        at = f"{field}[{i}]"
        values = entry["values"]
        declared = control(entry["control"], f"{at}.control") if "control" in entry else None
        names = {declared.name: f"{at}.control"} if declared else _joint_points(values, at)
        for name, where in names.items():
            if name in seen:
                raise ApiError(where, f"{name} is already assigned; one assignment per control")
        seen |= set(names)
        if declared:
            for j, item in enumerate(values):
                declared.check(item, f"{at}.values[{j}]")
        if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
            raise ApiError(f"{at}.values", "lists a value twice")
        axes.append(SweepAxis(entry.get("control"), tuple(values)))
    return tuple(axes)


def _joint_points(values: list, at: str) -> dict[str, str]:
    """Every control a joint axis assigns (each point a non-empty {control: value}), with where it is named."""
    names: dict[str, str] = {}
    for j, point in enumerate(values):
        where = f"{at}.values[{j}]"
        if not isinstance(point, dict) or not point:
            raise ApiError(where, "a sweep axis without control lists points of {control: value, ...}")
        for name, item in point.items():
            control(name, where).check(item, f"{where}.{name}")
            names.setdefault(name, where)
    return names


@dataclasses.dataclass(frozen=True)
class ExperimentCatalog:
    experiments: tuple[ExperimentDesign, ...]

    def __post_init__(self):
        seen = set()
        for i, design in enumerate(self.experiments):
            if design.id in seen:
                raise ApiError(f"experiments[{i}].id", f"{design.id!r} is used by two labs")
            seen.add(design.id)

    def lab(self, lab_id: str) -> ExperimentDesign:
        for design in self.experiments:
            if design.id == lab_id:
                return design
        raise ApiError("lab", f"no lab {lab_id!r}; labs: {', '.join(d.id for d in self.experiments)}")


def read_lab(path: Path, shown: str | None = None, field: str | None = None) -> ExperimentDesign:
    """One lab file; errors name the file (`shown`, its name by default) and the field, or, when the file cannot
    be read as JSON, `field` (the path by default)."""
    path = Path(path)
    shown = path.name if shown is None else shown
    value = read_json(path, str(path) if field is None else field)
    try:
        design = ExperimentDesign.from_json(value)
    except ApiError as error:
        raise ApiError(f"{shown}: {error.field}", error.reason) from None
    if design.id != path.stem:
        raise ApiError(f"{shown}: id", f"a lab file is named after its id; expected {path.stem!r}")
    return design


def default_catalog(directory: Path = LABS, shown: Callable[[Path], str] = lambda path: path.name) -> ExperimentCatalog:
    """Every lab under `directory` (`experiments/labs/` by default), in file-name order; errors name each file as
    `shown` gives it."""
    return ExperimentCatalog(tuple(read_lab(path, shown(path)) for path in sorted(Path(directory).glob("*.json"))))


def is_lab_path(reference: str) -> bool:
    """Whether a lab reference names a file: it holds a path separator or ends in `.json`. Anything else is a
    built-in lab id, and an id (lowercase words joined by '-') never does either, so no reference is both."""
    return "/" in reference or os.sep in reference or reference.endswith(".json")


def find_lab(reference: str, catalog: ExperimentCatalog | None = None) -> ExperimentDesign:
    """The lab a command names: the lab file at a path (`is_lab_path`), or the catalog's lab of that id."""
    if is_lab_path(reference):
        if "\x00" in reference:  # open() would raise ValueError, not the OSError read_json names
            raise ApiError("lab", f"{reference!r} is not a path: it holds a NUL character")
        return read_lab(Path(reference), reference, "lab")
    catalog = default_catalog() if catalog is None else catalog
    try:
        return catalog.lab(reference)
    except ApiError as error:
        if os.path.isfile(reference):  # a lab file without the .json suffix, in the current directory
            raise ApiError(
                error.field, f"{error.reason}; to read the file {reference!r}, give its path: ./{reference}"
            ) from None
        raise ApiError(
            error.field, f"{error.reason}; a lab file of your own is given by its path (with a '/' or ending in .json)"
        ) from None
