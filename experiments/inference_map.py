"""InferenceMap: the containment hierarchy of the inference system, with cross-component relationships.

The map is data (`inference_map.json`): nodes name the ontology concept that owns
them and their parent; relationships are labelled directed edges between nodes.
Containment explains where a mechanism sits; it does not claim separate
processes or execution order (the spec's InferenceSystem exclusions).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.ontology import is_admitted
from jgpt.foundation.validation import Boolean, ListOf, Nullable, Object, String, Text

DEFAULT_MAP = Path(__file__).with_name("inference_map.json")
NODE_KINDS = ("system", "component", "contract", "mechanism", "operation", "state")
VIEWS = ("service", "model", "state", "resources")


@dataclasses.dataclass(frozen=True)
class InferenceMapNode:
    id: str
    parent: str | None
    owner: str
    kind: str
    view: str
    expanded: bool


@dataclasses.dataclass(frozen=True)
class InferenceMapRelationship:
    source: str
    target: str
    label: str


@dataclasses.dataclass(frozen=True)
class InferenceMap:
    nodes: tuple[InferenceMapNode, ...]
    relationships: tuple[InferenceMapRelationship, ...]

    def __post_init__(self):
        _check_tree(self.nodes)
        ids = {node.id for node in self.nodes}
        for i, edge in enumerate(self.relationships):
            for end in ("source", "target"):
                if getattr(edge, end) not in ids:
                    raise ApiError(f"relationships[{i}].{end}", f"{getattr(edge, end)!r} is not a node id")
            if edge.source == edge.target:
                raise ApiError(f"relationships[{i}].target", "a relationship joins two different nodes")

    @property
    def root(self) -> InferenceMapNode:
        return next(node for node in self.nodes if node.parent is None)

    def children(self, node_id: str) -> tuple[InferenceMapNode, ...]:
        return tuple(node for node in self.nodes if node.parent == node_id)

    def depth(self, node_id: str) -> int:
        parents = {node.id: node.parent for node in self.nodes}
        parent, depth = parents[node_id], 0
        while parent is not None:
            parent, depth = parents[parent], depth + 1
        return depth

    @classmethod
    def from_json(cls, value: Any, field: str = "inference_map") -> InferenceMap:
        value = MAP.read(value, field)
        nodes = tuple(_node(entry, f"{field}.nodes[{i}]") for i, entry in enumerate(value["nodes"]))
        relationships = tuple(InferenceMapRelationship(**entry) for entry in value["relationships"])
        try:
            return cls(nodes, relationships)
        except ApiError as error:
            raise ApiError(f"{field}.{error.field}", error.reason) from None

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [dataclasses.asdict(node) for node in self.nodes],
            "relationships": [dataclasses.asdict(edge) for edge in self.relationships],
        }


# Owners, kinds and views are checked against the registry and NODE_KINDS, VIEWS by `_node`.
_NODE = Object({"id": String(), "parent": Nullable(String()), "owner": String(), "kind": String(), "view": String(),
                "expanded": Boolean()})  # fmt: skip
_RELATIONSHIP = Object({"source": String(), "target": String(), "label": Text()})  # a label says what it carries
MAP = Object({"nodes": ListOf(_NODE), "relationships": ListOf(_RELATIONSHIP)})


def default_inference_map() -> InferenceMap:
    """The baseline system's map, as declared in `inference_map.json`."""
    return InferenceMap.from_json(json.loads(DEFAULT_MAP.read_text(encoding="utf-8")), field=DEFAULT_MAP.name)


def _node(value: Any, field: str) -> InferenceMapNode:
    node = InferenceMapNode(**value)
    if not is_admitted(node.owner):
        raise ApiError(f"{field}.owner", f"{node.owner!r} is not an admitted ontology concept")
    if node.kind not in NODE_KINDS:
        raise ApiError(f"{field}.kind", f"{node.kind!r} is not one of {', '.join(NODE_KINDS)}")
    if node.view not in VIEWS:
        raise ApiError(f"{field}.view", f"{node.view!r} is not one of {', '.join(VIEWS)}")
    return node


def _check_tree(nodes: tuple[InferenceMapNode, ...]) -> None:
    parents: dict[str, str | None] = {}
    for i, node in enumerate(nodes):
        if node.id in parents:
            raise ApiError(f"nodes[{i}].id", f"{node.id!r} appears twice")
        parents[node.id] = node.parent
    roots = [i for i, node in enumerate(nodes) if node.parent is None]
    if len(roots) != 1:
        raise ApiError("nodes", f"a map has exactly one root (parent null), found {len(roots)}")
    for i, node in enumerate(nodes):
        if node.parent is not None and node.parent not in parents:
            raise ApiError(f"nodes[{i}].parent", f"{node.parent!r} is not a node id")
        seen, cursor = {node.id}, node.parent
        while cursor is not None:
            if cursor in seen:
                raise ApiError(f"nodes[{i}].parent", f"containment of {node.id!r} forms a cycle")
            seen.add(cursor)
            cursor = parents[cursor]


_VIEW_COLORS = {"service": "#dbeafe", "model": "#dcfce7", "state": "#fef3c7", "resources": "#f3e8ff"}


def _layout(inference_map: InferenceMap) -> dict[str, tuple[float, float]]:
    """Outline layout: every shown node takes its own row in pre-order, indented by depth."""
    positions: dict[str, tuple[float, float]] = {}

    def place(node: InferenceMapNode, depth: int) -> None:
        positions[node.id] = (float(depth), float(len(positions)))
        for child in inference_map.children(node.id) if node.expanded else ():
            place(child, depth + 1)

    place(inference_map.root, 0)
    return positions


def draw(inference_map: InferenceMap, path: Path) -> Path:
    """Draw containment as a tree (grey) and relationships as labelled arcs in a lane to its right (red)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path as CurvePath

    positions = _layout(inference_map)
    by_id = {node.id: node for node in inference_map.nodes}
    rows = 1 + max(y for _, y in positions.values())
    column, indent = 1.0, 1.0
    lane = max(x for x, _ in positions.values()) * column + 5.5
    fig, ax = plt.subplots(figsize=(12, 0.3 * rows + 1.2))
    for node_id, (x, y) in positions.items():
        parent = by_id[node_id].parent
        if parent is not None:
            px, py = positions[parent]
            elbow = px * column + indent / 2
            ax.plot([elbow, elbow, x * column], [py + 0.3, y, y], color="#9ca3af", lw=0.8, zorder=1)
    shown = [edge for edge in inference_map.relationships if edge.source in positions and edge.target in positions]
    for node_id in {end for edge in shown for end in (edge.source, edge.target)}:
        x, y = positions[node_id]
        ax.plot(
            [x * column + 0.105 * len(by_id[node_id].owner) + 0.2, lane],
            [y, y],
            color="#fca5a5",
            lw=0.6,
            ls=":",
            zorder=1,
        )
    for edge in shown:
        sy, ty = positions[edge.source][1], positions[edge.target][1]
        bulge = 0.9 + 0.55 * abs(ty - sy)
        curve = CurvePath([(lane, sy), (lane + bulge, (sy + ty) / 2), (lane, ty)], [1, 3, 3])
        ax.add_patch(FancyArrowPatch(path=curve, arrowstyle="->,head_length=4,head_width=2.5", color="#b91c1c", lw=0.8))
        ax.text(lane + bulge / 2 + 0.1, (sy + ty) / 2, edge.label, fontsize=6.5, color="#7f1d1d", va="center")
    for node_id, (x, y) in positions.items():
        node = by_id[node_id]
        ax.text(
            x * column,
            y,
            node.owner,
            ha="left",
            va="center",
            fontsize=8,
            zorder=3,
            bbox={"boxstyle": "round,pad=0.3", "fc": _VIEW_COLORS[node.view], "ec": "#374151", "lw": 0.6},
        )
    handles = [plt.Rectangle((0, 0), 1, 1, fc=color, ec="#374151") for color in _VIEW_COLORS.values()]
    ax.legend(handles, list(_VIEW_COLORS), loc="upper right", fontsize=7, title="view", title_fontsize=7)
    widest = max((0.9 + 0.55 * abs(positions[e.target][1] - positions[e.source][1])) / 2 for e in shown) if shown else 0
    ax.set_xlim(-0.3, lane + widest + 4.5)
    ax.set_ylim(rows, -1)
    ax.axis("off")
    ax.set_title("InferenceMap: containment (grey tree) and relationships (red arcs, source to target)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
