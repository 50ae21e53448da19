"""The packages as layers: every module's imports follow docs/architecture.md, and its generated tables are current."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from jgpt import ontology  # noqa: E402

import package_layers  # noqa: E402


def test_every_import_of_the_tree_follows_the_layers():
    assert package_layers.violations(ROOT) == []


def test_the_reference_computation_imports_no_kernel():
    """model.py and operations.py are the whole reference: the kernels plug in through a plan, not an import."""
    found = package_layers.modules(ROOT)
    for module in package_layers.REFERENCE_MODULES:
        targets = [edge.target for edge in package_layers.imports(module, found[module], set(found))]
        assert targets and not [t for t in targets if t.startswith(package_layers.KERNELS)], (module, targets)


def test_a_kernel_imported_by_the_reference_is_refused(tmp_path):
    root = _tree(
        tmp_path,
        {
            "jgpt/__init__.py": "",
            "jgpt/kernels/__init__.py": "",
            "jgpt/kernels/fused.py": "",
            "jgpt/model.py": "from jgpt.kernels import fused\n",
            "jgpt/operations.py": "def f():\n    import jgpt.kernels\n",
            "jgpt/execution.py": "from jgpt.kernels import fused\n",  # anything else may
        },
    )
    why = "the reference computation imports no kernel; a kernel plan plugs kernels in"
    assert sorted(package_layers.violations(root)) == [
        f"jgpt/model.py:1: jgpt.model imports jgpt.kernels.fused: {why}",
        f"jgpt/operations.py:2: jgpt.operations imports jgpt.kernels: {why}",
    ]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_each_kind_of_bend_is_refused_with_its_file_and_line(tmp_path):
    root = _tree(
        tmp_path,
        {
            "jgpt/__init__.py": "",
            "jgpt/__main__.py": "from jgpt.commands.tokenize import render\n",  # an entry point may import a face
            "jgpt/core.py": "def f():\n    import inference.engine\n",  # lazy, and still upward
            "jgpt/errors.py": "",
            "jgpt/light.py": "from jgpt import errors\n",
            "jgpt/heavy.py": "from jgpt.deep import f\n",
            "jgpt/deep.py": "def f():\n    import jax.numpy\n",
            "jgpt/commands/__init__.py": "",
            "jgpt/commands/tokenize.py": "def render():\n    pass\n",
            "inference/__init__.py": "",
            "inference/engine.py": "from kvsim import simulate\nfrom jgpt.commands import tokenize\nimport kvsim.sim\n",
            "kvsim/__init__.py": "from kvsim.sim import simulate\n",
            "kvsim/sim.py": "from jgpt.light import errors\nfrom jgpt import heavy\n\ndef simulate():\n    pass\n",
            "experiments/__init__.py": "",
            "experiments/lab.py": "from kvsim import simulate\nfrom kvsim.sim import simulate as s\nfrom .commands import demo\n",
            "experiments/commands/demo.py": "import training\n",
            "training/__init__.py": "from experiments import lab\n",
        },
    )
    face = "a command module is a face; only entry points (__main__, jgpt.cli) import one"
    assert sorted(package_layers.violations(root)) == sorted(
        [
            "jgpt/core.py:2: jgpt.core imports inference.engine: jgpt may import only itself",
            f"inference/engine.py:2: inference.engine imports jgpt.commands.tokenize: {face}",
            "kvsim/sim.py:2: kvsim.sim imports jgpt.heavy: kvsim imports only jax-free jgpt modules; "
            "this one reaches jax.numpy (through jgpt.deep)",
            "experiments/lab.py:2: experiments.lab imports kvsim.sim: other packages use kvsim's public API: import the name "
            "from kvsim",
            "inference/engine.py:3: inference.engine imports kvsim.sim: other packages use kvsim's public API: import the name "
            "from kvsim",
            f"experiments/lab.py:3: experiments.lab imports experiments.commands.demo: {face}",
            "training/__init__.py:1: training imports experiments.lab: training may import only jgpt, inference",
        ]
    )


def test_the_committed_page_is_what_the_generator_writes():
    page = package_layers.DOC.read_text(encoding="utf-8")
    assert package_layers.generated(page) == page, "run: python tools/package_layers.py"


def test_every_admitted_concept_has_a_place_in_the_page():
    table = package_layers.concept_table(ROOT).splitlines()[2:]
    assert [row.split(" | ")[0].removeprefix("| ") for row in table] == [c.name for c in ontology.admitted_concepts()]
    assert not [row for row in table if row.endswith("| not in the code yet |")]


def test_the_concept_table_is_read_from_the_code(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kvsim/__init__.py": "",
            "kvsim/cache_policy.py": "class KVCacheConfig:\n    pass\n",
            "jgpt/__init__.py": '"""Embedding lives here."""\n',
        },
    )
    rows = {row.split(" | ")[0].removeprefix("| "): row for row in package_layers.concept_table(root).splitlines()}
    assert rows["KVCache"].endswith("| `kvsim/cache_policy.py` KVCacheConfig |")
    assert rows["Embedding"].endswith("| named in `jgpt/__init__.py` |")
    assert rows["Attention"].endswith("| not in the code yet |")
