"""Serve a lab's workload on the real InferenceEngine: engine arms and the calibration runs.

The engine serves fixed prompts, but a conversation's later prompts hold the
model's own earlier replies. They are taken from the lab's recorded computations
of the same workload under the same model and GenerationPolicy (greedy, so the
engine selects the same replies): each request is served with the prompt a chat
client would send, at its declared arrival.

Each served run is a measured-run document (`inference/measured_run.py`,
docs/measured-run.md): wall-clock latencies with kvsim's field names. The engine
compiles every program it can need before its clock starts. This module imports
jax; the arm modules import it only when an arm is served, decoded or calibrated.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from experiments.lab_recording import resolve_model_id
from experiments.lab_workload import LabWorkload
from inference.engine import InferenceEngine
from inference.execution import ModelExecution
from inference.measured_run import measured_run
from inference.policy import GenerationPolicy, InferenceRequest
from inference.slot_execution import EnginePlan
from jgpt.artifacts.catalog import load_model
from jgpt.foundation.errors import ApiError
from jgpt.kernels.plan import Kernels
from jgpt.model.architecture import architecture_from_json
from kvsim import parse_system


@functools.cache
def model_execution(model_id: str, kernels: Kernels) -> tuple[ModelExecution, Any]:
    """The ModelExecution and Tokenizer of a catalog id or artifact under the kernel plan `kernels` (loaded once
    per process and plan)."""
    try:
        artifact = load_model(resolve_model_id(model_id))
    except ApiError as error:
        raise ApiError("model.model_id", f"{model_id!r}: {error}") from None
    tokenizer = artifact.tokenizer()
    return ModelExecution.from_artifact(artifact, tokenizer, kernels=kernels), tokenizer


def served_requests(workload: LabWorkload, computations: dict, generation: dict) -> tuple[InferenceRequest, ...]:
    """The workload's requests with the prompts its recorded computations hold, at their declared arrivals."""
    prompts = {r["request_id"]: tuple(r["prompt_ids"]) for r in computations["requests"]}
    policy = GenerationPolicy.from_json(generation, "generation")
    return tuple(
        InferenceRequest(r.request_id, prompts[r.request_id], policy, r.arrival_us, r.text) for r in workload.requests
    )


def serve(
    model_id: str,
    kernels: Kernels,
    system_json: dict,
    workload: LabWorkload,
    computations: dict,
    generation: dict,
    label: str,
) -> dict:
    """The measured-run document of the engine serving `workload` under `system_json` and the kernel plan `kernels`."""
    execution, tokenizer = model_execution(model_id, kernels)
    system = parse_system(system_json, "system")
    requests = served_requests(workload, computations, generation)
    print(
        f"engine: {label}: compiling, then serving {len(requests)} requests on the wall clock",
        file=sys.stderr,
        flush=True,
    )
    served = InferenceEngine(execution, system).serve(requests, workload.interaction)
    document = measured_run(
        execution, system, served, kind=workload.kind, interaction=workload.interaction, tokenizer=tokenizer
    )
    totals = document["totals"]
    print(
        f"engine: {label}: {totals['completed']} completed in {totals['end_us'] / 1e6:.2f} s "
        f"({served.compile_wall_us / 1e6:.1f} s compiling before the clock)",
        file=sys.stderr,
        flush=True,
    )
    return document


def engine_shapes(computations: dict, system_json: dict, generation: dict) -> dict[str, Any]:
    """The shapes the engine compiles for this workload and system (slot capacity, prefill windows, decode
    batches): a calibrated kvsim arm charges the works the engine would execute, not fitted sizes.

    The shapes depend only on the model's context, so no weights are loaded.
    """
    architecture = architecture_from_json(computations["model"]["architecture"])
    policy = GenerationPolicy.from_json(generation, "generation")
    requests = [InferenceRequest(r["request_id"], tuple(r["prompt_ids"]), policy) for r in computations["requests"]]
    plan = EnginePlan.of(architecture.context, parse_system(system_json, "system"), requests)
    return {
        "slot_capacity": plan.slot_capacity,
        "prefill_window_buckets": list(plan.prefill_window_buckets),
        "decode_batch_buckets": list(plan.decode_batch_buckets),
    }
