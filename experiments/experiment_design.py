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

A lab with any `missing_controls` is planned: it validates but refuses to run.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path
from typing import Any

from experiments.controls import control
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
    control: str
    values: tuple[Any, ...]


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

    @property
    def planned(self) -> bool:
        return bool(self.missing_controls)

    def arms(self) -> tuple[Arm, ...]:
        """Every point of the sweep (one arm, labelled 'settings', when there is none)."""
        if not self.sweep:
            return (Arm("settings", self.settings),)
        arms = []
        for point in itertools.product(*(axis.values for axis in self.sweep)):
            chosen = tuple(ExperimentSpec.of(axis.control, value) for axis, value in zip(self.sweep, point))
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
        expect_keys(value, field, required=required, optional=("workload", "sweep"))
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
        )
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
            document["sweep"] = [{"control": a.control, "values": list(a.values)} for a in self.sweep]
        return document


def _sweep(value: Any, settings: ExecutionSpec, field: str) -> tuple[SweepAxis, ...]:
    axes, seen = [], set(settings.assignments)
    for i, entry in enumerate(expect_list(value, field)):
        at = f"{field}[{i}]"
        expect_keys(entry, at, required=("control", "values"))
        declared = control(entry["control"], f"{at}.control")
        if declared.name in seen:
            raise ApiError(f"{at}.control", f"{declared.name} is already assigned; one assignment per control")
        seen.add(declared.name)
        values = expect_list(entry["values"], f"{at}.values")
        if len(values) < 2:
            raise ApiError(f"{at}.values", "a sweep axis compares at least two values")
        for j, item in enumerate(values):
            declared.check(item, f"{at}.values[{j}]")
        if len({json.dumps(v) for v in values}) != len(values):
            raise ApiError(f"{at}.values", "lists a value twice")
        axes.append(SweepAxis(declared.name, tuple(values)))
    return tuple(axes)


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
