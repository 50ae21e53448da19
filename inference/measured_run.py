"""The measured-run document: a Workload the InferenceEngine served, every work timed on the wall clock.

Its `requests` and `totals` carry the same field names as a kvsim record's
outcomes, so a measured run and a simulated one compare field by field, and
its `computations` are a complete recorded-computation document of the served
requests, so kvsim can simulate exactly this workload. Every field is described
in `docs/measured-run.md`.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from typing import Any

import jax

from inference.backend import ExecutionBackend, ExecutionProvenance
from inference.engine import ServedRun
from inference.evidence import GenerationWork
from inference.execution import ModelExecution
from inference.generation import STEP_BOUNDARY, generate_stepwise, work_computations
from inference.recorded_computations import FORMAT as COMPUTATIONS_FORMAT
from inference.recorded_computations import VERSION as COMPUTATIONS_VERSION
from inference.recorded_computations import request_document
from inference.response import InferenceResponse, RunOutcome, TokenSelection
from jgpt.foundation.units import byte_size, percent
from jgpt.foundation.validation import Boolean, Const, Integer, Integers, ListOf, MapOf, Nullable, Object, String
from jgpt.tokenizers.tokenizer import Tokenizer
from kvsim import (
    DOCUMENT,
    INTERACTION,
    MODEL_REFERENCE,
    OUTCOME,
    SYSTEM,
    TOTALS,
    WORK_KINDS,
    WORKLOAD,
    CustomerInteraction,
    KVResidencySystemConfig,
    interaction_json,
    system_json,
    totals,
)

FORMAT = "jgpt-measured-run"
VERSION = 1

# What `measured_run` writes, as `jgpt schema measured-run` publishes it. kvsim.calibration reads the
# part it fits with its own readers (kvsim cannot import this jax-side module).
_TEXT, _COUNT = String(), Integer()
MACHINE = Object(
    {"platform": _TEXT, "machine": _TEXT, "processor": _TEXT, "cpu_count": Nullable(Integer(1)), "jax_version": _TEXT,
     "jax_backend": _TEXT, "device_kind": _TEXT},
    open=True,
)  # fmt: skip
ENGINE = Object(
    {"prefill_window_buckets": Integers(1, min_items=1), "decode_batch_buckets": Integers(1, min_items=1),
     "slot_rows": Integer(1), "slot_capacity": Integer(1), "slot_buffer_bytes": _COUNT,
     "as_fast_as_possible": Boolean(), "compiled_programs": _COUNT, "compile_wall_us": _COUNT,
     "compiles_during_run": _COUNT, "transfers": String(("synchronous",))},
    open=True,
)  # fmt: skip
WORK = Object(
    {"kind": String(WORK_KINDS), "request_ids": ListOf(_TEXT, min_items=1),
     **dict.fromkeys(("rows", "executed_rows", "window", "matmul_flops", "logical_memory_bytes", "bytes", "start_us",
                      "end_us", "wall_us"), _COUNT)},
    open=True,
)  # fmt: skip
MEASURED_RUN = Object(
    {"format": Const(FORMAT), "version": Const(VERSION), "model": MODEL_REFERENCE, "kv_bytes_per_position": Integer(1),
     "execution": DOCUMENT.required["execution"], "machine": MACHINE, "system": SYSTEM, "engine": ENGINE,
     "workload": WORKLOAD, "customer_interaction": Nullable(INTERACTION), "computations": DOCUMENT,
     "works": ListOf(WORK), "requests": MapOf(OUTCOME), "totals": TOTALS},
    open=True,
    about="The measured-run document: a Workload the InferenceEngine served, timed (docs/measured-run.md).",
)  # fmt: skip


def measured_run(
    execution: ModelExecution,
    system: KVResidencySystemConfig,
    served: ServedRun,
    *,
    kind: str,
    interaction: CustomerInteraction | None = None,
    tokenizer: Tokenizer | None = None,
) -> dict[str, Any]:
    """The versioned document of one served run (requests that did not run to their own stop are
    generated alone afterwards, off the clock, so the computations hold every request's whole output)."""
    backend = ExecutionBackend.current(execution.identity.precision)
    identity = execution.identity
    model = {
        "checkpoint_sha256": identity.checkpoint_sha256,
        "tokenizer_sha256": identity.tokenizer_sha256,
        "architecture": execution.architecture.to_json(),
    }
    execution_json = {
        "backend": backend.to_json(),
        "kernels": execution.kernels.to_json(),
        "provenance": ExecutionProvenance.current(backend).to_json(),
    }
    plan = served.plan
    arrivals = [{"request_id": s.request.request_id, "arrival_us": s.outcome["arrival_us"]} for s in served.requests]
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "kv_bytes_per_position": execution.costs.kv_bytes_per_position,
        "execution": execution_json,
        "machine": _machine(),
        "system": system_json(system),
        "engine": {
            "prefill_window_buckets": list(plan.prefill_window_buckets),
            "decode_batch_buckets": list(plan.decode_batch_buckets),
            "slot_rows": plan.slot_rows,
            "slot_capacity": plan.slot_capacity,
            "slot_buffer_bytes": plan.slot_buffer_bytes(execution),
            "as_fast_as_possible": served.as_fast_as_possible,
            "compiled_programs": served.compiled_programs,
            "compile_wall_us": served.compile_wall_us,
            "compiles_during_run": served.compiles_during_run,
            "transfers": "synchronous",
        },
        "workload": {"kind": kind, "requests": arrivals},
        "customer_interaction": None if interaction is None else interaction_json(interaction),
        "computations": {
            "format": COMPUTATIONS_FORMAT,
            "version": COMPUTATIONS_VERSION,
            "model": model,
            "kv_bytes_per_position": execution.costs.kv_bytes_per_position,
            "execution": execution_json,
            "workload": {"kind": kind},
            "requests": [
                _computation(execution, s, a["arrival_us"], tokenizer) for s, a in zip(served.requests, arrivals)
            ],
        },
        "works": list(served.works),
        "requests": {s.request.request_id: dict(s.outcome) for s in served.requests},
        "totals": _totals(execution, served),
    }


def _machine() -> dict[str, Any]:
    device = jax.devices()[0]
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "jax_version": jax.__version__,
        "jax_backend": jax.default_backend(),
        "device_kind": device.device_kind,
    }


def _computation(execution: ModelExecution, served, arrival_us: int, tokenizer: Tokenizer | None) -> dict:
    request = served.request
    if served.stop_reason is not None:
        output, reused, seconds, stop = served.output_ids, served.reused, served.work_seconds, served.stop_reason
        errors = [None] * len(output)
        computations = work_computations(execution, request, output, reused, seconds, errors, STEP_BOUNDARY)
        response = InferenceResponse(
            request_id=request.request_id, prompt_ids=request.prompt_ids, output_ids=output,
            published_ids=tuple(t for t in output if t != execution.turn_end_id),
            outcome=RunOutcome.of(output, request.generation.max_new_tokens, stop, execution.turn_end_id),
            selections=tuple(TokenSelection(t) for t in output), computations=computations,
            work=GenerationWork.total(computations),
        )  # fmt: skip
    else:  # cancelled or rejected: the whole output it would have selected, generated alone
        (response,) = generate_stepwise(execution, [request]).responses
    document = request_document(execution, request, response) | {"arrival_us": arrival_us}
    if tokenizer is not None:
        document["output_token_bytes"] = [len(tokenizer.pieces[t]) for t in response.output_ids]
    return document


def _totals(execution: ModelExecution, served: ServedRun) -> dict:
    costs, outcomes = execution.costs, [s.outcome for s in served.requests]
    saved_flops = sum(
        costs.matmul_flops(0, o["prompt_positions"]) - costs.matmul_flops(o["reuse_positions"], o["prompt_positions"])
        for o in outcomes
        if o["admitted_us"] is not None and o["selected_tokens"] > 0 and o["reuse_positions"] > 0
    )
    return totals(
        outcomes, saved_matmul_flops=saved_flops, moved=served.moved, counts=served.counts,
        busy_us=served.busy_us, end_us=served.end_us,
    )  # fmt: skip


def summary(document: Mapping[str, Any]) -> str:
    """A few human lines: latencies in ms, reuse, bytes moved, throughput and compile time."""
    totals, engine = document["totals"], document["engine"]
    ms = lambda v: "-" if v is None else f"{v / 1000:.2f}"  # noqa: E731
    selected = sum(r["selected_tokens"] for r in document["requests"].values())
    lines = [
        f"served {totals['arrived']} requests: {totals['completed']} completed, {totals['stopped']} stopped, "
        f"{totals['cancelled']} cancelled, {totals['rejected']} rejected in {totals['end_us'] / 1e6:.3f} s "
        f"({selected / max(totals['end_us'], 1) * 1e6:.1f} tokens/s, compute busy {percent(totals['compute_busy_fraction'])})",
    ]
    for name, values in totals["latency_us"].items():
        figures = "  ".join(f"{p} {ms(values[p])}" for p in ("p50", "p90", "p99"))
        lines.append(f"  {name:<9} ms  {figures}  (n={values['count']})")
    lines += [
        f"  reuse: device hits {totals['hits_device']}, host hits {totals['hits_host']} of {totals['lookups']} lookups; "
        f"token hit rate {percent(totals['token_hit_rate'])}",
        f"  moved: {byte_size(totals['bytes_device_to_host'])} to host ({totals['offloads']} offloads), "
        f"{byte_size(totals['bytes_host_to_device'])} to device ({totals['reloads']} reloads), {totals['drops']} drops",
        f"  compiled {engine['compiled_programs']} programs in {engine['compile_wall_us'] / 1e6:.2f} s before the clock "
        f"started; {engine['compiles_during_run']} compiles during the run",
    ]
    return "\n".join(lines)
