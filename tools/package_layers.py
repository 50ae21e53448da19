"""The layers, read from the code, and the generated page docs/layers.md.

    python tools/package_layers.py          # rewrite docs/layers.md

The page is generated whole so that it cannot drift: the table of allowed imports (from MAY_IMPORT, the
same rules tests/test_architecture.py checks every module's imports against) and the table of where each
ontology concept lives (from the ontology registry and the classes the code defines). The test fails when
the committed page differs from what this writes. Nothing here imports the packages it reads (only
`jgpt.foundation.ontology`, which is pure Python): the sources are parsed with `ast`.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jgpt.foundation import ontology  # noqa: E402

DOC = ROOT / "docs" / "layers.md"  # generated whole; docs/architecture.md explains it and links to it
# The rooms of jgpt, each a layer of its own, lowest first.
ROOMS = ("foundation", "runtime", "tokenizers", "model", "kernels", "artifacts", "cli")
CORE = ("jgpt.foundation", "jgpt.runtime", "jgpt.tokenizers", "jgpt.model", "jgpt.kernels", "jgpt.artifacts")
# Lowest first. Each layer may import itself and the layers listed for it, nothing else.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "jgpt.foundation": (),
    "jgpt.runtime": ("jgpt.foundation",),
    "jgpt.tokenizers": ("jgpt.foundation",),
    "jgpt.model": ("jgpt.foundation", "jgpt.runtime"),
    "jgpt.kernels": ("jgpt.foundation", "jgpt.runtime", "jgpt.model"),
    "jgpt.artifacts": ("jgpt.foundation", "jgpt.runtime", "jgpt.tokenizers", "jgpt.model"),
    "kvsim": ("jgpt.foundation", "jgpt.tokenizers"),
    "inference": (*CORE, "kvsim"),
    "training": (*CORE, "inference"),
    "experiments": (*CORE, "kvsim", "inference", "training"),
    "jgpt.cli": (*CORE, "kvsim", "inference", "training", "experiments"),
    "jgpt": ("jgpt.cli",),
}
LAYERS = tuple(MAY_IMPORT)
PACKAGES = ("jgpt", "kvsim", "inference", "training", "experiments")
WHY = {
    "jgpt.foundation": "errors, validation, JSON input, identities, paths, units, progress, limits, the ontology "
    "registry, the command-line parser: pure Python, no jax and no numpy",
    "jgpt.runtime": "JAX backends and meshes, the compilation cache and its trusted directories, malloc settings",
    "jgpt.tokenizers": "jgpt's byte-level BPE, Hugging Face tokenizers, the Encoding, chat templates in a child "
    "process; jax-free",
    "jgpt.model": "the model math in pure JAX: architecture, weights, operations, the forward pass, KVState",
    "jgpt.kernels": "the kernel plan and the compiled kernels it plugs into the forward pass",
    "jgpt.artifacts": "ModelArtifact, the catalog, Hugging Face import and export",
    "kvsim": "the simulator: it reads recorded computation counts, never jax or model code; of jgpt only the "
    "jax-free foundation and the tokenizers' framing ids (checked through their own imports)",
    "inference": "jitted prefill/decode, evidence, the InferenceEngine; the engine serves the very "
    "KVResidencySystemConfig and Workload kvsim simulates, and decides with kvsim's serving policy",
    "training": "optax training; evaluation generates with inference",
    "experiments": "labs compose the whole flow",
    "jgpt.cli": "the command-line faces; `main` is the umbrella `jgpt` command above every package",
    "jgpt": "`python -m jgpt`, the umbrella command",
}
SCRIPTS = ("bench", "tools")  # run as scripts on top of every package; they may import any package but no face
JAX = ("jax", "jaxlib", "flax", "optax", "orbax", "chex", "torch", "transformers")
# Layers that must run where jax is not installed (kvsim's hosts, the Makefile's first `python3 -m`): checked
# through every import they reach, any depth. numpy is refused in the foundation too.
JAX_FREE = {"jgpt.foundation": JAX + ("numpy",), "jgpt.tokenizers": JAX, "kvsim": JAX}
FACE_FILES = ("commands.py",)  # and every module of a `commands/` package and of jgpt.cli
ENTRY_POINTS = ("jgpt.cli.main",)  # and every `__main__`
# The reference computation, readable alone: the model room sits below the kernels, which plug into it only
# through the callables a kernel plan hands the forward pass (`jgpt.model.operations.KernelCalls`).
REFERENCE_MODULES = ("jgpt.model.transformer", "jgpt.model.operations")
KERNELS = "jgpt.kernels"


def layer(module: str) -> str:
    """The layer a dotted module belongs to: a room of jgpt, or a top-level package."""
    parts = module.split(".")
    if parts[0] == "jgpt" and len(parts) > 1 and parts[1] in ROOMS:
        return f"jgpt.{parts[1]}"
    return parts[0]


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the module imported, dotted (a name imported from a package resolves to its submodule)
    line: int


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES + SCRIPTS) -> dict[str, Path]:
    """Every Python module of `packages` by dotted name (a package by its own name)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(module: str, path: Path, known: set[str]) -> list[Import]:
    """Every import statement of a module, at any depth (a lazy import is still a dependency)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append(Import(module, submodule if submodule in known else base, node.lineno))
    return found


def is_face(module: str) -> bool:
    """A command-line face: argument parsing and printing over the library, never a library itself."""
    parts = module.split(".")
    return f"{parts[-1]}.py" in FACE_FILES or "commands" in parts[1:] or layer(module) == "jgpt.cli"


def is_entry_point(module: str) -> bool:
    """`python -m PACKAGE` and the umbrella `jgpt` command: the only modules that may import a face."""
    return module.endswith(".__main__") or module in ENTRY_POINTS


def private_uses(module: str, path: Path, known: set[str]) -> list[Import]:
    """Names with a leading underscore taken from another module of the tree: imported by name, or read
    as an attribute of a module imported whole (`from pkg import mod` then `mod._name`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if target in known:
                    bound[alias.asname or alias.name] = target
                elif alias.name.startswith("_") and not alias.name.startswith("__") and node.module in known:
                    found.append(Import(module, target, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in known:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(Import(module, f"{bound[node.value.id]}.{node.attr}", node.lineno))
    return [use for use in found if use.target.rpartition(".")[0] != module]


def violations(root: Path = ROOT) -> list[str]:
    """Every import against the rules of docs/architecture.md, as `path:line: module imports target: why`."""
    found = modules(root)
    known = set(found)
    edges = [edge for module, path in found.items() for edge in imports(module, path, known)]
    problems = []

    def refuse(edge: Import, why: str) -> None:
        problems.append(
            f"{found[edge.module].relative_to(root).as_posix()}:{edge.line}: {edge.module} imports {edge.target}: {why}"
        )

    for edge in edges:
        source, target = layer(edge.module), layer(edge.target)
        if source in MAY_IMPORT and target in MAY_IMPORT and target != source and target not in MAY_IMPORT[source]:
            refuse(edge, f"{source} may import only {', '.join(MAY_IMPORT[source]) or 'itself'}")
        if is_face(edge.target) and not is_entry_point(edge.module) and not is_face(edge.module):
            refuse(edge, "a command module is a face; only entry points (__main__, jgpt.cli.main) import one")
        if source in JAX_FREE and target in JAX_FREE[source]:
            refuse(edge, f"{source} imports no {target}")
        if (
            source in MAY_IMPORT
            and source not in ("kvsim", "jgpt.cli")
            and target == "kvsim"
            and edge.target != "kvsim"
        ):
            refuse(edge, "other packages use kvsim's public API: import the name from kvsim")
    for edge in edges:
        source = layer(edge.module)
        if source in JAX_FREE and edge.target.startswith("jgpt") and layer(edge.target) != source:
            heavy = _reached(edge.target, edges, JAX_FREE[source])
            if heavy:
                refuse(
                    edge,
                    f"{source} imports only modules free of {', '.join(JAX_FREE[source])}; this one reaches {heavy}",
                )
    for module, path in found.items():
        for use in private_uses(module, path, known):
            refuse(use, "a name with a leading underscore is private to its module")
    for edge, cycle in cycles(edges, known):
        refuse(edge, f"import cycle {' -> '.join(cycle)}")
    return list(dict.fromkeys(problems))


def cycles(edges: list[Import], known: set[str]) -> list[tuple[Import, list[str]]]:
    """Every import between modules of the tree that lies on a cycle of imports, with the shortest cycle through
    it (`[a, b, ..., a]`). A circle of modules only loads in one order, or through an import hidden in a function;
    each of its imports is listed, so the one to move is named wherever it is."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if edge.target in known:
            graph.setdefault(edge.module, set()).add(edge.target)
    found = []
    for edge in edges:
        back = _shortest_path(edge.target, edge.module, graph) if edge.target in known else None
        if back is not None:
            found.append((edge, [edge.module, *back]))
    return found


def _shortest_path(start: str, end: str, graph: dict[str, set[str]]) -> list[str] | None:
    """The modules from `start` to `end` along imports, fewest first (breadth first, in name order), or None."""
    previous: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier and end not in previous:
        following = []
        for module in frontier:
            for target in sorted(graph.get(module, ())):
                if target not in previous:
                    previous[target] = module
                    following.append(target)
        frontier = following
    if end not in previous:
        return None
    path = [end]
    while (before := previous[path[-1]]) is not None:
        path.append(before)
    return path[::-1]


def _reached(start: str, edges: list[Import], refused: tuple[str, ...]) -> str | None:
    """The first import of a `refused` library reachable from a module through its own imports (any depth)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.module, set()).add(edge.target)
    seen, stack = set(), [start]
    while stack:
        module = stack.pop()
        if module in seen:
            continue
        seen.add(module)
        parents = [module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)]  # run before it
        for target in sorted(graph.get(module, set()) | set(parents)):
            if target.split(".")[0] in refused:
                return f"{target} (through {module})"
            stack.append(target)
    return None


def layer_table() -> str:
    rows = ["| layer | may import | why |", "|---|---|---|"]
    for name, allowed in MAY_IMPORT.items():
        names = ", ".join(f"`{other}`" for other in allowed) or "nothing but itself"
        rows.append(f"| `{name}` | {names} | {WHY[name]} |")
    rows.append(
        f"| {', '.join(f'`{s}`' for s in SCRIPTS)} | every layer but the faces | scripts on top of everything |"
    )
    return "\n".join(rows)


def _classes(root: Path) -> dict[str, list[str]]:
    """Top-level class name -> the package modules (paths) that define a class of that name."""
    found: dict[str, list[str]] = {}
    for path in modules(root, PACKAGES).values():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(path.relative_to(root).as_posix())
    return found


def _namings(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Path -> text that may name a concept no class is named after: first module docstrings and package
    data, then whole module sources."""
    docstrings, sources = {}, {}
    for path in modules(root, PACKAGES).values():
        name, source = path.relative_to(root).as_posix(), path.read_text(encoding="utf-8")
        docstrings[name], sources[name] = ast.get_docstring(ast.parse(source)) or "", source
    for package in PACKAGES:
        for path in sorted((root / package).glob("*.json")):
            if path.name != "ontology.json":
                docstrings[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return docstrings, sources


def concept_table(root: Path = ROOT) -> str:
    """Per admitted concept: the modules defining a class named after it or one of its records, or
    else the module docstrings and package data files that name it, or else the modules that do."""
    classes, namings = _classes(root), None
    rows = ["| concept | what it is | where it lives |", "|---|---|---|"]
    for concept in ontology.admitted_concepts():
        names = list(dict.fromkeys([concept.name, *(record.name for record in concept.records)]))
        places: dict[str, list[str]] = {}
        for name in names:
            for path in classes.get(name, ()):
                places.setdefault(path, []).append(name)
        if places:
            where = "; ".join(f"`{path}` {', '.join(found)}" for path, found in places.items())
        else:
            namings = namings if namings is not None else _namings(root)
            pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
            named = next(
                (
                    [path for path, text in texts.items() if pattern.search(text)]
                    for texts in namings
                    if any(pattern.search(text) for text in texts.values())
                ),
                [],
            )
            where = ("named in " + ", ".join(f"`{path}`" for path in named)) if named else "not in the code yet"
        rows.append(f"| {concept.name} | {concept.description} | {where} |")
    return "\n".join(rows)


HEADER = """# Layers and concepts (generated)

Written by `python tools/package_layers.py` from the rules in that file and from the code; do not edit
by hand. `tests/test_architecture.py` fails when this page differs from what the tool writes, and when
any module's imports break the rules below. docs/architecture.md explains them.
"""


def generated(root: Path = ROOT) -> str:
    """The whole page, written afresh."""
    return (
        f"{HEADER}\n## Layers and allowed imports\n\nLowest first; each layer may import itself and the layers "
        f"listed for it.\n\n{layer_table()}\n\n## Where each concept lives\n\n{concept_table(root)}\n"
    )


if __name__ == "__main__":
    DOC.write_text(generated(), encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
