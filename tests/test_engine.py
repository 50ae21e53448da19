"""The InferenceEngine: same ids as `generate`, the KV pool's budget, no compile in the run, kvsim's decisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.commands import _load
from inference.engine import InferenceEngine, read_served_workload
from inference.generation import generate
from inference.measured_run import measured_run
from jgpt.cli import main as cli
from kvsim.cache_run import simulate
from kvsim.recorded import parse_document
from kvsim.system import parse_system
from kvsim.workload import parse_workload

DATA = Path(__file__).parent / "data"
CONVERSATIONS = [
    [{"role": "system", "text": "you are jgpt."}, {"role": "user", "text": "sort nli"}],
    [{"role": "user", "text": "reverse plum"}],
    [{"role": "user", "text": "add 12 and 7"}],
]
ANSWERS = ["iln", "mulp", "19"]


def turns(conversation: int, turn: int) -> list[dict]:
    """Turn 1 continues turn 0 with the answer the shipped model gives, so its prompt reuses turn 0's state."""
    first = CONVERSATIONS[conversation]
    if turn == 0:
        return first
    return [
        *first,
        {"role": "assistant", "text": ANSWERS[conversation]},
        {"role": "user", "text": "count the letters in abc"},
    ]


def workload(gap_us: int, cancel_at_us: int | None = None) -> dict:
    requests = [
        {"request_id": f"c{c}t{t}", "arrival_us": t * gap_us + c,
         "request": {"turns": turns(c, t), "generation": {"max_new_tokens": 8 + 4 * c}}}
        for t in range(2) for c in range(3)
    ]  # fmt: skip
    # First at 0: its prefill runs as it arrives, so a cancel at 1 us meets it at its first step boundary.
    requests.insert(0, {"request_id": "long", "arrival_us": 0, "request": {"text": "sort " + "qwertyuiop" * 3}})
    document = {"kind": "mixed", "requests": requests}
    if cancel_at_us is not None:
        document["customer_interaction"] = {
            "actions": [{"kind": "cancel", "at_us": cancel_at_us, "request_id": "long"}]
        }
    return document


def system(policy: str, max_active: int, device_kv_bytes: int, host_kv_bytes: int, retention: str = "lru") -> dict:
    return {
        "max_requests": 16, "max_new_tokens_cap": 64,
        "scheduling": {"max_active_requests": max_active, "policy": policy},
        "kv_cache": {"device_kv_bytes": device_kv_bytes, "host_kv_bytes": host_kv_bytes, "retention_policy": retention},
        "transfer": {"link_bytes_per_us": 1000, "link_latency_us": 10},
        "compute_service": {"compute_flops_per_us": 2000000, "memory_bytes_per_us": 20000},
    }  # fmt: skip


@pytest.fixture(scope="module")
def model():
    return _load(None)[:2]


def serve(model, workload_document, system_document, **options):
    execution, tokenizer = model
    requests, interaction = read_served_workload(workload_document, tokenizer, execution)
    config = parse_system(system_document)
    audits = []
    served = InferenceEngine(execution, config).serve(requests, interaction, observe=audits.append, **options)
    document = measured_run(execution, config, served, kind=workload_document["kind"], interaction=interaction)
    return requests, served, document, audits


# About two reservations fit at once: retained states must move to the host or be dropped.
TIGHT_DEVICE, TIGHT_HOST = 110 * 4096, 100 * 4096


@pytest.fixture(scope="module", params=["continuous_batching", "serialized"])
def mixed(request, model):
    """Ragged prompts, reuse from device and host, batching, and a cancel, under a tight device budget."""
    document = workload(gap_us=300_000, cancel_at_us=1)
    return request.param, *serve(model, document, system(request.param, 4, TIGHT_DEVICE, TIGHT_HOST))


def test_same_ids_as_generate_alone_on_a_mixed_workload(model, mixed):
    execution, _ = model
    policy, requests, served, document, _ = mixed
    by_id = {s.request.request_id: s for s in served.requests}
    for request in requests:
        (alone,) = generate(execution, [request]).responses
        ids = by_id[request.request_id].output_ids
        if document["requests"][request.request_id]["status"] == "cancelled":
            assert ids == alone.output_ids[: len(ids)] and len(ids) < len(alone.output_ids), request.request_id
        else:
            assert ids == alone.output_ids, (policy, request.request_id)
    totals = document["totals"]
    assert totals["hits_device"] >= 1 and totals["hits_host"] >= 1  # turn 1 reused turn 0's state, one from the host
    cancelled = document["requests"]["long"]
    assert totals["cancelled"] == 1 and cancelled["stop_reason"] == "cancelled at step boundary"
    assert cancelled["selected_tokens"] == 1
    if policy == "continuous_batching":
        assert max(w["rows"] for w in document["works"] if w["kind"] == "decode") >= 2


def test_device_budget_invariant_holds_at_every_happening(mixed):
    _, _, served, document, audits = mixed
    assert len(audits) >= 2 * len(served.requests)  # the engine audited the pool after every happening
    assert max(device for device, _ in audits) <= TIGHT_DEVICE
    assert max(host for _, host in audits) <= TIGHT_HOST
    assert max(device for device, _ in audits) > TIGHT_DEVICE // 2  # the budget was pressed, not idle
    totals = document["totals"]
    assert totals["offloads"] + totals["drops"] >= 1
    assert totals["bytes_device_to_host"] == sum(w["bytes"] for w in document["works"] if w["kind"] == "offload")


def test_no_compile_during_the_run(mixed):
    _, _, served, document, _ = mixed
    assert served.compiles_during_run == 0
    assert (
        document["engine"]["compiled_programs"]
        == len(served.plan.prefill_window_buckets) + len(served.plan.decode_batch_buckets) + 3
    )  # the row insert, extract and move


@pytest.mark.parametrize(
    "policy, max_active, device_positions, host_kv_bytes, tiers",
    [
        ("serialized", 1, 80, TIGHT_HOST, ("hits_device", "hits_host", "drops", "rejected")),
        ("continuous_batching", 4, 90, 0, ("hits_device", "drops", "rejected")),
    ],
)
def test_reuse_decisions_equal_kvsims(model, policy, max_active, device_positions, host_kv_bytes, tiers):
    """All arriving at once, then only work ends in one sequence (one request at a time, or no transfers
    to overlap compute): the order of happenings is kvsim's whatever the durations, so it decides the same."""
    config = system(policy, max_active, device_positions * 4096, host_kv_bytes)
    document = serve(model, workload(gap_us=1000), config, as_fast_as_possible=True)[2]
    run = simulate(
        parse_system(document["system"]), parse_document(document["computations"]), parse_workload(document["workload"])
    )
    simulated = run.outcomes["requests"]
    assert set(simulated) == set(document["requests"])
    keys = ("status", "reuse_positions", "reuse_tier", "selected_tokens", "prompt_positions")
    for request_id, measured in document["requests"].items():
        assert {k: measured[k] for k in keys} == {k: simulated[request_id][k] for k in keys}, request_id
    for name in (
        "hits_device",
        "hits_host",
        "offloads",
        "reloads",
        "drops",
        "bytes_device_to_host",
        "bytes_host_to_device",
    ):
        assert document["totals"][name] == run.outcomes["totals"][name], name
    assert min(document["totals"][name] for name in tiers) >= 1


def test_serve_command_writes_the_measured_run(tmp_path, capsys):
    out = tmp_path / "measured.json"
    code = cli.main(["serve", str(DATA / "engine_workload.json"), "--system", str(DATA / "engine_system.json"),
                     "--out", str(out), "--as-fast-as-possible"])  # fmt: skip
    assert code == 0
    document = json.loads(out.read_text())
    assert document["format"] == "jgpt-measured-run" and document["engine"]["compiles_during_run"] == 0
    assert set(document["requests"]) == {r["request_id"] for r in document["workload"]["requests"]}
    assert "ttft" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda w, s: s["scheduling"].update(max_active_requests=0), "system.scheduling.max_active_requests"),
        (lambda w, s: s["kv_cache"].update(retention_policy="fifo"), "system.kv_cache.retention_policy"),
        (lambda w, s: s["transfer"].update(link_bytes_per_us=0), "system.transfer.link_bytes_per_us"),
        (lambda w, s: w.update(customer_interaction={"actions": [{"kind": "cancel", "at_us": 0, "request_id": "x"}]}),
         "customer_interaction.actions[0].request_id"),
        (lambda w, s: w["requests"][0].update(arrival_us=-1), "workload.requests[0].arrival_us"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_kvsims_field_names(tmp_path, capsys, change, field):
    workload_document = json.loads((DATA / "engine_workload.json").read_text())
    system_document = json.loads((DATA / "engine_system.json").read_text())
    change(workload_document, system_document)
    (tmp_path / "w.json").write_text(json.dumps(workload_document))
    (tmp_path / "s.json").write_text(json.dumps(system_document))
    out = tmp_path / "out.json"
    code = cli.main(["serve", str(tmp_path / "w.json"), "--system", str(tmp_path / "s.json"), "--out", str(out)])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and field in error[0]
    assert not out.exists()


def test_an_interrupted_serve_writes_nothing(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(InferenceEngine, "serve", interrupted)
    out = tmp_path / "measured.json"
    code = cli.main(["serve", str(DATA / "engine_workload.json"), "--system", str(DATA / "engine_system.json"),
                     "--out", str(out)])  # fmt: skip
    assert code == 130 and "interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
