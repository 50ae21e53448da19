"""A record's summary (`summary.json`): the numbers a reader compares across arms, and measured against predicted.

One row per arm: serving outcomes for kvsim and engine arms, decoding figures for
generate arms (`experiments/decoding_arms.py`). A lab with an arm that kvsim did
not simulate by roofline also says where each row comes from, and pairs every engine
arm with the kvsim arms of the same system, field by field. A lab that declares its
answer (experiments/lab_answer.py) has it computed first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiments.controls import CONTROLS, chosen
from experiments.decoding_arms import greedy_rate, summary_row
from experiments.lab_answer import computed_answer
from kvsim import compare


def summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers a reader compares across arms, one row per arm."""
    rows = []
    for arm in record["arms"]:
        if "decoding_run" in arm:  # a generate arm: decoding figures, no serving latencies
            rows.append(summary_row(arm, greedy_rate(record["arms"])))
            continue
        totals = arm["outcomes"]
        latency = totals["latency_us"]
        rows.append(
            {
                "label": arm["label"],
                "completed": totals["completed"],
                "cancelled": totals["cancelled"],
                "rejected": totals["rejected"],
                "ttft_p50_us": latency["ttft"]["p50"],
                "ttft_p90_us": latency["ttft"]["p90"],
                "e2e_p50_us": latency["e2e"]["p50"],
                "e2e_p90_us": latency["e2e"]["p90"],
                "tpot_p50_us": latency["tpot"]["p50"],
                "queueing_p90_us": latency["queueing"]["p90"],
                "token_hit_rate": totals["token_hit_rate"],
                "saved_matmul_flops": totals["saved_matmul_flops"],
                "offloads": totals["offloads"],
                "reloads": totals["reloads"],
                "bytes_host_to_device": totals["bytes_host_to_device"],
                "compute_busy_us": totals["compute_busy_us"],
                "end_us": totals["end_us"],
            }
        )
    lab = record["lab"]
    models = [{k: m[k] for k in ("model_id", "checkpoint_sha256")} for m in record["bindings"]["models"]]
    table = {"lab": lab["id"], "question": lab["question"], "record": record["id"], "models": models, "arms": rows}
    modes = [_modes(arm) for arm in record["arms"]]
    if not all(mode == ("kvsim", "roofline") for mode, _ in modes):  # a kvsim-only lab's rows say nothing more
        for row, ((runner, service), _) in zip(rows, modes):
            row["source"] = {
                "engine": "measured on the engine",
                "generate": "measured with generate, one request at a time",
            }.get(runner, f"simulated by kvsim ({service})")
        table["fidelity"] = _fidelity(record["arms"], modes)
    answer = computed_answer(record, rows, table.get("fidelity"))
    return table if answer is None else {"answer": answer} | table


def _modes(arm: Mapping[str, Any]) -> tuple[tuple[str, str], dict[str, Any]]:
    """((runner, service), the arm's other controls): arms equal in the latter ran the same system."""
    assignments = {spec["control"]: spec["value"] for spec in arm["execution"]}
    mode = (chosen(assignments, "execution.runner"), chosen(assignments, "compute_service.model"))
    return mode, {k: v for k, v in assignments.items() if CONTROLS[k].default is None}


def _fidelity(arms: list, modes: list) -> list[dict[str, Any]]:
    """Per engine arm and kvsim arm of the same system: measured against predicted, field by field."""
    pairs = []
    for engine, ((runner, _), controls) in zip(arms, modes):
        if runner != "engine":
            continue
        for arm, ((other, service), same) in zip(arms, modes):
            if other == "kvsim" and same == controls:
                rows = [row.to_json() for row in compare(engine["outcomes"], arm["outcomes"])]
                pairs.append({"measured": engine["label"], "predicted": arm["label"], "service": service, "rows": rows})
    return pairs
