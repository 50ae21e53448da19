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

A lab with any `missing_controls` is planned: it validates but refuses to run.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path
from typing import Any

from experiments.controls import chosen, control
from experiments.experiment_spec import ExecutionSpec, ExperimentSpec
from experiments.fields import expect_keys, expect_list, expect_text
from experiments.workload import Workload, read_workload
from jgpt.errors import ApiError
from jgpt.json_input import read_json
from jgpt.ontology import OntologyBinding

LABS = Path(__file__).with_name("labs")
REPOSITORY = Path(__file__).resolve().parents[1]
_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


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
        names = [f.name for f in dataclasses.fields(cls)]
        expect_keys(value, field, required=names)
        return cls(**{name: expect_text(value[name], f"{field}.{name}") for name in names})


@dataclasses.dataclass(frozen=True)
class ExperimentSource:
    title: str
    url: str

    @classmethod
    def from_json(cls, value: Any, field: str) -> ExperimentSource:
        expect_keys(value, field, required=("title", "url"))
        url = expect_text(value["url"], f"{field}.url")
        if not url.startswith("https://"):
            raise ApiError(f"{field}.url", f"must be an https URL, got {url!r}")
        return cls(expect_text(value["title"], f"{field}.title"), url)


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
    workload: Workload | None = None
    sweep: tuple[SweepAxis, ...] = ()
    calibration_workload: Workload | None = None

    @property
    def planned(self) -> bool:
        return bool(self.missing_controls)

    @property
    def served(self) -> bool:
        """Whether running the lab serves anything on the InferenceEngine (engine arms or a calibration)."""
        return self.calibration_workload is not None or any(
            chosen(arm.execution.assignments, "execution.runner") == "engine" for arm in self.arms())

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
        required = ("id", "name", "question", "ontology_binding", "settings", "missing_controls", "contract",
                    "sources", "evidence")
        expect_keys(value, field, required=required, optional=("workload", "sweep", "calibration_workload"))
        lab_id = expect_text(value["id"], at("id"))
        if not _ID.match(lab_id):
            raise ApiError(at("id"), f"{lab_id!r} must be lowercase words joined by '-'")
        settings = ExecutionSpec.from_json(value["settings"], at("settings"))
        missing = tuple(expect_text(name, f"{at('missing_controls')}[{i}]")
                        for i, name in enumerate(expect_list(value["missing_controls"], at("missing_controls"))))
        sources = tuple(ExperimentSource.from_json(entry, f"{at('sources')}[{i}]")
                        for i, entry in enumerate(expect_list(value["sources"], at("sources"))))
        if not sources:
            raise ApiError(at("sources"), "a lab cites at least one source")
        evidence = tuple(_evidence_path(entry, f"{at('evidence')}[{i}]")
                         for i, entry in enumerate(expect_list(value["evidence"], at("evidence"))))
        design = cls(
            id=lab_id,
            name=expect_text(value["name"], at("name")),
            question=expect_text(value["question"], at("question")),
            ontology_binding=OntologyBinding.from_json(value["ontology_binding"], at("ontology_binding")),
            settings=settings,
            missing_controls=missing,
            contract=AbstractionContract.from_json(value["contract"], at("contract")),
            sources=sources,
            evidence=evidence,
            workload=read_workload(value["workload"], at("workload")) if "workload" in value else None,
            sweep=_sweep(value.get("sweep", []), settings, at("sweep")),
            calibration_workload=read_workload(value["calibration_workload"], at("calibration_workload"))
            if "calibration_workload" in value else None,
        )
        _check_runners(design, at)
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
            document["sweep"] = [({} if a.control is None else {"control": a.control}) | {"values": list(a.values)}
                                 for a in self.sweep]
        if self.calibration_workload is not None:
            document["calibration_workload"] = self.calibration_workload.source
        return document


def _check_runners(design: ExperimentDesign, at) -> None:
    """A calibrated service is kvsim's, and it needs a calibration workload to be fitted on (and only then)."""
    calibrated = False
    for arm in design.arms():
        assignments = arm.execution.assignments
        if chosen(assignments, "compute_service.model") == "calibrated":
            calibrated = True
            if chosen(assignments, "execution.runner") == "engine":
                raise ApiError(at("sweep") if design.sweep else at("settings"),
                               f"arm {arm.label!r}: compute_service.model chooses kvsim's service; an engine arm is measured")
    if calibrated and design.calibration_workload is None:
        raise ApiError(at("calibration_workload"), "a calibrated arm needs a calibration workload to fit its service on")
    if design.calibration_workload is not None and not calibrated:
        raise ApiError(at("calibration_workload"), "is served only to calibrate; no arm sets compute_service.model to calibrated")


def _sweep(value: Any, settings: ExecutionSpec, field: str) -> tuple[SweepAxis, ...]:
    axes, seen = [], set(settings.assignments)
    for i, entry in enumerate(expect_list(value, field)):
        at = f"{field}[{i}]"
        expect_keys(entry, at, required=("values",), optional=("control",))
        values = expect_list(entry["values"], f"{at}.values")
        if len(values) < 2:
            raise ApiError(f"{at}.values", "a sweep axis compares at least two values")
        declared = control(entry["control"], f"{at}.control") if "control" in entry else None
        names = {declared.name: f"{at}.control"} if declared else _joint_points(values, at)
        for name, where in names.items():
            if name in seen:
                raise ApiError(where, f"{name} is already assigned; one assignment per control")
        seen |= set(names)
        for j, item in enumerate(values if declared else []):
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


def _evidence_path(value: Any, field: str) -> str:
    path = expect_text(value, field)
    if Path(path).is_absolute() or ".." in Path(path).parts:
        raise ApiError(field, f"must be a path inside the repository, got {path!r}")
    return path


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


def read_lab(path: Path) -> ExperimentDesign:
    """One lab file; errors name the file and the field."""
    path = Path(path)
    value = read_json(path, str(path))
    try:
        design = ExperimentDesign.from_json(value)
    except ApiError as error:
        raise ApiError(f"{path.name}: {error.field}", error.reason) from None
    if design.id != path.stem:
        raise ApiError(f"{path.name}: id", f"a lab file is named after its id; expected {path.stem!r}")
    return design


def default_catalog(directory: Path = LABS) -> ExperimentCatalog:
    """Every lab under `experiments/labs/`, in file-name order."""
    return ExperimentCatalog(tuple(read_lab(path) for path in sorted(Path(directory).glob("*.json"))))
