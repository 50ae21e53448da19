"""The ontology registry: the admitted concepts as data, and OntologyBinding validation."""

import subprocess
import sys
from pathlib import Path

import pytest

from jgpt.foundation import ontology
from jgpt.foundation.errors import ApiError
from jgpt.foundation.ontology import OntologyBinding

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import ontology_from_spec  # noqa: E402


def test_registry_admits_exactly_the_42_concepts_of_the_spec():
    names = [c.name for c in ontology.admitted_concepts()]
    assert len(names) == 42
    assert len(set(names)) == 42
    for name in ("ModelArchitecture", "KVCache", "ExperimentSpec", "InspectionState", "CustomerInteraction"):
        assert ontology.is_admitted(name)


def test_records_are_not_concepts():
    # Records such as KVCacheConfig or OntologyBinding belong to a concept but are not admitted themselves.
    for record in ("KVCacheConfig", "OntologyBinding", "InferenceMap", "CacheEvent", "RunOutcome"):
        assert not ontology.is_admitted(record)
    assert not ontology.is_admitted("kvcache")
    assert not ontology.is_admitted(None)


def test_concepts_carry_description_lifecycle_owns_excludes_and_fields():
    kv_cache = ontology.concept("KVCache")
    assert kv_cache.description.startswith("Manage allocation, residency")
    assert kv_cache.lifecycle.startswith("Configuration is fixed for a run")
    assert kv_cache.owns[0] == "Logical device and host KV budgets and exact whole-prefix LRU retention"
    assert "The numerical keys and values belong to KVState" in kv_cache.excludes
    assert kv_cache.record("KVCacheConfig").field_names == ("device_kv_bytes", "host_kv_bytes", "retention_policy")
    system = ontology.concept("InferenceSystem")
    assert system.record("KVResidencySystemConfig").field_names == (
        "max_requests",
        "max_new_tokens_cap",
        "scheduling",
        "kv_cache",
        "transfer",
        "compute_service",
    )
    assert ontology.owner_of_record("StateTransferConfig").name == "StateTransfer"
    for c in ontology.admitted_concepts():
        assert c.description and c.lifecycle and c.owns and c.excludes and c.records, c.name


def test_excludes_items_keep_their_inner_commas():
    event = ontology.concept("ExperimentEvent")
    assert event.excludes[-1] == "Response publication and completion payloads, owned by InferenceResponse"
    policy = ontology.concept("GenerationPolicy")
    assert policy.excludes == (
        "model initialization",
        "system capacity",
        "Backend execution strategies such as speculative drafting and verification",
        "observed outcomes",
    )


def test_unknown_concept_is_an_api_error():
    with pytest.raises(ApiError) as caught:
        ontology.concept("KVCacheConfig")
    assert caught.value.field == "concept"
    with pytest.raises(ApiError):
        ontology.owner_of_record("NoSuchRecord")


def test_binding_accepts_admitted_primary_and_other_related():
    binding = OntologyBinding("KVCache", ("StateTransfer", "Workload"))
    assert binding.to_json() == {"primary": "KVCache", "related": ["StateTransfer", "Workload"]}
    assert OntologyBinding.from_json(binding.to_json()) == binding
    assert OntologyBinding("ApiError").related == ()


@pytest.mark.parametrize(
    "primary, related, field",
    [
        ("KVCacheConfig", (), "ontology_binding.primary"),
        (7, (), "ontology_binding.primary"),
        ("KVCache", ("KVCache",), "ontology_binding.related[0]"),
        ("KVCache", ("Workload", "Paging"), "ontology_binding.related[1]"),
        ("KVCache", ("Workload", "Workload"), "ontology_binding.related[1]"),
        ("KVCache", "Workload", "ontology_binding.related"),
    ],
)
def test_binding_rejects_with_the_field_at_fault(primary, related, field):
    with pytest.raises(ApiError) as caught:
        OntologyBinding(primary, related)
    assert caught.value.field == field


@pytest.mark.parametrize(
    "value, field",
    [
        ([], "labs[2].ontology_binding"),
        ({"related": []}, "labs[2].ontology_binding.primary"),
        ({"primary": "KVCache", "related": "Workload"}, "labs[2].ontology_binding.related"),
        ({"primary": "KVCache", "subjects": []}, "labs[2].ontology_binding.subjects"),
        ({"primary": "KVCache", "related": ["Cache"]}, "labs[2].ontology_binding.related[0]"),
    ],
)
def test_binding_from_json_names_the_nested_field(value, field):
    with pytest.raises(ApiError) as caught:
        OntologyBinding.from_json(value, field="labs[2].ontology_binding")
    assert caught.value.field == field


def test_registry_imports_no_jax():
    code = "import sys, jgpt.foundation.ontology as o; o.admitted_concepts(); print('jax' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "False"


SPEC_EXCERPT = """What governs this run?

Workload

An ordered collection of request arrivals; array order breaks equal-time ties.

Immutable in an identified execution record.

Owns: An ordered collection of request arrivals; array order breaks equal-time ties.. Excludes: Actual admission order, Generated outputs and measured completion times.

Workload

kind

Arrival policy

requests

Ordered requests

ApiError

An explicit failure message.

Produced for a rejected operation.

Owns: An explicit failure message., Its text.. Excludes: Successful output, owned by InferenceResponse, A retry policy.

ApiError

error

Explicit rejection reason
"""


def test_generator_reads_concepts_records_and_clauses():
    concepts = ontology_from_spec.parse(SPEC_EXCERPT)
    assert [c["name"] for c in concepts] == ["Workload", "ApiError"]
    workload, error = concepts
    assert workload["records"] == {
        "Workload": [{"name": "kind", "note": "Arrival policy"}, {"name": "requests", "note": "Ordered requests"}]
    }
    assert workload["excludes"] == ["Actual admission order", "Generated outputs and measured completion times"]
    assert error["owns"] == ["An explicit failure message", "Its text"]
    assert error["excludes"] == ["Successful output, owned by InferenceResponse", "A retry policy"]
