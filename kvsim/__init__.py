"""kvsim: the KV residency and service model as a deterministic, causal, replayable simulator.

It reads recorded computation counts only (never jax or model code). The library
API the labs use:

    run = simulate(system, computations, workload=None, interaction=None,
                   resource_graph=None, ontology_binding=None)   -> CacheRun
    record_json(run) -> bytes          # deterministic; replay compares bytes
    record_chunks(run)                 # the same bytes in pieces, for records too large to hold
    run.outcomes["totals"]             # the summary numbers; run_id(run) names the run

the serving policy the InferenceEngine decides with, the same KVResidency kvsim's engine drives
(kvsim/kv_residency.py: a state machine that answers what happened with decisions as data):

    policy = KVResidency(system, kv_bytes_per_position)
    for kind, request, subject in policy.arrive(request): ...    # likewise .cancel .step_ended .work_ended
                                                                 # .transfer_ended: each returns its Decisions
    ScheduledRequest, RetainedState, Transfer, Decision, KVCache (the policy's byte accounts)

and, for the labs that compare kvsim with the InferenceEngine (these import numpy, so they load on
first use and `import kvsim` stays light):

    read_measured_run(document, sha256, field) -> MeasuredRun
    fit(runs) -> (service fragment, ...);  merge_service(system_json, fragment) -> system_json
    fitted_terms(fragment) -> the optional terms a recorded fragment holds (refit a replay with them)
    compare(measured_totals, predicted_totals) -> rows

The labs import these names from `kvsim`, never its submodules (docs/architecture.md).
"""

import importlib
from typing import TYPE_CHECKING

from kvsim.cache_run import CacheRun, read_record, record_chunks, record_json, record_value, rerun, run_id, simulate
from kvsim.kv_cache import DEVICE, HOST, KVCache, RetainedState
from kvsim.kv_residency import (
    DEVICE_TO_HOST,
    HOST_TO_DEVICE,
    Decision,
    Decisions,
    KVResidency,
    ScheduledRequest,
    Transfer,
)
from kvsim.outcomes import TOTALS, totals
from kvsim.record_view import OUTCOME
from kvsim.recorded import DOCUMENT, MODEL_REFERENCE, RecordedComputations, parse_document
from kvsim.resource_graph import ResourceGraph, parse_resource_graph
from kvsim.summary import summary_table
from kvsim.system import CONTINUOUS_BATCHING, SYSTEM, KVCacheConfig, KVResidencySystemConfig, parse_system, system_json
from kvsim.workload import (
    INTERACTION,
    SERVED_INTERACTION,
    WALL_CLOCK_LIMIT_US,
    WORKLOAD,
    CustomerInteraction,
    RequestArrival,
    Workload,
    check_wall_clock,
    interaction_json,
    parse_interaction,
    parse_workload,
)

if TYPE_CHECKING:
    from kvsim.calibration import fit, fitted_terms, merge_service
    from kvsim.fidelity import compare
    from kvsim.measured_run import WORK_KINDS, MeasuredRun, read_measured_run

_ON_FIRST_USE = {
    "MeasuredRun": "kvsim.measured_run",
    "WORK_KINDS": "kvsim.measured_run",
    "fit": "kvsim.calibration",
    "fitted_terms": "kvsim.calibration",
    "merge_service": "kvsim.calibration",
    "read_measured_run": "kvsim.measured_run",
    "compare": "kvsim.fidelity",
}


def __getattr__(name: str) -> object:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module 'kvsim' has no attribute {name!r}")
    return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)


__all__ = [
    "CONTINUOUS_BATCHING",
    "DEVICE",
    "DEVICE_TO_HOST",
    "DOCUMENT",
    "HOST",
    "HOST_TO_DEVICE",
    "INTERACTION",
    "SERVED_INTERACTION",
    "WALL_CLOCK_LIMIT_US",
    "MODEL_REFERENCE",
    "OUTCOME",
    "SYSTEM",
    "TOTALS",
    "WORKLOAD",
    "WORK_KINDS",
    "CacheRun",
    "CustomerInteraction",
    "Decision",
    "Decisions",
    "KVCache",
    "KVCacheConfig",
    "KVResidency",
    "KVResidencySystemConfig",
    "MeasuredRun",
    "RecordedComputations",
    "RequestArrival",
    "ResourceGraph",
    "RetainedState",
    "ScheduledRequest",
    "Transfer",
    "Workload",
    "compare",
    "fit",
    "fitted_terms",
    "interaction_json",
    "merge_service",
    "parse_document",
    "check_wall_clock",
    "parse_interaction",
    "parse_resource_graph",
    "parse_system",
    "parse_workload",
    "read_measured_run",
    "read_record",
    "record_chunks",
    "record_json",
    "record_value",
    "rerun",
    "run_id",
    "simulate",
    "summary_table",
    "system_json",
    "totals",
]
