"""kvsim: the KV residency and service model as a deterministic, causal, replayable simulator.

It reads recorded computation counts only (never jax or model code). The library
API the labs use:

    run = simulate(system, computations, workload=None, interaction=None,
                   resource_graph=None, ontology_binding=None)   -> CacheRun
    record_json(run) -> bytes          # deterministic; replay compares bytes
    record_chunks(run)                 # the same bytes in pieces, for records too large to hold
    run.outcomes["totals"]             # the summary numbers; run_id(run) names the run
"""

from kvsim.cache_run import CacheRun, read_record, record_chunks, record_json, record_value, rerun, run_id, simulate
from kvsim.recorded import RecordedComputations, parse_document
from kvsim.resource_graph import ResourceGraph, parse_resource_graph
from kvsim.summary import summary_table
from kvsim.system import KVResidencySystemConfig, parse_system
from kvsim.workload import CustomerInteraction, Workload, parse_interaction, parse_workload

__all__ = [
    "CacheRun",
    "CustomerInteraction",
    "KVResidencySystemConfig",
    "RecordedComputations",
    "ResourceGraph",
    "Workload",
    "parse_document",
    "parse_interaction",
    "parse_resource_graph",
    "parse_system",
    "parse_workload",
    "read_record",
    "record_chunks",
    "record_json",
    "record_value",
    "rerun",
    "run_id",
    "simulate",
    "summary_table",
]
