"""ExperimentSpec and ExecutionSpec: controls, bindings, one assignment per control."""

import pytest

from experiments.controls import CONTROLS
from experiments.experiment_spec import ExecutionSpec, ExperimentSpec
from jgpt.foundation.errors import ApiError
from jgpt.foundation.ontology import OntologyBinding, concept

SYSTEM_FIELDS = {
    "max_requests",
    "max_new_tokens_cap",
    "scheduling.max_active_requests",
    "kv_cache.device_kv_bytes",
    "kv_cache.host_kv_bytes",
    "kv_cache.retention_policy",
    "transfer.link_bytes_per_us",
    "transfer.link_latency_us",
    "compute_service.compute_flops_per_us",
    "compute_service.memory_bytes_per_us",
}


def test_controls_cover_model_generation_and_every_system_config_field():
    names = set(CONTROLS)
    assert "model.model_id" in names
    assert {f"generation.{f}" for f in concept("GenerationPolicy").record("GenerationPolicy").field_names} <= names
    assert SYSTEM_FIELDS <= names
    # the spec's records list the same fields the controls name
    system = concept("InferenceSystem").record("KVResidencySystemConfig").field_names
    assert {name.split(".")[0] for name in SYSTEM_FIELDS} == set(system)


def test_control_choices_match_the_packages_that_consume_them():
    from inference.policy import GREEDY, STOPPING
    from kvsim.system import RETENTION_POLICIES, SCHEDULING_POLICIES

    assert CONTROLS["generation.selection"].choices == (GREEDY,)
    assert CONTROLS["generation.stopping"].choices == (STOPPING,)
    assert CONTROLS["kv_cache.retention_policy"].choices == RETENTION_POLICIES
    assert CONTROLS["scheduling.policy"].choices == SCHEDULING_POLICIES


def test_every_control_binds_to_an_admitted_owner():
    for control in CONTROLS.values():
        assert ExperimentSpec.of(control.name, _example(control)).ontology_binding.primary == control.owner


def _example(control):
    if control.choices:
        return control.choices[0]
    return {str: "x", int: 1, float: 1.5}[control.kind]


def test_spec_round_trips_through_json():
    spec = ExperimentSpec.of("kv_cache.host_kv_bytes", 4096, related=("StateTransfer",))
    again = ExperimentSpec.from_json(spec.to_json(), "settings[0]")
    assert again == spec
    assert ExperimentSpec.from_json({"control": "kv_cache.host_kv_bytes", "value": 0}, "s").ontology_binding == (
        OntologyBinding("KVCache")
    )


@pytest.mark.parametrize(
    "entry, field",
    [
        ({"control": "kv_cache.size", "value": 1}, "settings[0].control"),
        ({"control": 3, "value": 1}, "settings[0].control"),
        ({"value": 1}, "settings[0].control"),
        ({"control": "kv_cache.device_kv_bytes"}, "settings[0].value"),
        ({"control": "kv_cache.device_kv_bytes", "value": "lots"}, "settings[0].value"),
        ({"control": "kv_cache.device_kv_bytes", "value": True}, "settings[0].value"),
        ({"control": "kv_cache.device_kv_bytes", "value": 0}, "settings[0].value"),
        ({"control": "kv_cache.device_kv_bytes", "value": 1.5}, "settings[0].value"),
        ({"control": "transfer.link_bytes_per_us", "value": 0}, "settings[0].value"),
        ({"control": "transfer.link_bytes_per_us", "value": float("nan")}, "settings[0].value"),
        ({"control": "kv_cache.retention_policy", "value": "fifo"}, "settings[0].value"),
        ({"control": "generation.selection", "value": "top_k"}, "settings[0].value"),
        ({"control": "kv_cache.host_kv_bytes", "value": 1, "note": "x"}, "settings[0].note"),
        (
            {"control": "kv_cache.host_kv_bytes", "value": 1, "ontology_binding": {"primary": "Workload"}},
            "settings[0].ontology_binding.primary",
        ),
        (
            {
                "control": "kv_cache.host_kv_bytes",
                "value": 1,
                "ontology_binding": {"primary": "KVCache", "related": ["KVCache"]},
            },
            "settings[0].ontology_binding.related[0]",
        ),
        ("kv_cache.host_kv_bytes=1", "settings[0]"),
    ],
)
def test_bad_settings_name_the_field(entry, field):
    with pytest.raises(ApiError) as caught:
        ExecutionSpec.from_json([entry], "settings")
    assert caught.value.field == field


def test_conflicting_assignments_are_an_error_never_an_override():
    entries = [
        {"control": "kv_cache.device_kv_bytes", "value": 100},
        {"control": "transfer.link_latency_us", "value": 2},
        {"control": "kv_cache.device_kv_bytes", "value": 200},
    ]
    with pytest.raises(ApiError) as caught:
        ExecutionSpec.from_json(entries, "settings")
    assert caught.value.field == "settings[2].control"
    assert "settings[0]" in caught.value.reason and "conflicting" in caught.value.reason
    one = ExecutionSpec((ExperimentSpec.of("kv_cache.device_kv_bytes", 100),))
    other = ExecutionSpec((ExperimentSpec.of("kv_cache.device_kv_bytes", 200),))
    with pytest.raises(ApiError):
        one.compose(other)
    with pytest.raises(ApiError):
        one.compose(one)  # even the same value twice is a second assignment


def test_defaults_fill_only_unassigned_controls():
    mine = ExecutionSpec((ExperimentSpec.of("kv_cache.device_kv_bytes", 100),))
    defaults = ExecutionSpec(
        (ExperimentSpec.of("kv_cache.device_kv_bytes", 999), ExperimentSpec.of("kv_cache.host_kv_bytes", 7))
    )
    resolved = mine.over(defaults)
    assert resolved.assignments == {"kv_cache.device_kv_bytes": 100, "kv_cache.host_kv_bytes": 7}
    assert resolved.value("kv_cache.device_kv_bytes") == 100
    with pytest.raises(ApiError):
        mine.value("transfer.link_latency_us")


def test_system_controls_nest_into_the_kvsim_config_document():
    spec = ExecutionSpec(
        (
            ExperimentSpec.of("model.model_id", "tiny"),
            ExperimentSpec.of("max_requests", 8),
            ExperimentSpec.of("kv_cache.device_kv_bytes", 100),
            ExperimentSpec.of("transfer.link_bytes_per_us", 2.5),
        )
    )
    assert spec.system_config_json() == {
        "max_requests": 8,
        "kv_cache": {"device_kv_bytes": 100},
        "transfer": {"link_bytes_per_us": 2.5},
    }
