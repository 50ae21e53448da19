"""The rooms and packages as layers: every module's imports follow docs/architecture.md; docs/layers.md is current."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from jgpt.foundation import ontology  # noqa: E402

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
            "jgpt/model/transformer.py": "from jgpt.kernels import fused\n",
            "jgpt/model/operations.py": "def f():\n    import jgpt.kernels\n",
            "inference/__init__.py": "",
            "inference/execution.py": "from jgpt.kernels import fused\n",  # anything else above the kernels may
        },
    )
    why = "jgpt.model may import only jgpt.foundation, jgpt.runtime"  # the kernels sit above the model
    assert sorted(package_layers.violations(root)) == sorted(
        [
            f"jgpt/model/transformer.py:1: jgpt.model.transformer imports jgpt.kernels.fused: {why}",
            f"jgpt/model/operations.py:2: jgpt.model.operations imports jgpt.kernels: {why}",
        ]
    )


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
            "jgpt/__main__.py": "from jgpt.cli.tokenize import render\n",  # an entry point may import a face
            "jgpt/model/core.py": "def f():\n    import inference.engine\n",  # lazy, and still upward
            "jgpt/model/deep.py": "def f():\n    import jax.numpy\n",
            "jgpt/foundation/errors.py": "import numpy\n",
            "jgpt/foundation/light.py": "from jgpt.foundation import errors\n",
            "jgpt/tokenizers/words.py": "from jgpt.model import deep\n",
            "jgpt/cli/__init__.py": "",
            "jgpt/cli/tokenize.py": "def render():\n    pass\n",
            "inference/__init__.py": "",
            "inference/engine.py": "from kvsim import simulate\nfrom jgpt.cli import tokenize\nimport kvsim.sim\n",
            "kvsim/__init__.py": "from kvsim.sim import simulate\n",
            "kvsim/sim.py": "from jgpt.foundation.light import errors\nfrom jgpt.tokenizers import words\n\n"
            "def simulate():\n    pass\n\ndef _helper():\n    pass\n",
            "experiments/__init__.py": "",
            "experiments/lab.py": "from kvsim import simulate\nfrom kvsim.sim import _helper\nfrom .commands import demo\n",
            "experiments/commands/demo.py": "import training\n",
            "training/__init__.py": "from experiments import lab\n",
        },
    )
    face = "a command module is a face; only entry points (__main__, jgpt.cli.main) import one"
    kvsim_api = "other packages use kvsim's public API: import the name from kvsim"
    # the upward import closes a circle: demo -> training -> lab -> demo
    cycle = "import cycle experiments.commands.demo -> training -> experiments.lab -> experiments.commands.demo"
    cycle_from_training = "import cycle training -> experiments.lab -> experiments.commands.demo -> training"
    cycle_from_lab = "import cycle experiments.lab -> experiments.commands.demo -> training -> experiments.lab"
    assert sorted(package_layers.violations(root)) == sorted(
        [
            "jgpt/model/core.py:2: jgpt.model.core imports inference.engine: "
            "jgpt.model may import only jgpt.foundation, jgpt.runtime",
            "jgpt/foundation/errors.py:1: jgpt.foundation.errors imports numpy: jgpt.foundation imports no numpy",
            "jgpt/tokenizers/words.py:1: jgpt.tokenizers.words imports jgpt.model.deep: "
            "jgpt.tokenizers may import only jgpt.foundation",
            "jgpt/tokenizers/words.py:1: jgpt.tokenizers.words imports jgpt.model.deep: jgpt.tokenizers imports only "
            "modules free of jax, jaxlib, flax, optax, orbax, chex, torch, transformers; this one reaches jax.numpy "
            "(through jgpt.model.deep)",
            f"inference/engine.py:2: inference.engine imports jgpt.cli.tokenize: {face}",
            "inference/engine.py:2: inference.engine imports jgpt.cli.tokenize: inference may import only "
            + ", ".join(package_layers.MAY_IMPORT["inference"]),
            f"inference/engine.py:3: inference.engine imports kvsim.sim: {kvsim_api}",
            "kvsim/sim.py:2: kvsim.sim imports jgpt.tokenizers.words: kvsim imports only modules free of jax, "
            "jaxlib, flax, optax, orbax, chex, torch, transformers; this one reaches jax.numpy (through jgpt.model.deep)",
            f"experiments/lab.py:2: experiments.lab imports kvsim.sim: {kvsim_api}",
            "experiments/lab.py:2: experiments.lab imports kvsim.sim._helper: "
            "a name with a leading underscore is private to its module",
            f"experiments/lab.py:3: experiments.lab imports experiments.commands.demo: {face}",
            "training/__init__.py:1: training imports experiments.lab: training may import only "
            + ", ".join(package_layers.MAY_IMPORT["training"]),
            f"experiments/commands/demo.py:1: experiments.commands.demo imports training: {cycle}",
            f"training/__init__.py:1: training imports experiments.lab: {cycle_from_training}",
            f"experiments/lab.py:3: experiments.lab imports experiments.commands.demo: {cycle_from_lab}",
        ]
    )


def test_a_private_name_read_through_a_module_is_refused(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kvsim/__init__.py": "",
            "kvsim/a.py": "def _inner():\n    pass\n",
            "kvsim/b.py": "from kvsim import a\n\na._inner()\n",
        },
    )
    assert package_layers.violations(root) == [
        "kvsim/b.py:3: kvsim.b imports kvsim.a._inner: a name with a leading underscore is private to its module"
    ]


def test_every_import_on_a_cycle_is_refused_with_the_shortest_cycle_through_it(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kvsim/__init__.py": "from kvsim.a import run\nfrom kvsim.e import version\n",
            "kvsim/a.py": "from kvsim import b\n\n\ndef run():\n    from kvsim.c import step\n",  # lazy, still an edge
            "kvsim/b.py": "import kvsim.c\n",
            "kvsim/c.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import kvsim.a\n",
            "kvsim/d.py": "from kvsim import a\n",  # imports into the circle, on no cycle itself
            "kvsim/e.py": "from kvsim import run\n\nversion = 1\n",  # a name of the package: its __init__
        },
    )
    assert sorted(package_layers.violations(root)) == sorted(
        [
            "kvsim/__init__.py:2: kvsim imports kvsim.e: import cycle kvsim -> kvsim.e -> kvsim",
            "kvsim/e.py:1: kvsim.e imports kvsim: import cycle kvsim.e -> kvsim -> kvsim.e",
            "kvsim/a.py:1: kvsim.a imports kvsim.b: import cycle kvsim.a -> kvsim.b -> kvsim.c -> kvsim.a",
            "kvsim/a.py:5: kvsim.a imports kvsim.c: import cycle kvsim.a -> kvsim.c -> kvsim.a",
            "kvsim/b.py:1: kvsim.b imports kvsim.c: import cycle kvsim.b -> kvsim.c -> kvsim.a -> kvsim.b",
            "kvsim/c.py:4: kvsim.c imports kvsim.a: import cycle kvsim.c -> kvsim.a -> kvsim.c",
        ]
    )


def test_the_committed_page_is_what_the_generator_writes():
    page = package_layers.DOC.read_text(encoding="utf-8")
    assert package_layers.generated() == page, "run: python tools/package_layers.py"


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
