"""KVExperimentInput: the file `jgpt kvsim run INPUT.json` reads, or the parts `kvsim run --system S.json
--computations C.json [--workload W.json]` composes into the same input.

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

The composed parts are the files users already have: the system `jgpt serve --system` reads, the recorded
computation document `jgpt record`, `kvsim synthesize` and `kvsim import-trace` write, and a workload, either
kvsim's arrivals or the Workload document `jgpt record` and `jgpt serve` read (its arrivals and customer
interaction; each request's ids are the computations recorded from it). A part that holds another kind of
file is refused, naming the file and what it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes
from jgpt.foundation.ontology import ONTOLOGY_BINDING
from jgpt.foundation.output_paths import output_file
from jgpt.foundation.paths import confined
from jgpt.foundation.validation import Either, Integer, ListOf, Object, String
from kvsim.cache_run import load_json
from kvsim.measured_run import FORMAT as MEASURED_FORMAT
from kvsim.record_lines import is_streamed
from kvsim.recorded import DOCUMENT, FORMAT, parse_document
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
    return _parsed(top | {"computations": document})


def compose_input(system: Path, computations: Path, workload: Path | None) -> dict:
    """The keyword arguments of `simulate` from its parts' files: what `load_input` gives for an input that
    holds the same system, document and workload."""
    top = {"system": _part(system, "--system", "system"), "computations": _part(computations, "--computations", DOC)}
    if workload is not None:
        arrivals = WORKLOAD_FILE.read(_part(workload, "--workload", "workload"), "workload")
        top["workload"] = {"kind": arrivals["kind"], "requests": [
            {"request_id": a["request_id"], "arrival_us": a["arrival_us"]} for a in arrivals["requests"]]}  # fmt: skip
        if "customer_interaction" in arrivals:
            top["customer_interaction"] = arrivals["customer_interaction"]
    return _parsed(INPUT.keys(top, "input"))


def holds(value: Any) -> str | None:
    """Which kind of jgpt file a JSON value is (a KIND key), or None when it looks like none of them."""
    if not isinstance(value, dict):
        return None
    if "format" in value:
        return {FORMAT: DOC, MEASURED_FORMAT: "measured"}.get(value["format"], "other")
    for kind, keys in SIGNS:
        if keys <= value.keys():
            return kind
    return None


# What each kind of file is, for errors that say what a part holds.
KINDS = {
    "system": "a system (KVResidencySystemConfig, what `jgpt serve --system` reads)",
    "computations": "a recorded computation document (`jgpt record`, `kvsim synthesize`, `kvsim import-trace`)",
    "workload": "a workload (kvsim's arrivals, or the Workload document `jgpt record` and `jgpt serve` read)",
    "input": "a kvsim input (`kvsim run INPUT.json` alone takes it)",
    "record": "a kvsim record (`kvsim run --out`)",
    "fragment": "a calibrated service fragment (`kvsim calibrate`): put its fields in a system",
    "measured": "a measured-run document (`jgpt serve --out`)",
    "other": "a document of another format",
}
DOC = "computations"
# Keys that only a file of that kind holds at its top, in the order they are tried.
SIGNS = (
    ("input", {"system", "computations"}),
    ("record", {"declaration", "events"}),
    ("system", {"max_requests"}),
    ("fragment", {"compute_service"}),
    ("workload", {"kind", "requests"}),
)
# A workload part: kvsim's Workload, or the Workload document of `jgpt record` and `jgpt serve` (each request's
# `request` body is what the computations were recorded from, so it is not read again here).
WORKLOAD_FILE = Object(
    {"kind": String(), "requests": ListOf(Object({"request_id": String(), "arrival_us": Integer()},
                                                 {"request": Object({}, open=True)}))},
    {"customer_interaction": INTERACTION},
    about="a workload: kvsim's arrivals, or the Workload document of `jgpt record` and `jgpt serve`",
)  # fmt: skip


def _part(path: Path, option: str, kind: str) -> Any:
    """A part's JSON, refused when it holds another kind of file."""
    if is_streamed(path, option):
        raise ApiError(option, f"{path} holds {KINDS['record']}, streamed, not {KINDS[kind]}")
    value = load_json(read_bytes(path, option), f"{option} ({path})")
    found = holds(value)
    if found is not None and found != kind:
        raise ApiError(option, f"{path} holds {KINDS[found]}, not {KINDS[kind]}")
    return value


def _parsed(top: dict) -> dict:
    return {
        "system": parse_system(top["system"]),
        "computations": parse_document(top["computations"]),
        "workload": parse_workload(top["workload"]) if "workload" in top else None,
        "interaction": parse_interaction(top["customer_interaction"]) if "customer_interaction" in top else None,
        "resource_graph": parse_resource_graph(top["resource_graph"]) if "resource_graph" in top else None,
        "ontology_binding": top.get("ontology_binding"),
    }
