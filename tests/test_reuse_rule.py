"""One reuse rule: the recorder, kvsim and the InferenceEngine reuse the same positions for every request.

The rule (docs/kvsim.md, "KV residency"): an ended request retains one state,
every position it computed; an identical sequence is not retained twice; a
prompt continues the longest retained state that is a proper prefix of it, and
a hit takes the state. The workload is multi-turn chat with the shipped chat
model, where every later turn resends the model's own reply, and two
conversations open with the same turn, so that one retained state is reused by
one of them only and a duplicate sequence is skipped.
"""

from __future__ import annotations

import json

import pytest

from inference.engine import InferenceEngine
from inference.execution import ModelExecution
from inference.generation import generate
from inference.measured_run import measured_run
from inference.policy import GenerationPolicy, InferenceRequest
from inference.recorded_computations import record
from jgpt.artifacts.catalog import load_model, read_catalog
from jgpt.tokenizers.framing import Turn
from kvsim import parse_document, parse_system, record_value, simulate
from kvsim.fidelity import compare, replay
from kvsim.measured_run import read_measured_run

BUDGET = 12
# (conversation, user turns); "fig" opens exactly as "kiwi" does.
CONVERSATIONS = (
    ("kiwi", ("store red kiwi", "reverse fish", "get red")),
    ("fig", ("store red kiwi", "sort 3 1 2")),
    ("plum", ("reverse plum", "add 2 3")),
)
SYSTEM = {
    "max_requests": 64,
    "max_new_tokens_cap": BUDGET,
    "scheduling": {"max_active_requests": 1, "policy": "serialized"},
    "kv_cache": {"device_kv_bytes": 1 << 30, "host_kv_bytes": 0},
    "transfer": {"link_bytes_per_us": 1000, "link_latency_us": 1},
    "compute_service": {"compute_flops_per_us": 100000, "memory_bytes_per_us": 100000},
}


def chat_requests(execution: ModelExecution, tokenizer) -> list[InferenceRequest]:
    """Round-robin turns of every conversation, each prompt resending the model's own earlier replies."""
    policy = GenerationPolicy(BUDGET)
    histories = {name: () for name, _ in CONVERSATIONS}
    requests = []
    for turn in range(max(len(turns) for _, turns in CONVERSATIONS)):
        for name, turns in CONVERSATIONS:
            if turn >= len(turns):
                continue
            added = tokenizer.encode_turns((Turn("user", turns[turn]),), open_turn="assistant").ids
            prompt = (*histories[name], *added)
            request = InferenceRequest(f"{name}.{turn}", prompt, policy, 1000 * len(requests))
            (response,) = generate(execution, [request]).responses
            reply = list(response.output_ids)
            if reply[-1] != tokenizer.turn_end_id:
                reply.append(tokenizer.turn_end_id)  # the client closes a reply cut off by the budget
            histories[name] = (*prompt, *reply)
            requests.append(request)
    return requests


@pytest.fixture(scope="module")
def workload():
    artifact = load_model(read_catalog().default_id())
    tokenizer = artifact.tokenizer()
    execution = ModelExecution.from_artifact(artifact, tokenizer)
    requests = chat_requests(execution, tokenizer)
    return execution, requests, record(execution, requests, reference=False)


def test_recorder_and_kvsim_reuse_the_same_positions(workload):
    _, requests, document = workload
    recorded = {r["request_id"]: r["computations"][0]["reused_positions"] for r in document["requests"]}
    run = record_value(simulate(parse_system(SYSTEM), parse_document(document)))
    simulated = {rid: outcome["reuse_positions"] for rid, outcome in run["outcomes"]["requests"].items()}
    assert simulated == recorded
    # The rule, spelled out on this workload: later turns reuse the whole previous turn...
    sequences = {r["request_id"]: r["prompt_ids"] + r["output_ids"][:-1] for r in document["requests"]}
    assert recorded["kiwi.1"] == len(sequences["kiwi.0"]) and recorded["plum.1"] == len(sequences["plum.0"])
    # ...fig.0 repeats kiwi.0's prompt (no whole-prompt hit) and leaves the same sequence (retained once)...
    assert sequences["fig.0"] == sequences["kiwi.0"] and recorded["fig.0"] == 0
    assert [e["kind"] for e in run["events"] if e["request_id"] == "fig.0"].count("retain_skip") == 1
    # ...so the one state both first turns left is taken by kiwi.1, and fig.1 recomputes its prompt.
    assert recorded["fig.1"] == 0 and recorded["kiwi.2"] == len(sequences["kiwi.1"])
    assert all(r.prompt_ids == tuple(d["prompt_ids"]) for r, d in zip(requests, document["requests"], strict=True))


def test_the_engine_reuses_what_the_recorder_and_kvsim_reuse(workload):
    execution, requests, document = workload
    served = InferenceEngine(execution, parse_system(SYSTEM)).serve(requests, as_fast_as_possible=True)
    recorded = {
        r["request_id"]: (r["computations"][0]["reused_positions"], r["output_ids"]) for r in document["requests"]
    }
    assert {s.request.request_id: (s.reused, list(s.output_ids)) for s in served.requests} == recorded
    tiers = {s.request.request_id: s.outcome["reuse_tier"] for s in served.requests}
    assert tiers["fig.0"] is None and tiers["fig.1"] is None and tiers["kiwi.1"] == "device"


def test_kvsim_fed_the_engines_measured_times_reproduces_its_outcomes_exactly(workload):
    """Batching, a device budget for about one and a half requests and a host tier: if kvsim takes the engine's decisions in
    the engine's order, giving each work and transfer the engine's measured time reproduces every outcome."""
    execution, requests, _ = workload
    longest = max(len(r.prompt_ids) + BUDGET - 1 for r in requests) * execution.costs.kv_bytes_per_position
    system = parse_system(SYSTEM | {
        "scheduling": {"max_active_requests": 3, "policy": "continuous_batching"},
        "kv_cache": {"device_kv_bytes": longest * 3 // 2, "host_kv_bytes": 1 << 30},
    })  # fmt: skip
    served = InferenceEngine(execution, system).serve(requests, as_fast_as_possible=True)
    document = json.loads(json.dumps(measured_run(execution, system, served, kind="chat")))
    assert document["totals"]["offloads"] > 0 and document["totals"]["hits_host"] > 0
    assert any(work["rows"] > 1 for work in document["works"])  # a batched decode step
    rows = compare(document["totals"], replay(read_measured_run(document, "0" * 64)))
    assert [(row.field, row.predicted) for row in rows] == [(row.field, row.measured) for row in rows]
