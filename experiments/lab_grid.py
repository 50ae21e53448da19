"""A grid sweep over a lab's controls: `jgpt lab sweep LAB --grid CONTROL=V1,V2,... [--grid ...]`.

Each `--grid` is one more axis of the lab's sweep; the arms are the product of the lab's own
axes and the grid's, each a complete ExecutionSpec as in any lab. A value is written as in a
lab file: a number for a numeric control (`30` stays the integer 30, `1e5` is a float), the
text itself for a text control. One value sets the control in every arm.

A grid over a control the lab already assigns replaces that assignment (the setting, or the
axis over it), so the same question can be asked at other budgets or rates; the run says what
it replaced, and the record's lab is the lab as swept, so the record replays like any other.
A control inside one of the lab's joint axes (points assigning several controls together)
cannot be taken out of its points: such a grid is refused. The lab's `answer` is kept when it
still fits the swept arms (each selector picking its one arm); otherwise the swept lab has
none, and the run says so.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from experiments.controls import control
from experiments.experiment_design import ExperimentDesign, SweepAxis
from experiments.experiment_spec import ExecutionSpec, ExperimentSpec
from jgpt.foundation.errors import ApiError

FIELD = "--grid"


@dataclasses.dataclass(frozen=True)
class GridAxis:
    control: str
    values: tuple[Any, ...]


def parse_axis(text: str) -> GridAxis:
    """`CONTROL=V1,V2,...`: each value checked by the control's rule; an ApiError naming `--grid` otherwise."""
    name, equals, listed = text.partition("=")
    if not equals or not listed:
        raise ApiError(FIELD, f"{text!r} is not CONTROL=V1,V2,... (e.g. kv_cache.device_kv_bytes=524288,1048576)")
    declared = control(name.strip(), FIELD)
    values = []
    for j, item in enumerate(listed.split(",")):
        value = _value(item.strip(), declared.kind)
        values.append(declared.check(value, f"{FIELD} {declared.name}[{j}]"))
    if len({json.dumps(v) for v in values}) != len(values):
        raise ApiError(f"{FIELD} {declared.name}", f"lists a value twice: {listed}")
    return GridAxis(declared.name, tuple(values))


def _value(item: str, kind: type) -> Any:
    """A value as a lab file writes it: JSON for a numeric control, the text as given for a text control."""
    if kind is str:
        return item
    try:
        return json.loads(item)
    except json.JSONDecodeError:
        return item  # the control's rule refuses it, naming the value


def gridded(lab: ExperimentDesign, axes: list[GridAxis]) -> tuple[ExperimentDesign, list[str]]:
    """The lab swept over `axes` as well as its own, and a note per assignment of the lab's that a grid replaced
    (and if the lab's answer declaration no longer fits its arms, a note that the swept lab has none)."""
    names = [axis.control for axis in axes]
    for name in names:
        if names.count(name) > 1:
            raise ApiError(f"{FIELD} {name}", "is given twice; list every value in one --grid")
    replaced = []
    for spec in lab.settings.experiments:
        if spec.control in names:
            replaced.append(f"{spec.control}: the lab's setting {json.dumps(spec.value)}")
    for axis in lab.sweep:
        if axis.control in names:
            replaced.append(f"{axis.control}: the lab's sweep over {json.dumps(list(axis.values))}")
        joint = axis.control is None and {name for point in axis.values for name in point} & set(names)
        if joint:
            raise ApiError(
                f"{FIELD} {sorted(joint)[0]}",
                f"lab {lab.id} assigns it together with other controls in a joint sweep axis; it cannot be gridded",
            )
    settings = ExecutionSpec(
        tuple(s for s in lab.settings.experiments if s.control not in names)
        + tuple(ExperimentSpec.of(a.control, a.values[0]) for a in axes if len(a.values) == 1)
    )
    sweep = tuple(a for a in lab.sweep if a.control not in names) + tuple(
        SweepAxis(a.control, a.values) for a in axes if len(a.values) > 1
    )
    document = dataclasses.replace(lab, settings=settings, sweep=sweep).to_json()
    answer = document.pop("answer", None)
    try:  # the checks that span arms (runners, decoding, the wall clock) as for a lab file
        swept = ExperimentDesign.from_json(document)
    except ApiError as error:
        raise ApiError(f"{FIELD}: {error.field}", error.reason) from None
    notes = [f"--grid replaces {line}" for line in replaced]
    if answer is None:
        return swept, notes
    try:
        return ExperimentDesign.from_json(document | {"answer": answer}), notes
    except ApiError as error:  # e.g. a crossover's selectors now pick an arm per grid value, not one
        return swept, notes + [
            f"--grid drops the lab's {answer['kind']} answer, which does not fit the swept arms "
            f"({error.field}: {error.reason}); the record has no answer"
        ]
