"""KVExperimentInput: the file `jgpt kvsim run INPUT.json` reads.

    {
      "system": KVResidencySystemConfig,
      "computations": "path/to/recorded.json" | {inline recorded computation document},
      "workload": Workload,                         (optional; default: the document's arrivals)
      "customer_interaction": CustomerInteraction,  (optional)
      "resource_graph": ResourceGraph,              (optional; validated and recorded)
      "ontology_binding": OntologyBinding           (optional; default: KVCache)
    }

A computations path is read relative to the input file and must stay inside its directory (like every
path read from a file, docs/security.md). Unknown fields are errors.
"""

from __future__ import annotations

from pathlib import Path

from jgpt.foundation.identity import read_bytes
from jgpt.foundation.ontology import ONTOLOGY_BINDING
from jgpt.foundation.output_paths import output_file
from jgpt.foundation.paths import confined
from jgpt.foundation.validation import Either, Object, String
from kvsim.cache_run import load_json
from kvsim.recorded import DOCUMENT, parse_document
from kvsim.resource_graph import RESOURCE_GRAPH, parse_resource_graph
from kvsim.system import SYSTEM, parse_system
from kvsim.workload import INTERACTION, WORKLOAD, parse_interaction, parse_workload

# Each field is read by its own parser below; INPUT names them for the key check and the schema.
INPUT = Object(
    {"system": SYSTEM, "computations": Either((String(non_empty=True), DOCUMENT))},
    {"workload": WORKLOAD, "customer_interaction": INTERACTION, "resource_graph": RESOURCE_GRAPH,
     "ontology_binding": ONTOLOGY_BINDING},
    about="KVExperimentInput: the file `jgpt kvsim run INPUT.json` reads (docs/kvsim.md).",
)  # fmt: skip


def load_input(path: Path, out: Path | None = None) -> dict:
    """The keyword arguments of `simulate`, validated from an input file; `out`, where the record
    will be written, must not be the computations file the input names."""
    top = INPUT.keys(load_json(read_bytes(path, "INPUT"), "INPUT"), "input")
    document = top["computations"]
    if isinstance(document, str):
        source = confined(path.parent, document, "computations")
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
