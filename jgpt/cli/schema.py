"""`jgpt schema`: print the JSON Schema (draft 2020-12) of a document jgpt reads or writes.

Each schema is generated from the description its reader uses (`jgpt.foundation.validation`), so what
the schema says and what jgpt accepts cannot drift apart. A face, like every command: it
imports the package that owns each document, and only the one asked for.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

from jgpt.foundation.validation import json_schema

# name -> (module, description in it, title)
SCHEMAS: dict[str, tuple[str, str, str]] = {
    "recorded-computations": ("kvsim.recorded", "DOCUMENT", "recorded computation document (jgpt record --out)"),
    "workload": (
        "inference.recorded_computations",
        "WORKLOAD",
        "Workload of InferenceRequests (jgpt record, jgpt serve)",
    ),
    "kvsim-input": ("kvsim.inputs", "INPUT", "KVExperimentInput (jgpt kvsim run INPUT.json)"),
    "kvsim-system": ("kvsim.system", "SYSTEM", "KVResidencySystemConfig (kvsim input, jgpt serve --system)"),
    "kvsim-record": ("kvsim.cache_run", "RECORD", "CacheRun record (jgpt kvsim run --out)"),
    "measured-run": ("inference.measured_run", "MEASURED_RUN", "measured-run document (jgpt serve --out)"),
    "lab": ("experiments.experiment_design", "LAB", "lab: ExperimentDesign (experiments/labs/*.json)"),
}

EXAMPLES = """\
examples:
  jgpt schema                                   list the schemas
  jgpt schema lab > lab.schema.json             write one
  python -m jsonschema -i experiments/labs/device-budget-sweep.json lab.schema.json
"""


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema called `name` (one of SCHEMAS)."""
    module, attribute, title = SCHEMAS[name]
    return json_schema(getattr(importlib.import_module(module), attribute), name, title)


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print the JSON Schema (draft 2020-12) of a document, generated from the definitions its reader uses.",
    )  # fmt: skip
    p.add_argument("name", nargs="?", choices=tuple(SCHEMAS), metavar="NAME",
                   help=f"the document: {', '.join(SCHEMAS)} (default: list them)")  # fmt: skip
    return p


def main(command: str, argv: list[str]) -> int:
    args = parser(f"jgpt {command}").parse_args(argv)
    if args.name is None:
        width = max(map(len, SCHEMAS))
        print("\n".join(f"{name:<{width}}  {title}" for name, (_, _, title) in SCHEMAS.items()))
    else:
        print(json.dumps(schema(args.name), indent=1))
    return 0
