"""Record a lab's workload through the model: recorded computations plus what inspection shows.

This is the only experiments module that runs the model. It loads the artifact
named by `model.model_id`, frames each request with the model's tokenizer, calls
inference's `record` (the library function behind `jgpt record`), and captures,
for the inspected requests, one observed forward pass over the whole sequence:
next-token candidates with probabilities at every position and the attention
weights of every layer and head. The report only ever reads these values.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from experiments.arm_recording import Recording
from experiments.experiment_spec import ExecutionSpec
from experiments.lab_workload import LabRequest, LabWorkload
from inference.evidence import tensor_observations
from inference.execution import ModelExecution, bucket
from inference.policy import GenerationPolicy, InferenceRequest
from inference.recorded_computations import record
from jgpt.artifacts.catalog import load_model, read_catalog
from jgpt.foundation import progress
from jgpt.foundation.errors import ApiError
from jgpt.kernels.plan import Kernels
from jgpt.model.transformer import forward
from jgpt.model.walkthrough import walkthrough
from jgpt.tokenizers.tokenizer import Tokenizer

DEFAULT_MODEL = "default"
TOP_CANDIDATES = 5
INSPECTED_REQUESTS = 2  # the first request and the one with the longest sequence


def record_workload(execution: ExecutionSpec, workload: LabWorkload, kernels: Kernels) -> Recording:
    """The workload recorded by the model `model.model_id` names under the kernel plan `kernels` (which its
    document's `execution.kernels` records, as the execution narrows it to the model), and inspected."""
    model_id = resolve_model_id(execution.value("model.model_id"))
    try:
        with progress.stage(f"loading model {model_id}"):
            artifact = load_model(model_id)
    except ApiError as error:
        raise ApiError("model.model_id", f"{model_id!r}: {error}") from None
    tokenizer = artifact.tokenizer()
    model = ModelExecution.from_artifact(artifact, tokenizer, kernels=kernels)
    generation = {
        name.split(".")[1]: execution.value(name) for name in execution.assignments if name.startswith("generation.")
    }
    policy = GenerationPolicy.from_json(generation, "generation")
    document = _record_in_stages(model, tokenizer, workload, policy)
    return Recording(
        inference={"model.model_id": model_id} | {f"generation.{k}": v for k, v in generation.items()},
        model={"model_id": model_id, **artifact.reference()},
        document=document,
        walkthrough=walkthrough(artifact.architecture).to_json(),
        observations=_observations(model, tokenizer, workload, document),
    )


def _record_in_stages(
    model: ModelExecution, tokenizer: Tokenizer, workload: LabWorkload, policy: GenerationPolicy
) -> dict:
    """Record requests whose prompts are known, then those that continue them, until all are recorded.

    A continuing request's prompt holds the model's reply to the request it
    continues, so it can only be framed once that request has been generated.
    """
    recorded: dict[str, dict] = {}
    first: dict | None = None
    while len(recorded) < len(workload.requests):
        ready = [
            r
            for r in workload.requests
            if r.request_id not in recorded and (r.continues is None or r.continues in recorded)
        ]
        requests = [
            InferenceRequest(r.request_id, _prompt_ids(r, recorded, tokenizer), policy, r.arrival_us, r.text)
            for r in ready
        ]
        document = record(model, requests, kind=workload.kind)
        first = first or document
        recorded |= {entry["request_id"]: entry for entry in document["requests"]}
    assert first is not None, "WORKLOAD reads at least one request"
    return first | {"requests": [recorded[r.request_id] for r in workload.requests]}


def _prompt_ids(request: LabRequest, recorded: dict[str, dict], tokenizer: Tokenizer) -> tuple[int, ...]:
    added = tokenizer.encode_turns(request.turns, open_turn="assistant").ids
    if request.continues is None:
        return added
    previous = recorded[request.continues]
    reply = list(previous["output_ids"])
    if not reply or reply[-1] != tokenizer.turn_end_id:
        reply.append(tokenizer.turn_end_id)  # the client closes a reply cut off by its budget
    return (*previous["prompt_ids"], *reply, *added)


def resolve_model_id(model_id: str) -> str:
    """A catalog id or artifact path as given; DEFAULT_MODEL names the catalog's default model."""
    if model_id != DEFAULT_MODEL:
        return model_id
    try:
        return read_catalog().default_id()
    except ApiError as error:
        raise ApiError("model.model_id", f"'default' names the catalog's default model: {error.reason}") from None


@functools.partial(jax.jit, static_argnames=("architecture",))
def _observed(weights, architecture, token_ids):
    return forward(weights, architecture, token_ids, observe=True).observations


def _observations(model: ModelExecution, tokenizer: Tokenizer, workload: LabWorkload, document: dict) -> dict:
    """Tokens, spans, predictions and attention of the inspected requests."""
    by_id = {r.request_id: r for r in workload.requests}
    recorded = {r["request_id"]: r for r in document["requests"]}
    longest = max(recorded.values(), key=lambda r: len(r["prompt_ids"]) + len(r["output_ids"]))
    chosen = list(dict.fromkeys([document["requests"][0]["request_id"], longest["request_id"]]))[:INSPECTED_REQUESTS]
    run_id = f"{document['model']['checkpoint_sha256'][:12]}"
    inspected = []
    for request_id in progress.tracked(chosen, "inspecting requests", unit="request"):
        entry = recorded[request_id]
        sequence = list(entry["prompt_ids"]) + list(entry["output_ids"])
        spans = _spans(by_id, recorded, tokenizer, request_id)
        inspected.append(_inspect(model, tokenizer, run_id, request_id, spans, entry, sequence))
    return {"run_id": run_id, "requests": inspected}


def _spans(by_id: dict, recorded: dict, tokenizer: Tokenizer, request_id: str) -> list[dict]:
    """Encoding spans of every turn in the request's prompt, and one span per earlier reply it resends."""
    request = by_id[request_id]
    if request.continues is None:
        return [span.to_json() for span in tokenizer.encode_turns(request.turns, open_turn="assistant").spans]
    previous = recorded[request.continues]
    spans = _spans(by_id, recorded, tokenizer, request.continues)
    start = len(previous["prompt_ids"])
    end = len(previous["prompt_ids"]) + len(previous["output_ids"])
    spans.append(
        {
            "kind": "reply",
            "reason": f"the model's reply to {request.continues}",
            "token_start": start,
            "token_end": end,
            "turn": None,
        }
    )
    offset = len(_prompt_ids(request, recorded, tokenizer)) - len(
        tokenizer.encode_turns(request.turns, open_turn="assistant").ids
    )
    for span in tokenizer.encode_turns(request.turns, open_turn="assistant").spans:
        shifted = span.to_json()
        shifted["token_start"] += offset
        shifted["token_end"] += offset
        spans.append(shifted)
    return spans


def _inspect(model, tokenizer, run_id, request_id, spans, entry, sequence) -> dict:
    # One causal pass over every position but the last (position p's logits predict sequence[p + 1]),
    # padded to a bucket so that sequences of similar length share one compiled pass.
    n = len(sequence) - 1
    ids = np.zeros((1, bucket(n, model.architecture.context)), np.int32)
    ids[0, :n] = sequence[:-1]
    observed = _observed(model.weights, model.architecture, jnp.asarray(ids))
    observations = tensor_observations(observed, 0, n, run_id=run_id, request_id=request_id, step=0)
    logits = next(o for o in observations if o.operation == "OutputProjection").values  # [T, V]
    probabilities = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1))
    top = np.argsort(-probabilities, axis=-1, kind="stable")[:, :TOP_CANDIDATES]
    piece = lambda i: tokenizer.token(int(i)).piece  # noqa: E731
    predictions = [
        {
            "position": p,
            "next_id": sequence[p + 1],
            "next_probability": round(float(probabilities[p, sequence[p + 1]]), 6),
            "candidates": [
                {"id": int(i), "piece": piece(i), "probability": round(float(probabilities[p, i]), 6)} for i in top[p]
            ],
        }
        for p in range(len(sequence) - 1)
    ]
    attention = [
        {
            "id": o.id,
            "operation": o.operation,
            "layer": o.layer,
            "axes": list(o.axes),
            "shape": list(o.shape),
            # [position][head][slot <= position]: the causal lower triangle, 4 decimals
            "values": [
                [[round(float(w), 4) for w in o.values[q, h, : q + 1]] for h in range(o.shape[1])]
                for q in range(o.shape[0])
            ],
        }
        for o in observations
        if o.id.endswith("/attention_weights")
    ]
    return {
        "request_id": request_id,
        "prompt_length": len(entry["prompt_ids"]),
        "tokens": [{"id": t, "piece": piece(t), "kind": tokenizer.token(t).kind} for t in sequence],
        "spans": spans,
        "predictions": predictions,
        "attention": attention,
        # what the record keeps of the pass: attention weights here, logits as the predictions above
        "observation_ids": [o.id for o in observations if o.id.endswith(("/attention_weights", "/logits"))],
    }
