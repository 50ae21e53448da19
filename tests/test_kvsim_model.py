"""Rules of the model beyond the worked example: cancellation, rejection, retention, batching, traces."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jgpt.foundation.errors import ApiError
from kvsim import parse_document, parse_interaction, parse_system, parse_workload, record_value, simulate
from kvsim.analytic import AnalyticModel, analytic_computations
from kvsim.recorded import document_json
from kvsim.synthetic import conversations
from kvsim.system import ComputeServiceConfig, StateTransferConfig
from kvsim.traces import azure, mooncake

DATA = Path(__file__).parent / "data"
EXAMPLE = json.loads((DATA / "kvsim_worked_example.json").read_text())


def _run(system=None, document=None, actions=None) -> dict:
    system = parse_system(system or EXAMPLE["system"])
    document = parse_document(document or EXAMPLE["computations"])
    interaction = None if actions is None else parse_interaction({"actions": actions})
    return record_value(simulate(system, document, interaction=interaction))


def _events(record, request_id):
    return [(e["time_us"], e["kind"]) for e in record["events"] if e["request_id"] == request_id]


def test_durations_round_up_exactly():
    compute = ComputeServiceConfig(parse_system(EXAMPLE["system"]).compute_service.compute_flops_per_us, 3)
    assert compute.duration_us(11, 0) == 2  # 11 FLOPs at 10 per us: 1.1 -> 2
    assert compute.duration_us(10, 0) == 1 and compute.duration_us(0, 0) == 0
    assert compute.duration_us(10, 7) == 3  # memory-bound: 7 / 3 -> 3
    system = parse_system(EXAMPLE["system"] | {"transfer": {"link_bytes_per_us": 1.1, "link_latency_us": 0.5}})
    assert system.transfer == StateTransferConfig(
        link_bytes_per_us=type(system.transfer.link_bytes_per_us)(11, 10),
        link_latency_us=type(system.transfer.link_latency_us)(1, 2),
    )
    assert system.transfer.duration_us(11) == 11  # 0.5 + 11 / 1.1 = 10.5 -> 11
    assert system.transfer.duration_us(0) == 1


def test_cancel_while_waiting_ends_before_admission():
    record = _run(actions=[{"kind": "cancel", "at_us": 2, "request_id": "B"}])
    assert _events(record, "B") == [(1, "arrival"), (2, "cancel_request"), (2, "cancel")]
    assert record["outcomes"]["requests"]["B"]["status"] == "cancelled"


def test_cancel_during_a_work_waits_for_the_step_boundary():
    # A's prefill runs 0 -> 3; a cancel at 1 is honoured when it ends, after the token is published.
    record = _run(actions=[{"kind": "cancel", "at_us": 1, "request_id": "A"}])
    assert _events(record, "A")[-6:] == [
        (1, "cancel_request"),
        (3, "compute_end"),
        (3, "publish"),
        (3, "cancel"),
        (3, "release"),
        (3, "retain"),
    ]
    (retain,) = [e for e in record["events"] if e["kind"] == "retain" and e["request_id"] == "A"]
    assert retain["bytes"] == 300  # the 3 prompt positions it computed
    assert record["outcomes"]["requests"]["A"]["selected_tokens"] == 1


def test_cancel_during_a_reload_waits_for_it_and_retains_the_reloaded_prefix():
    # D reloads s1 (7 positions) from 20 to 29; cancelled at 25 it stops at 29 without computing.
    record = _run(actions=[{"kind": "cancel", "at_us": 25, "request_id": "D"}])
    assert _events(record, "D")[-5:] == [
        (25, "cancel_request"),
        (29, "transfer_end"),
        (29, "cancel"),
        (29, "release"),
        (29, "retain"),
    ]
    retain = record["events"][-1]
    assert (retain["kind"], retain["bytes"], retain["device_reserved_bytes"], retain["host_retained_bytes"]) == (
        "retain",
        700,
        700,
        0,
    )


def test_cancel_after_the_end_has_no_effect():
    record = _run(actions=[{"kind": "cancel", "at_us": 30, "request_id": "A"}])
    assert record["outcomes"]["requests"]["A"]["status"] == "completed"
    assert _events(record, "A")[-1] == (30, "cancel_request")


def test_rejections_name_their_reason():
    system = copy.deepcopy(EXAMPLE["system"])
    system["max_requests"] = 2
    record = _run(system)
    rejected = {e["request_id"]: e["detail"] for e in record["events"] if e["kind"] == "reject"}
    assert rejected["C"] == "max_requests 2 already in the system"
    system = copy.deepcopy(EXAMPLE["system"])
    system["kv_cache"]["device_kv_bytes"] = 900
    rejected = {e["request_id"]: e["detail"] for e in _run(system)["events"] if e["kind"] == "reject"}
    assert rejected["D"] == "reservation 1000 bytes > device_kv_bytes 900"


def test_without_retention_nothing_is_reused():
    system = copy.deepcopy(EXAMPLE["system"])
    system["kv_cache"]["retention_policy"] = "none"
    totals = _run(system)["outcomes"]["totals"]
    assert (totals["hits_device"], totals["hits_host"], totals["reused_positions"], totals["saved_matmul_flops"]) == (
        0,
        0,
        0,
        0,
    )
    assert totals["compute_busy_us"] == 3 + 1 + 6 + 1 + 3 + 1 + 9 + 1  # every prompt position computed


def _conversation_system(policy: str, active: int) -> dict:
    return {
        "max_requests": 10_000,
        "max_new_tokens_cap": 64,
        "scheduling": {"max_active_requests": active, "policy": policy},
        "kv_cache": {"device_kv_bytes": 10**9, "host_kv_bytes": 10**9},
        "transfer": {"link_bytes_per_us": 10_000, "link_latency_us": 5},
        "compute_service": {"compute_flops_per_us": 10**7, "memory_bytes_per_us": 10**5},
    }


def test_continuous_batching_reads_weights_once_per_step():
    model = AnalyticModel(layers=2, width=64, ffn=256, vocabulary=260, precision_bytes=4)
    document = document_json(analytic_computations(model, conversations(200, seed=1), "test"))
    serial = _run(_conversation_system("serialized", 16), document)["outcomes"]["totals"]
    batched = _run(_conversation_system("continuous_batching", 16), document)["outcomes"]["totals"]
    assert batched["compute_busy_us"] < serial["compute_busy_us"]
    assert batched["latency_us"]["e2e"]["p90"] < serial["latency_us"]["e2e"]["p90"]
    # With one active request there is nothing to batch: the policies agree event for event.
    one = [_run(_conversation_system(p, 1), document)["events"] for p in ("serialized", "continuous_batching")]
    strip = lambda events: [(e["time_us"], e["kind"], e["request_id"]) for e in events]  # noqa: E731
    assert strip(one[0]) == strip(one[1])


def test_synthetic_conversations_reuse_their_previous_turn():
    model = AnalyticModel(layers=2, width=64, ffn=256, vocabulary=260, precision_bytes=4)
    items = conversations(300, seed=2)
    record = _run(_conversation_system("serialized", 4), document_json(analytic_computations(model, items, "test")))
    later_turns = [i.request_id for i in items if not i.request_id.endswith("t0")]
    outcomes = record["outcomes"]["requests"]
    assert later_turns and all(outcomes[r]["reuse_tier"] == "device" for r in later_turns)


def test_analytic_documents_round_trip_through_json():
    model = AnalyticModel(layers=3, width=32, ffn=64, vocabulary=300, precision_bytes=2)
    computations = analytic_computations(model, conversations(20, seed=4), "test")
    document = document_json(computations)
    again = parse_document(json.loads(json.dumps(document)))
    assert document_json(again) == document
    for a, b in zip(computations.requests, again.requests, strict=True):
        for reused in (0, len(a.prompt_ids) - 1):
            assert a.prefill_cost(reused) == b.prefill_cost(reused)
    request = document["requests"][0]
    w, layers = 32, 3
    logits = 2 * w * 300  # at every position
    assert request["prefill_costs"]["position_matmul_flops"][:2] == [
        layers * (8 * w * w + 4 * w * 64 + 4 * w * p) + logits for p in (1, 2)
    ]


def test_mooncake_import_keeps_declared_shared_blocks():
    items = mooncake((DATA / "kvsim_mooncake_sample.jsonl").read_text(), block_tokens=4)
    assert [i.arrival_us for i in items] == [0, 2000, 2000, 5000, 9000]
    assert [len(i.prompt_ids) for i in items] == [10, 14, 7, 16, 12]
    assert [len(i.output_ids) for i in items] == [3, 2, 4, 2, 1]
    assert items[0].prompt_ids[:8] == items[1].prompt_ids[:8] and items[0].prompt_ids[8] != items[1].prompt_ids[8]
    assert items[1].prompt_ids == items[3].prompt_ids[:14]
    assert items[2].prompt_ids == items[4].prompt_ids[:7]
    assert items[0].prompt_ids[:4] != items[2].prompt_ids[:4]
    # r1's answer is what its next turn r3 repeats after r1's prompt, so r1's whole sequence begins r3's prompt.
    assert items[1].output_ids == (*items[3].prompt_ids[14:15], 259)
    assert items[2].output_ids == (*items[4].prompt_ids[7:10], 259)
    assert items[0].output_ids[-1] == 259 and len(items[0].output_ids) == 3
    model = AnalyticModel(layers=2, width=16, ffn=32, vocabulary=260, precision_bytes=4)
    outcomes = _run(_conversation_system("serialized", 1), document_json(analytic_computations(model, items, "t")))
    reuse = {r: (o["reuse_tier"], o["reuse_positions"]) for r, o in outcomes["outcomes"]["requests"].items()}
    assert reuse == {"r0": (None, 0), "r1": (None, 0), "r2": (None, 0), "r3": ("device", 15), "r4": ("device", 10)}


def test_azure_import_reads_the_three_columns():
    items = azure((DATA / "kvsim_azure_sample.csv").read_text())
    assert [i.arrival_us for i in items] == [0, 410, 410, 19422]  # microseconds after the first row (7th digit dropped)
    assert [(len(i.prompt_ids), len(i.output_ids)) for i in items] == [(12, 3), (30, 5), (7, 1), (20, 2)]
    assert items[3].output_ids[-1] == 259


def test_bad_traces_are_clear_errors():
    with pytest.raises(ApiError, match="trace line 1.hash_ids: 1 blocks of 4 tokens do not cover input_length 9"):
        mooncake('{"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [1]}', block_tokens=4)
    with pytest.raises(ApiError, match="missing column GeneratedTokens"):
        azure("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n")


def test_lookup_finds_the_longest_retained_proper_prefix():
    from kvsim.kv_cache import KVCache
    from kvsim.recorded import token_key
    from kvsim.system import KVCacheConfig

    cache = KVCache(KVCacheConfig(device_kv_bytes=10**6, host_kv_bytes=0), kv_bytes_per_position=10)
    states = {ids: cache.retain(token_key(ids), "r") for ids in [(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6), (9,)]}
    found = lambda prompt: cache.lookup(token_key(prompt))  # noqa: E731
    assert found((1, 2, 3, 4, 5, 6, 7)) is states[(1, 2, 3, 4, 5, 6)]
    assert found((1, 2, 3, 4, 5)) is states[(1, 2, 3, 4)]
    assert found((1, 2, 3, 4, 5, 6)) is states[(1, 2, 3, 4)]  # an equal sequence is not a proper prefix
    assert found((1, 2, 3, 5)) is states[(1, 2)]
    assert found((1,)) is None and found((2, 1)) is None and found((9,)) is None
    cache.take(states[(1, 2, 3, 4)])
    assert found((1, 2, 3, 4, 5)) is states[(1, 2)]
    assert cache.device_retained == 10 * (2 + 6 + 1) and cache.device_lru_bytes == cache.device_retained


def test_submit_actions_declare_the_arrivals_and_replay():
    from kvsim import read_record, record_json, rerun

    actions = [{"kind": "submit", "at_us": t, "request_id": r} for r, t in (("C", 0), ("A", 5))]
    run = simulate(
        parse_system(EXAMPLE["system"]),
        parse_document(EXAMPLE["computations"]),
        interaction=parse_interaction({"actions": actions}),
    )
    record = record_value(run)
    assert record["declaration"]["workload"] == {
        "kind": "customer_interaction",
        "requests": [{"request_id": "C", "arrival_us": 0}, {"request_id": "A", "arrival_us": 5}],
    }
    assert [e["request_id"] for e in record["events"] if e["kind"] == "arrival"] == ["C", "A"]
    data = record_json(run)
    assert record_json(rerun(read_record(data))) == data
    with pytest.raises(ApiError, match="either as a workload or as submit actions"):
        simulate(
            parse_system(EXAMPLE["system"]),
            parse_document(EXAMPLE["computations"]),
            workload=parse_workload({"kind": "w", "requests": [{"request_id": "A", "arrival_us": 0}]}),
            interaction=parse_interaction({"actions": actions}),
        )


def _renumbered(document: dict, old: int, new: int) -> dict:
    document = copy.deepcopy(document)
    for request in document["requests"]:
        for key in ("prompt_ids", "output_ids"):
            request[key] = [new if i == old else i for i in request[key]]
    return document


def test_the_turn_end_is_the_documents_not_a_constant():
    # A foreign tokenizer's turn end (GPT-2's 50256 here) publishes and completes exactly as jgpt's 259 does.
    record, moved = _run(), _run(document=_renumbered(EXAMPLE["computations"], 259, 50256))
    assert moved["outcomes"] == record["outcomes"]
    publishes = lambda r: [e for e in r["events"] if e["kind"] == "publish"]  # noqa: E731
    assert publishes(moved) == publishes(record)
    assert not any("50256" in e["detail"] for e in moved["events"])


def _edited(edit) -> dict:
    document = copy.deepcopy(EXAMPLE["computations"])
    edit(document["requests"])
    return document


def _incomplete(request: dict) -> None:
    request["outcome"].update(complete=False, stop_reason="max_new_tokens", published_tokens=2)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda r: r[1]["output_ids"].__setitem__(1, 258), "computations.requests[1].output_ids"),
        (lambda r: r[0]["output_ids"].__setitem__(0, 259), "computations.requests[0].output_ids[0]"),
        (lambda r: _incomplete(r[2]), "computations.requests[2].output_ids[1]"),
    ],
)
def test_a_turn_end_that_contradicts_the_others_is_refused(edit, field):
    with pytest.raises(ApiError) as error:
        parse_document(_edited(edit))
    assert error.value.field == field


def test_published_bytes_without_token_bytes_are_bytes_only():
    consume = [{"kind": "consume", "at_us": 2, "request_id": "A", "output_bytes": 1}]
    control = _edited(lambda r: r[0]["output_ids"].__setitem__(0, 258))  # a role marker the model selected
    with pytest.raises(ApiError) as error:
        _run(document=control, actions=consume)
    assert error.value.field == "computations.requests[A].output_token_bytes"
    control["requests"][0]["output_token_bytes"] = [0, 0]
    assert _run(document=control, actions=consume)["outcomes"]["requests"]["A"]["status"] == "completed"


def test_the_framing_ids_are_jgpts_and_come_without_numpy_or_hf_tokenizers():
    """kvsim reads the ids from the tokenizers' pure-Python framing module, so generating a conversation's ids
    loads neither numpy nor HF `tokenizers`."""
    code = (
        "import sys, kvsim.analytic\n"
        "print(kvsim.analytic.framing_ids(), sorted(m for m in ('numpy', 'tokenizers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "{'system': 256, 'user': 257, 'assistant': 258, 'turn_end': 259} []"
