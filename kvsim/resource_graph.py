"""ResourceGraph: hypothetical execution locations and directed point-to-point links.

A scenario input that is validated and recorded with the run. As the ontology
says, no routing, placement or topology execution is implemented: the simulator
serves all work on the one compute resource and the one link of the system config.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import Integer, ListOf, Number, Object, Rate, String, json_number


@dataclass(frozen=True)
class ResourceNode:
    id: str
    memory_capacity_bytes: int
    compute_flops_per_us: Fraction
    memory_bytes_per_us: Fraction


@dataclass(frozen=True)
class ResourceLink:
    id: str
    source: str
    target: str
    bandwidth_bytes_per_us: Fraction
    startup_us: Fraction


@dataclass(frozen=True)
class ResourceGraph:
    basis: str
    nodes: tuple[ResourceNode, ...]
    links: tuple[ResourceLink, ...]


NODE = Object({"id": String(), "memory_capacity_bytes": Integer(1), "compute_flops_per_us": Rate(),
               "memory_bytes_per_us": Rate()})  # fmt: skip
LINK = Object({"id": String(), "source": String(), "target": String(), "bandwidth_bytes_per_us": Rate(),
               "startup_us": Number()})  # fmt: skip
RESOURCE_GRAPH = Object(
    {"basis": String(), "nodes": ListOf(NODE), "links": ListOf(LINK)},
    about="ResourceGraph: hypothetical locations and links, validated and recorded (not simulated).",
)


def parse_resource_graph(value: Any, field: str = "resource_graph") -> ResourceGraph:
    top = RESOURCE_GRAPH.read(value, field)
    ids: set[str] = set()

    def claim(identity: str, at: str) -> str:
        if identity in ids:
            raise ApiError(at, f"duplicate id {identity!r}")
        ids.add(identity)
        return identity

    nodes = [ResourceNode(**item | {"id": claim(item["id"], f"{field}.nodes[{index}].id")})
             for index, item in enumerate(top["nodes"])]  # fmt: skip
    node_ids = {node.id for node in nodes}
    links = []
    for index, item in enumerate(top["links"]):
        at = f"{field}.links[{index}]"
        for end in ("source", "target"):
            if item[end] not in node_ids:
                raise ApiError(f"{at}.{end}", f"no node with id {item[end]!r}")
        if item["source"] == item["target"]:
            raise ApiError(f"{at}.target", "a link joins two different nodes")
        links.append(ResourceLink(**item | {"id": claim(item["id"], f"{at}.id")}))
    return ResourceGraph(top["basis"], tuple(nodes), tuple(links))


def resource_graph_json(graph: ResourceGraph) -> dict:
    return {
        "basis": graph.basis,
        "nodes": [
            {
                "id": n.id,
                "memory_capacity_bytes": n.memory_capacity_bytes,
                "compute_flops_per_us": json_number(n.compute_flops_per_us),
                "memory_bytes_per_us": json_number(n.memory_bytes_per_us),
            }
            for n in graph.nodes
        ],
        "links": [
            {
                "id": link.id,
                "source": link.source,
                "target": link.target,
                "bandwidth_bytes_per_us": json_number(link.bandwidth_bytes_per_us),
                "startup_us": json_number(link.startup_us),
            }
            for link in graph.links
        ],
    }
