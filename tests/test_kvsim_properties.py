"""Property tests: random workloads and systems keep kvsim's invariants and replay exactly."""

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim import (
    parse_document,
    parse_interaction,
    parse_system,
    read_record,
    record_json,
    record_value,
    rerun,
    simulate,
)

TURN_END = 259
ENDS = {"complete", "stop", "cancel", "reject"}


def _request(request_id, arrival, prompt, max_new, output, flops, memory):
    return {
        "request_id": request_id,
        "arrival_us": arrival,
        "prompt_ids": prompt,
        "max_new_tokens": max_new,
        "output_ids": output,
        "outcome": {
            "selected_tokens": len(output),
            "published_tokens": sum(1 for i in output if i != TURN_END),
            "unused_budget": max_new - len(output),
            "stop_reason": "turn_end" if output[-1] == TURN_END else "max_new_tokens",
            "complete": output[-1] == TURN_END,
        },
        "prefill_costs": {
            "fixed_matmul_flops": flops,
            "fixed_memory_bytes": memory,
            "position_matmul_flops": [flops] * len(prompt),
            "position_memory_bytes": [memory // 4] * len(prompt),
        },
        "decode_steps": [
            {"position": len(prompt) + k, "matmul_flops": flops, "logical_memory_bytes": memory}
            for k in range(len(output) - 1)
        ],
    }


@st.composite
def scenarios(draw):
    """Conversations over a tiny alphabet: later prompts often extend earlier sequences."""
    count = draw(st.integers(1, 10))
    sequences, requests, arrival = [], [], 0
    for index in range(count):
        arrival += draw(st.integers(0, 15))  # mostly in order, so later turns can find earlier states
        base = draw(st.sampled_from(sequences)) if sequences and draw(st.booleans()) else []
        prompt = base + draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
        max_new = draw(st.integers(1, 4))
        text = draw(st.lists(st.integers(0, 3), min_size=0, max_size=max_new))
        output = (text + [TURN_END])[:max_new] if text or draw(st.booleans()) else [TURN_END]
        sequences.append(prompt + output)
        requests.append(
            _request(f"r{index}", arrival, prompt, max_new, output, draw(st.integers(0, 30)), draw(st.integers(0, 200)))
        )
    kv = draw(st.integers(1, 50))
    document = {
        "format": "jgpt-recorded-computations",
        "version": 1,
        "model": {"checkpoint_sha256": "p", "tokenizer_sha256": "p", "architecture": {}},
        "kv_bytes_per_position": kv,
        "execution": {"backend": {}, "provenance": {}},
        "requests": requests,
    }
    rate = st.one_of(st.integers(1, 20), st.sampled_from([0.5, 1.5, 2.25, 7.1]))
    system = {
        "max_requests": draw(st.integers(1, 12)),
        "max_new_tokens_cap": draw(st.sampled_from([4, 4, 3])),
        "scheduling": {
            "max_active_requests": draw(st.integers(1, 4)),
            "policy": draw(st.sampled_from(["serialized", "continuous_batching"])),
        },
        "kv_cache": {
            "device_kv_bytes": draw(st.integers(1, 24)) * kv,
            "host_kv_bytes": draw(st.integers(0, 24)) * kv,
            "retention_policy": draw(st.sampled_from(["lru", "lru", "none"])),
        },
        "transfer": {"link_bytes_per_us": draw(rate), "link_latency_us": draw(st.sampled_from([0, 1, 2.5]))},
        "compute_service": {"compute_flops_per_us": draw(rate), "memory_bytes_per_us": draw(rate)},
    }
    actions = [
        {"kind": kind, "at_us": draw(st.integers(0, 80)), "request_id": f"r{draw(st.integers(0, count - 1))}"}
        | ({"output_bytes": draw(st.integers(0, 4))} if kind == "consume" else {})
        for kind in draw(st.lists(st.sampled_from(["cancel", "consume"]), max_size=4))
    ]
    return system, document, {"actions": actions}


def _run(scenario):
    system, document, interaction = scenario
    return simulate(parse_system(system), parse_document(document), interaction=parse_interaction(interaction))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_at_every_event(scenario):
    system, document, _ = scenario
    record = record_value(_run(scenario))
    events = record["events"]
    device_budget, host_budget = system["kv_cache"]["device_kv_bytes"], system["kv_cache"]["host_kv_bytes"]
    index = {e["event_id"]: i for i, e in enumerate(events)}
    offloaded = set()
    ends, releases = Counter(), Counter()
    for i, event in enumerate(events):
        assert event["device_reserved_bytes"] <= device_budget
        assert event["host_retained_bytes"] <= host_budget
        assert 0 <= event["host_retained_bytes"] and 0 <= event["device_reserved_bytes"]
        assert i == 0 or events[i - 1]["time_us"] <= event["time_us"]
        for cause in event["causes"]:  # no event precedes any of its causes
            assert index[cause] < i and events[index[cause]]["time_us"] <= event["time_us"]
        if event["kind"] == "offload":
            offloaded.add(event["state_id"])
        if event["kind"] == "reload":
            assert event["state_id"] in offloaded
        if event["kind"] in ENDS:
            ends[event["request_id"]] += 1
        if event["kind"] == "release":
            releases[event["request_id"]] += 1
    arrived = [e["request_id"] for e in events if e["kind"] == "arrival"]
    admitted = {e["request_id"] for e in events if e["kind"] == "admit"}
    assert sorted(arrived) == sorted(r["request_id"] for r in document["requests"])
    assert all(ends[r] == 1 for r in arrived)  # every request ends exactly once
    assert all(releases[r] == 1 for r in admitted) and set(releases) == admitted
    last = events[-1]
    retained = sum(s["bytes"] for s in record["states"].values() if s["fate"] == "on device")
    assert last["device_reserved_bytes"] == retained  # nothing stays reserved at the end


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_runs_are_deterministic_and_replay_byte_identical(scenario):
    data = record_json(_run(scenario))
    assert record_json(_run(scenario)) == data
    assert record_json(rerun(read_record(data))) == data
