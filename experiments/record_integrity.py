"""What a lab record's files must agree on, beyond their hashes: one model, one sequence per request.

`check_recording` ties a recording's model binding and kernel plan to its recorded computations and the
inspected observations to the sequences those computations hold, in the shape the report
reads. `check_measured_run` checks an engine run's document (kvsim's reading of it) and
derives its totals again from its requests and works. `model_bindings` compares the bound
models with this machine's catalog or artifact manifests. All read values only (no jax,
no weights), so `lab replay` stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import is_integer, is_number
from kvsim import read_measured_run, totals

# The measured totals a measured run's per-request outcomes and works determine. The rest
# (saved_matmul_flops needs the model's cost function; drops are not works) are taken as written.
DERIVED_TOTALS = (
    "arrived", "admitted", "completed", "stopped", "cancelled", "rejected", "lookups", "hits_device", "hits_host",
    "hit_rate_device", "hit_rate_host", "token_hit_rate", "reused_positions", "prompt_positions",
    "bytes_device_to_host", "bytes_host_to_device", "offloads", "reloads", "compute_busy_us", "end_us",
    "compute_busy_fraction", "latency_us",
)  # fmt: skip


def check_recording(entry: Mapping[str, Any], document: Any, observations: Any, field: str) -> None:
    """The recording's model binding and kernel plan are its computations' model and `execution.kernels`, and its
    observations are of their sequences."""
    model = entry.get("model")
    if (
        not isinstance(model, dict)
        or not isinstance(document, dict)
        or {k: v for k, v in model.items() if k != "model_id"} != document.get("model")
    ):
        raise ApiError(f"{field}.model", "is not the model its recorded computations name")
    execution = document.get("execution")
    if (
        not isinstance(execution, dict)
        or not isinstance(entry.get("kernels"), dict)
        or entry["kernels"] != execution.get("kernels")
    ):
        raise ApiError(f"{field}.kernels", "is not the kernel plan its recorded computations ran with")
    checkpoint = model.get("checkpoint_sha256")
    if (
        not isinstance(observations, dict)
        or not isinstance(checkpoint, str)
        or observations.get("run_id") != checkpoint[:12]
    ):
        raise ApiError(f"{field}.observations", "were not observed on the model of its recorded computations")
    recorded = {
        r["request_id"]: r
        for r in document.get("requests") or []
        if isinstance(r, dict) and isinstance(r.get("request_id"), str)
    }
    inspected = observations.get("requests")
    if not isinstance(inspected, list) or not inspected:
        raise ApiError(f"{field}.observations", "must inspect at least one request")
    for k, request in enumerate(inspected):
        where = f"{field}.observations.requests[{k}]"
        request_id = request.get("request_id") if isinstance(request, dict) else None
        computed = recorded.get(request_id) if isinstance(request_id, str) else None
        if computed is None:
            raise ApiError(where, "is not a request of the recorded computations")
        prompt, output = computed.get("prompt_ids"), computed.get("output_ids")
        if not isinstance(prompt, list) or not isinstance(output, list):
            raise ApiError(
                f"{field}.computations", f"request {computed['request_id']!r} lacks its prompt_ids or output_ids"
            )
        sequence = prompt + output
        tokens, predictions = request.get("tokens"), request.get("predictions")
        if (
            not isinstance(tokens, list)
            or [t.get("id") if isinstance(t, dict) else None for t in tokens] != sequence
            or request.get("prompt_length") != len(prompt)
        ):
            raise ApiError(f"{where}.tokens", "are not the sequence the recorded computations hold")
        if (
            not isinstance(predictions, list)
            or [p.get("next_id") if isinstance(p, dict) else None for p in predictions] != sequence[1:]
        ):
            raise ApiError(f"{where}.predictions", "do not predict the recorded sequence position by position")
        _check_inspected(request, where)


def _check_inspected(request: Mapping[str, Any], where: str) -> None:
    """The types the report's panels read, so a crafted observations file is refused, not half drawn."""
    n = len(request["tokens"])
    shaped = {
        "tokens": all(isinstance(t.get("piece"), str) and isinstance(t.get("kind"), str) for t in request["tokens"]),
        "spans": isinstance(request.get("spans"), list)
        and all(
            isinstance(s, dict)
            and is_integer(s.get("token_start"))
            and is_integer(s.get("token_end"))
            and 0 <= s["token_start"] <= s["token_end"] <= n
            and (s.get("turn") is None or is_integer(s["turn"]))
            for s in request["spans"]
        ),
        "predictions": all(
            p.get("position") == k
            and is_number(p.get("next_probability"))
            and isinstance(p.get("candidates"), list)
            and all(
                isinstance(c, dict)
                and is_integer(c.get("id"))
                and isinstance(c.get("piece"), str)
                and is_number(c.get("probability"))
                for c in p["candidates"]
            )
            for k, p in enumerate(request["predictions"])
        ),
        "attention": isinstance(request.get("attention"), list)
        and bool(request["attention"])
        and all(
            isinstance(o, dict)
            and isinstance(o.get("id"), str)
            and is_integer(o.get("layer"))
            and isinstance(o.get("shape"), list)
            and len(o["shape"]) >= 2
            and all(map(is_integer, o["shape"]))
            and o["shape"][0] == n - 1
            and _causal(o.get("values"), n - 1, o["shape"][1])
            for o in request["attention"]
        ),
        "observation_ids": isinstance(request.get("observation_ids"), list)
        and all(isinstance(i, str) for i in request["observation_ids"])
        and isinstance(request.get("attention"), list)
        and all(o.get("id") in request["observation_ids"] for o in request["attention"] if isinstance(o, dict)),
    }
    wrong = next((name for name, ok in shaped.items() if not ok), None)
    if wrong is not None:
        raise ApiError(f"{where}.{wrong}", "do not have the shape and types the report reads")


def _causal(values: Any, positions: int, heads: int) -> bool:
    """[position][head][slot <= position] numbers, as recording writes attention weights."""
    return (
        isinstance(values, list)
        and len(values) == positions
        and all(
            isinstance(row, list)
            and len(row) == heads
            and all(isinstance(slots, list) and len(slots) == q + 1 and all(map(is_number, slots)) for slots in row)
            for q, row in enumerate(values)
        )
    )


def check_measured_run(document: Any, field: str) -> None:
    """kvsim reads the document (format, works, requests, totals' types), and its totals are its outcomes'."""
    read_measured_run(document, "", field)
    if not isinstance(document.get("computations"), dict) or not isinstance(document.get("model"), dict):
        raise ApiError(field, "lacks the served computations or the model it names")
    try:
        derived = _measured_totals(document)
    except (KeyError, TypeError, ValueError):
        raise ApiError(f"{field}.requests", "lack the outcome fields the totals derive from") from None
    for name in DERIVED_TOTALS:
        if document["totals"].get(name) != derived[name]:
            raise ApiError(f"{field}.totals.{name}", "is not what the run's requests and works give")


def _measured_totals(document: Mapping[str, Any]) -> dict[str, Any]:
    """The totals `inference.measured_run` writes, from the document's own outcomes and works (kvsim's one
    definition); what they cannot give is taken as written."""
    works, written = document["works"], document["totals"]
    busy = sum(w["wall_us"] for w in works if w["kind"] in ("prefill", "decode"))
    outcomes = list(document["requests"].values())
    end = max([*(o["end_us"] for o in outcomes), *(w["end_us"] for w in works)])
    moved = {
        direction: sum(w["bytes"] for w in works if w["kind"] == kind)
        for direction, kind in (("device_to_host", "offload"), ("host_to_device", "reload"))
    }
    counts = {kind: sum(w["kind"] == kind for w in works) for kind in ("offload", "reload")} | {
        "drop": written["drops"]
    }
    return totals(
        outcomes, saved_matmul_flops=written["saved_matmul_flops"], moved=moved, counts=counts, busy_us=busy, end_us=end
    )


def model_bindings(record: Mapping[str, Any]) -> list[str]:
    """Compare each model the record binds with this machine's catalog entry or artifact manifest.

    Cheap (no weights are read; an artifact's manifest seal is checked). A model that is
    not here is reported as unchecked, not refused. ApiError when a model is here and differs.
    """
    from jgpt.artifacts.catalog import declared_identity

    lines = []
    for n, model in enumerate(record["bindings"]["models"]):
        declared = declared_identity(model["model_id"])
        if declared is None:
            lines.append(f"{model['model_id']}: not on this machine; its identity is not checked")
            continue
        source, identities = declared
        for name, value in identities.items():
            if model.get(name) != value:
                raise ApiError(
                    f"record.bindings.models[{n}].{name}", f"{model.get(name)} is not the {value} of {source}"
                )
        lines.append(f"{model['model_id']}: checkpoint_sha256 and tokenizer_sha256 match {source}")
    return lines
