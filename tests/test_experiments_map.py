"""InferenceMap: the declared containment hierarchy and relationships, as validated data."""

import copy
import json

import pytest

from experiments.inference_map import InferenceMap, default_inference_map, draw
from jgpt.foundation.errors import ApiError

COMPONENTS = {
    "RequestEndpoint",
    "RequestRouter",
    "InferenceEngine",
    "StateManager",
    "ResourcePool",
    "ComputeKernel",
    "DeviceRuntime",
    "CollectiveCommunication",
}


def test_system_contains_the_eight_boundary_components():
    m = default_inference_map()
    assert m.root.owner == "InferenceSystem"
    assert {child.owner for child in m.children(m.root.id)} == COMPONENTS
    owners = {node.id: node.owner for node in m.nodes}
    by_parent = lambda owner: {n.owner for n in m.nodes if n.parent and owners[n.parent] == owner}  # noqa: E731
    assert {"KVState", "KVCache", "StateTransfer"} == by_parent("StateManager")
    assert {"ResourceGraph", "ComputeService"} == by_parent("ResourcePool")
    assert {"RequestScheduling", "Tokenizer", "ModelExecution", "Decoding"} == by_parent("InferenceEngine")
    assert m.depth("engine.model_execution.attention") == 3


def test_map_round_trips_through_json():
    m = default_inference_map()
    text = json.dumps(m.to_json())
    assert InferenceMap.from_json(json.loads(text)) == m


def _broken(edit):
    document = copy.deepcopy(default_inference_map().to_json())
    edit(document)
    return document


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d["nodes"][3].update(owner="KVCacheConfig"), "inference_map.nodes[3].owner"),
        (lambda d: d["nodes"][3].update(kind="widget"), "inference_map.nodes[3].kind"),
        (lambda d: d["nodes"][3].update(expanded="yes"), "inference_map.nodes[3].expanded"),
        (lambda d: d["nodes"][3].pop("view"), "inference_map.nodes[3].view"),
        (lambda d: d["nodes"][3].update(parent="nowhere"), "inference_map.nodes[3].parent"),
        (lambda d: d["nodes"][3].update(id="system"), "inference_map.nodes[3].id"),
        (lambda d: d["nodes"][1].update(parent=None), "inference_map.nodes"),
        (lambda d: d["nodes"][0].update(parent="endpoint"), "inference_map.nodes"),
        (lambda d: d["relationships"][0].update(target="nowhere"), "inference_map.relationships[0].target"),
        (lambda d: d["relationships"][0].update(label=" "), "inference_map.relationships[0].label"),
    ],
)
def test_bad_map_names_the_field(edit, field):
    with pytest.raises(ApiError) as caught:
        InferenceMap.from_json(_broken(edit))
    assert caught.value.field == field


def test_cycle_in_containment_is_rejected():
    def cycle(d):
        d["nodes"][1]["parent"] = "endpoint.request"  # endpoint inside its own child

    with pytest.raises(ApiError) as caught:
        InferenceMap.from_json(_broken(cycle))
    assert "cycle" in caught.value.reason


def test_picture_is_drawn(tmp_path):
    path = draw(default_inference_map(), tmp_path / "map.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000
