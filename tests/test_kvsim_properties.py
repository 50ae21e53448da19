"""Property tests: random workloads and systems keep kvsim's invariants and replay exactly."""

from collections import Counter
from fractions import Fraction

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


def _ceil(value: Fraction) -> int:
    return -(-value.numerator // value.denominator)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_lookups_durations_and_resources_follow_the_rules(scenario):
    """An independent reading of docs/kvsim.md: longest proper prefix, exact durations, exclusive resources."""
    system, document, _ = scenario
    record = record_value(_run(scenario))
    requests = {r["request_id"]: r for r in document["requests"]}
    rate = lambda x: Fraction(str(x))  # noqa: E731  (the decimal the JSON writes)
    flops_rate = rate(system["compute_service"]["compute_flops_per_us"])
    bytes_rate = rate(system["compute_service"]["memory_bytes_per_us"])
    link_rate, latency = rate(system["transfer"]["link_bytes_per_us"]), rate(system["transfer"]["link_latency_us"])

    def sequence(state):
        origin = requests[state["request_id"]]
        return tuple(origin["prompt_ids"] + origin["output_ids"])[: state["positions"]]

    live, offloaded, reused, steps = {}, set(), {}, Counter()
    compute_free_at = link_free_at = 0
    open_work, open_transfer = {}, {}
    for event in record["events"]:
        kind, request_id, now = event["kind"], event["request_id"], event["time_us"]
        if kind == "retain":
            live[event["state_id"]] = sequence(record["states"][event["state_id"]])
        elif kind in ("lookup_hit", "lookup_miss"):
            prompt = tuple(requests[request_id]["prompt_ids"])
            matches = [(len(s), sid) for sid, s in live.items() if len(s) < len(prompt) and prompt[: len(s)] == s]
            if kind == "lookup_miss":
                assert not matches
            else:
                assert max(matches)[0] == len(live[event["state_id"]])
                assert event["detail"] == ("host" if event["state_id"] in offloaded else "device")
                reused[request_id] = len(live.pop(event["state_id"]))
        elif kind == "drop":
            live.pop(event["state_id"])
        elif kind == "offload":
            offloaded.add(event["state_id"])
        elif kind == "compute_start":
            assert now >= compute_free_at  # one service step at a time
            open_work[request_id] = now
        elif kind == "compute_end" and system["scheduling"]["policy"] == "serialized":
            spec, step = requests[request_id], steps[request_id]
            if step == 0:
                costs, r = spec["prefill_costs"], reused.get(request_id, 0)
                flops = costs["fixed_matmul_flops"] + sum(costs["position_matmul_flops"][r:])
                memory = costs["fixed_memory_bytes"] + sum(costs["position_memory_bytes"][r:])
            else:
                decode = spec["decode_steps"][step - 1]
                flops, memory = decode["matmul_flops"], decode["logical_memory_bytes"]
            assert now - open_work.pop(request_id) == _ceil(max(flops / flops_rate, memory / bytes_rate))
            compute_free_at, steps[request_id] = now, step + 1
        elif kind == "compute_end":
            compute_free_at = now
        elif kind == "transfer_start":
            assert now >= link_free_at  # one transfer at a time on the link
            open_transfer[event["state_id"]] = now
        elif kind == "transfer_end":
            assert now - open_transfer.pop(event["state_id"]) == _ceil(latency + event["bytes"] / link_rate)
            link_free_at = now
