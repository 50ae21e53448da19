"""ExperimentCatalog: every lab file validates, planned labs refuse to run, bad input names the field."""

import copy
import json

import pytest

from experiments.controls import CONTROLS
from experiments.experiment_design import LABS, REPOSITORY, ExperimentDesign, default_catalog, read_lab
from experiments.experiment_spec import ExecutionSpec
from experiments.generation_defaults import generation_defaults
from jgpt.foundation.errors import ApiError
from kvsim.system import parse_system

CATALOG = default_catalog()


def test_catalog_has_at_least_six_labs_with_planned_and_runnable_ones():
    assert len(CATALOG.experiments) >= 6
    assert sum(not lab.planned for lab in CATALOG.experiments) >= 6
    assert any(lab.planned for lab in CATALOG.experiments)


@pytest.mark.parametrize("lab", CATALOG.experiments, ids=lambda lab: lab.id)
def test_every_lab_validates_and_every_arm_forms_a_complete_system(lab):
    assert lab.sources and all(source.url.startswith("https://") for source in lab.sources)
    for path in lab.evidence:
        assert (REPOSITORY / path).is_file(), path
    assert ExperimentDesign.from_json(json.loads(json.dumps(lab.to_json()))) == lab
    if lab.planned:
        assert not set(lab.missing_controls) & set(CONTROLS)  # missing means not yet declared
        return
    for arm in lab.arms():
        resolved = arm.execution.over(generation_defaults().execution)
        assert set(resolved.assignments) == set(CONTROLS)
        parse_system(resolved.system_config_json())


def test_sweep_arms_are_the_product_of_the_axes():
    lab = CATALOG.lab("host-tier-vs-recompute")
    arms = lab.arms()
    assert len(arms) == 2 * 3
    assert len({arm.label for arm in arms}) == 6
    for arm in arms:
        assert arm.execution.value("kv_cache.device_kv_bytes") == 524288  # settings are in every arm


@pytest.mark.parametrize("lab", [lab for lab in CATALOG.experiments if lab.planned], ids=lambda lab: lab.id)
def test_planned_lab_refuses_to_run_naming_what_is_missing(lab):
    with pytest.raises(ApiError) as caught:
        lab.refuse_if_planned()
    assert caught.value.field == "missing_controls"
    for name in lab.missing_controls:
        assert name in caught.value.reason


def _lab(edit, lab_id="host-tier-vs-recompute"):
    document = json.loads((LABS / f"{lab_id}.json").read_text())
    edit(document)
    return document


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d.pop("question"), "question"),
        (lambda d: d.update(question=" "), "question"),
        (lambda d: d.update(id="Host Tier"), "id"),
        (lambda d: d.update(colour="red"), "colour"),
        (lambda d: d["ontology_binding"].update(primary="KVCacheConfig"), "ontology_binding.primary"),
        (lambda d: d["ontology_binding"]["related"].append("KVCache"), "ontology_binding.related[3]"),
        (lambda d: d["settings"][0].update(value=-1), "settings[0].value"),
        (lambda d: d["settings"].append({"control": "kv_cache.device_kv_bytes", "value": 1}), "settings[2].control"),
        (lambda d: d["sweep"][0].update(control="kv_cache.device_kv_bytes"), "sweep[0].control"),
        (lambda d: d["sweep"][1].update(values=[30]), "sweep[1].values"),
        (lambda d: d["sweep"][1].update(values=[30, 30]), "sweep[1].values"),
        (lambda d: d["sweep"][1]["values"].append("fast"), "sweep[1].values[3]"),
        (lambda d: d["missing_controls"].append(3), "missing_controls[0]"),
        (lambda d: d["contract"].pop("limits"), "contract.limits"),
        (lambda d: d["sources"][0].update(url="arxiv.org/abs/1"), "sources[0].url"),
        (lambda d: d.update(sources=[]), "sources"),
        (lambda d: d.update(evidence=["/etc/passwd"]), "evidence[0]"),
        (lambda d: d["workload"].update(kind="poisson"), "workload.kind"),
        (lambda d: d["workload"]["conversations"][0].update(turn_gap_us=-1), "workload.conversations[0].turn_gap_us"),
        (
            lambda d: d["workload"]["conversations"][0]["turns"][0].update(role="robot"),
            "workload.conversations[0].turns[0].role",
        ),
        (lambda d: d["workload"]["conversations"][1].update(id="kiwi"), "workload.conversations"),
        (
            lambda d: d["workload"].update(actions=[{"kind": "cancel", "at_us": 1, "request_id": "nobody"}]),
            "workload.actions[0].request_id",
        ),
    ],
)
def test_bad_lab_field_is_named(edit, field):
    with pytest.raises(ApiError) as caught:
        ExperimentDesign.from_json(_lab(edit))
    assert caught.value.field == field


def test_lab_file_errors_name_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ApiError) as caught:
        read_lab(path)
    assert caught.value.field == str(path)
    path.write_text(json.dumps(_lab(lambda d: None)))
    with pytest.raises(ApiError) as caught:
        read_lab(path)
    assert caught.value.field == "broken.json: id"


def test_unknown_lab_and_duplicate_ids_are_errors():
    with pytest.raises(ApiError):
        CATALOG.lab("no-such-lab")
    lab = CATALOG.experiments[0]
    with pytest.raises(ApiError) as caught:
        type(CATALOG)((lab, copy.deepcopy(lab)))
    assert caught.value.field == "experiments[1].id"


def test_defaults_assign_every_control_and_parse_as_a_kvsim_system():
    defaults = generation_defaults()
    assert set(defaults.execution.assignments) == set(CONTROLS)
    parse_system(defaults.execution.system_config_json())
    assert defaults.workload.requests
    with pytest.raises(ApiError):
        type(defaults).from_json({"execution": [], "workload": {"kind": "requests", "requests": []}})
    assert isinstance(defaults.execution, ExecutionSpec)


def test_listing_and_validating_labs_imports_no_jax():
    import subprocess
    import sys

    code = (
        "import sys; from experiments.commands.lab import main; main('lab', ['list']); "
        "from experiments.generation_defaults import generation_defaults; generation_defaults(); "
        "print('jax' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPOSITORY)
    assert result.stdout.strip().splitlines()[-1] == "False"
