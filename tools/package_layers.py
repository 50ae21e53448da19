"""The package layers, read from the code, and the generated parts of docs/architecture.md.

    python tools/package_layers.py          # rewrite the generated parts of docs/architecture.md

Two parts of that page are generated here so that they cannot drift: the table of
allowed imports (from MAY_IMPORT, the same rules tests/test_architecture.py checks
every module's imports against) and the table of where each ontology concept lives
(from the ontology registry and the classes the code defines). The test fails when
the committed page differs from what this writes. Nothing here imports the packages
it reads (only `jgpt.ontology`, which is jax-free): the sources are parsed with `ast`.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jgpt import ontology  # noqa: E402

DOC = ROOT / "docs" / "architecture.md"
# Lowest first. Each package may import itself and the packages listed for it, nothing above.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "jgpt": (),
    "kvsim": ("jgpt",),
    "inference": ("jgpt", "kvsim"),
    "training": ("jgpt", "inference"),
    "experiments": ("jgpt", "kvsim", "inference", "training"),
}
PACKAGES = tuple(MAY_IMPORT)
WHY = {
    "jgpt": "the core: architectures, weights, operations, forward pass, KVState, tokenizer, artifacts, "
    "ontology registry, validation, errors",
    "kvsim": "the simulator: it reads recorded computation counts, never jax or model code, so of `jgpt` "
    "only modules that import no jax (checked through their own imports)",
    "inference": "jitted prefill/decode, evidence, the InferenceEngine; the engine serves the very "
    "KVResidencySystemConfig and Workload kvsim simulates, so it reads kvsim's config types",
    "training": "optax training; evaluation generates with inference",
    "experiments": "labs compose the whole flow",
}
SCRIPTS = ("bench", "tools")  # run as scripts on top of every package; they may import any package but no face
JAX = ("jax", "jaxlib", "flax", "optax", "orbax", "chex", "torch", "transformers")
FACE_FILES = ("cli.py", "commands.py")  # and every module of a `commands/` package
# The reference computation, readable alone: these modules import nothing from the kernels package, which plugs
# into them only through the callables a kernel plan hands the forward pass (`jgpt.operations.KernelCalls`).
REFERENCE_MODULES = ("jgpt.model", "jgpt.operations")
KERNELS = "jgpt.kernels"


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
    return f"{parts[-1]}.py" in FACE_FILES or "commands" in parts[1:]


def is_entry_point(module: str) -> bool:
    """`python -m PACKAGE` and the umbrella `jgpt` command: the only modules that may import a face."""
    return module.endswith(".__main__") or module == "jgpt.cli"


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
        source, target = edge.module.split(".")[0], edge.target.split(".")[0]
        if source in MAY_IMPORT and target in MAY_IMPORT and target != source and target not in MAY_IMPORT[source]:
            refuse(edge, f"{source} may import only {', '.join(MAY_IMPORT[source]) or 'itself'}")
        if is_face(edge.target) and not is_entry_point(edge.module):
            refuse(edge, "a command module is a face; only entry points (__main__, jgpt.cli) import one")
        if source == "kvsim" and target in JAX:
            refuse(edge, "kvsim imports no jax or model libraries")
        if source in MAY_IMPORT and source != "kvsim" and target == "kvsim" and edge.target != "kvsim":
            refuse(edge, "other packages use kvsim's public API: import the name from kvsim")
        if edge.module in REFERENCE_MODULES and (edge.target == KERNELS or edge.target.startswith(KERNELS + ".")):
            refuse(edge, "the reference computation imports no kernel; a kernel plan plugs kernels in")
    for edge in edges:
        if edge.module.startswith("kvsim") and edge.target.startswith("jgpt"):
            heavy = _jax_reached(edge.target, edges)
            if heavy:
                refuse(edge, f"kvsim imports only jax-free jgpt modules; this one reaches {heavy}")
    return problems


def _jax_reached(start: str, edges: list[Import]) -> str | None:
    """The first jax-family import reachable from a module through its own imports (any depth), if any."""
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
            if target.split(".")[0] in JAX:
                return f"{target} (through {module})"
            stack.append(target)
    return None


def layer_table() -> str:
    rows = ["| package | may import | why |", "|---|---|---|"]
    for package, allowed in MAY_IMPORT.items():
        names = ", ".join(f"`{name}`" for name in allowed) or "nothing but itself"
        rows.append(f"| `{package}` | {names} | {WHY[package]} |")
    rows.append(f"| {', '.join(f'`{s}`' for s in SCRIPTS)} | every package | scripts on top of everything |")
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


def _replace(text: str, part: str, body: str) -> str:
    begin, end = f"<!-- generated: {part} (tools/package_layers.py) -->", f"<!-- end: {part} -->"
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{DOC}: expected one {begin} ... {end} pair")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{body}\n{end}{rest.split(end)[1]}"


def generated(text: str, root: Path = ROOT) -> str:
    """The page with its generated parts written afresh."""
    return _replace(_replace(text, "layers", layer_table()), "concepts", concept_table(root))


if __name__ == "__main__":
    page = DOC.read_text(encoding="utf-8")
    DOC.write_text(generated(page), encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
