"""KVExperimentInput: the file `jgpt kvsim run INPUT.json` reads.

    {
      "system": KVResidencySystemConfig,
      "computations": "path/to/recorded.json" | {inline recorded computation document},
      "workload": Workload,                         (optional; default: the document's arrivals)
      "customer_interaction": CustomerInteraction,  (optional)
      "resource_graph": ResourceGraph,              (optional; validated and recorded)
      "ontology_binding": OntologyBinding           (optional; default: KVCache)
    }

A relative computations path is read relative to the input file. Unknown fields are errors.
"""

from __future__ import annotations

from pathlib import Path

from jgpt.identity import read_bytes
from jgpt.output_paths import output_file
from kvsim import fields
from kvsim.cache_run import load_json
from kvsim.recorded import parse_document
from kvsim.resource_graph import parse_resource_graph
from kvsim.system import parse_system
from kvsim.workload import parse_interaction, parse_workload


def load_input(path: Path, out: Path | None = None) -> dict:
    """The keyword arguments of `simulate`, validated from an input file; `out`, where the record
    will be written, must not be the computations file the input names."""
    top = fields.mapping(
        load_json(read_bytes(path, "INPUT"), "INPUT"),
        "input",
        {"system", "computations"},
        {"workload", "customer_interaction", "resource_graph", "ontology_binding"},
    )
    document = top["computations"]
    if isinstance(document, str):
        source = path.parent / document
        if out is not None:
            output_file(out, "--out", [source])
        document = load_json(read_bytes(source, "computations"), f"computations ({source})")
    return {
        "system": parse_system(top["system"]),
        "computations": parse_document(document),
        "workload": parse_workload(top["workload"]) if "workload" in top else None,
        "interaction": parse_interaction(top["customer_interaction"]) if "customer_interaction" in top else None,
        "resource_graph": parse_resource_graph(top["resource_graph"]) if "resource_graph" in top else None,
        "ontology_binding": top.get("ontology_binding"),
    }
