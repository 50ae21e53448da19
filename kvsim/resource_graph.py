"""ResourceGraph: hypothetical execution locations and directed point-to-point links.

A scenario input that is validated and recorded with the run. As the ontology
says, no routing, placement or topology execution is implemented: the simulator
serves all work on the one compute resource and the one link of the system config.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from jgpt.errors import ApiError
from kvsim import fields


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


def parse_resource_graph(value: Any, field: str = "resource_graph") -> ResourceGraph:
    top = fields.mapping(value, field, {"basis", "nodes", "links"})
    nodes, links, ids = [], [], set()

    def claim(identity: str, at: str) -> str:
        if identity in ids:
            raise ApiError(at, f"duplicate id {identity!r}")
        ids.add(identity)
        return identity

    for index, item in enumerate(fields.array(top["nodes"], f"{field}.nodes")):
        at = f"{field}.nodes[{index}]"
        item = fields.mapping(item, at, {"id", "memory_capacity_bytes", "compute_flops_per_us", "memory_bytes_per_us"})
        nodes.append(
            ResourceNode(
                id=claim(fields.string(item["id"], f"{at}.id"), f"{at}.id"),
                memory_capacity_bytes=fields.integer(item["memory_capacity_bytes"], f"{at}.memory_capacity_bytes", 1),
                compute_flops_per_us=fields.positive_rate(item["compute_flops_per_us"], f"{at}.compute_flops_per_us"),
                memory_bytes_per_us=fields.positive_rate(item["memory_bytes_per_us"], f"{at}.memory_bytes_per_us"),
            )
        )
    node_ids = {node.id for node in nodes}
    for index, item in enumerate(fields.array(top["links"], f"{field}.links")):
        at = f"{field}.links[{index}]"
        item = fields.mapping(item, at, {"id", "source", "target", "bandwidth_bytes_per_us", "startup_us"})
        for end in ("source", "target"):
            if fields.string(item[end], f"{at}.{end}") not in node_ids:
                raise ApiError(f"{at}.{end}", f"no node with id {item[end]!r}")
        if item["source"] == item["target"]:
            raise ApiError(f"{at}.target", "a link joins two different nodes")
        links.append(
            ResourceLink(
                id=claim(fields.string(item["id"], f"{at}.id"), f"{at}.id"),
                source=item["source"],
                target=item["target"],
                bandwidth_bytes_per_us=fields.positive_rate(
                    item["bandwidth_bytes_per_us"], f"{at}.bandwidth_bytes_per_us"
                ),
                startup_us=fields.number(item["startup_us"], f"{at}.startup_us"),
            )
        )
    return ResourceGraph(fields.string(top["basis"], f"{field}.basis"), tuple(nodes), tuple(links))


def resource_graph_json(graph: ResourceGraph) -> dict:
    return {
        "basis": graph.basis,
        "nodes": [
            {
                "id": n.id,
                "memory_capacity_bytes": n.memory_capacity_bytes,
                "compute_flops_per_us": fields.json_number(n.compute_flops_per_us),
                "memory_bytes_per_us": fields.json_number(n.memory_bytes_per_us),
            }
            for n in graph.nodes
        ],
        "links": [
            {
                "id": link.id,
                "source": link.source,
                "target": link.target,
                "bandwidth_bytes_per_us": fields.json_number(link.bandwidth_bytes_per_us),
                "startup_us": fields.json_number(link.startup_us),
            }
            for link in graph.links
        ],
    }
