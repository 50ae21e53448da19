"""The one serving policy (kvsim/kv_residency.py): its decisions by hand, and the same decisions from both drivers.

The first tests feed the KVResidency state machine what happened, playing the
driver's part (counting each selected id in `step`), with one byte per position
so every size is a count of positions, and compare its decisions with
sequences worked out by hand from the rules in docs/kvsim.md. The last test
serves a workload with the InferenceEngine on a tiny random-weight model, then
replays it in kvsim with every work and transfer taking the engine's measured
time, so kvsim's engine meets the same happenings in the same order; each
driver's policy records what it was told and what it decided, and the two
records must be equal.
"""

from __future__ import annotations

import json

import pytest

import inference.engine
import kvsim.engine
from inference.engine import InferenceEngine
from inference.execution import ModelExecution
from inference.measured_run import measured_run
from inference.policy import GenerationPolicy, InferenceRequest
from kvsim import (
    KVResidency,
    RetainedState,
    ScheduledRequest,
    Transfer,
    parse_interaction,
    parse_system,
    read_measured_run,
)
from kvsim.fidelity import replay

from conftest import tiny_model


def system(device: int, host: int, *, active: int = 1, requests: int = 8, cap: int = 8, batching: bool = False,
           retention: str = "lru"):  # fmt: skip
    return parse_system({
        "max_requests": requests, "max_new_tokens_cap": cap,
        "scheduling": {"max_active_requests": active, "policy": "continuous_batching" if batching else "serialized"},
        "kv_cache": {"device_kv_bytes": device, "host_kv_bytes": host, "retention_policy": retention},
        "transfer": {"link_bytes_per_us": 1, "link_latency_us": 0},
        "compute_service": {"compute_flops_per_us": 1, "memory_bytes_per_us": 1},
    })  # fmt: skip


def ask(request_id: str, prompt: tuple[int, ...], budget: int, outputs: tuple[int, ...] = ()) -> ScheduledRequest:
    """A request whose ids the driver will select: `outputs` (a step reads only those selected so far)."""
    return ScheduledRequest(request_id, prompt, outputs, budget)


def shown(subject):
    """A decision's subject as the test writes it: a state with the tier it had when decided."""
    if isinstance(subject, RetainedState):
        return f"{subject.state_id}@{subject.tier}"
    if isinstance(subject, Transfer):
        return subject.direction, subject.state.state_id
    if isinstance(subject, list):
        return tuple(r.request_id for r in subject)
    return subject


def seen(decisions) -> list[tuple]:
    """The decisions, each shown as it is taken (the policy decides the next one only when asked)."""
    return [(kind, request.request_id, shown(subject)) for kind, request, subject in decisions]


def ran(policy: KVResidency, batch: list[ScheduledRequest], last: tuple[ScheduledRequest, ...] = ()) -> list[tuple]:
    """The driver's part when the running work ends: each request selected one more id; `last` ended with it."""
    decisions = []
    for request in batch:
        request.step += 1
        decisions += seen(policy.step_ended(request, *(("stop", "budget") if request in last else ())))
    return decisions + seen(policy.work_ended())


def test_a_finished_request_retains_what_it_computed_and_a_longer_prompt_reuses_it_from_the_device():
    policy = KVResidency(system(device=20, host=0), 1)
    a = ask("a", (1, 2, 3), 2, outputs=(7, 8))
    assert seen(policy.arrive(a)) == [("admit", "a", None), ("reserve", "a", None), ("run", "a", ("a",))]
    assert policy.cache.reserved == 4  # prompt + budget - 1 positions
    assert ran(policy, [a]) == [("run", "a", ("a",))]  # the prefill selected 7; a decode step selects 8
    # Every position computed: the prompt and the selected ids but the last.
    assert ran(policy, [a], last=(a,)) == [
        ("stop", "a", "budget"), ("release", "a", None), ("retain", "a", "s0@device"), ("leave", "a", 4),
    ]  # fmt: skip
    assert (policy.cache.reserved, policy.cache.device_retained) == (0, 4)
    b = ask("b", (1, 2, 3, 7, 5), 1)
    assert seen(policy.arrive(b)) == [("admit", "b", "s0@device"), ("reserve", "b", None), ("run", "b", ("b",))]
    assert (b.reused, b.reuse_tier) == (4, "device")
    assert (policy.cache.reserved, policy.cache.device_retained) == (5, 0)  # the state's bytes became b's


def test_an_equal_sequence_is_no_hit_and_is_retained_once_and_retention_none_keeps_nothing():
    for retention, kept in (("lru", [("retain_skip", "second", 3)]), ("none", [])):
        policy = KVResidency(system(device=20, host=0, retention=retention), 1)
        first, second = ask("first", (4, 4, 4), 1, (9,)), ask("second", (4, 4, 4), 1, (9,))
        seen(policy.arrive(first))
        ran(policy, [first], last=(first,))
        assert seen(policy.arrive(second))[0] == ("admit", "second", None)  # equal is not a proper prefix
        assert ran(policy, [second], last=(second,)) == [
            ("stop", "second", "budget"), ("release", "second", None), *kept, ("leave", "second", 0),
        ]  # fmt: skip
        assert policy.cache.device_retained == (3 if retention == "lru" else 0)


def pressed() -> tuple[KVResidency, ScheduledRequest, ScheduledRequest, ScheduledRequest]:
    """A device budget of 10 and a host of 10, one active request: b's reservation of 7 pushes a's state of 4
    to the host; c continues a's sequence and is admitted with its state on the host when b ends."""
    policy = KVResidency(system(device=10, host=10), 1)
    a, b = ask("a", (1, 2, 3), 2, (9, 9)), ask("b", (5, 6, 7, 8), 4, (1, 1, 1, 1))
    seen(policy.arrive(a))
    ran(policy, [a])
    ran(policy, [a], last=(a,))
    assert policy.cache.device_retained == 4
    # 6 bytes free, 7 needed: the least recently used state leaves for the host, and b waits for the transfer.
    assert seen(policy.arrive(b)) == [
        ("offload", "b", "s0@offloading"),
        ("transfer_start", "b", ("device_to_host", "s0")),
    ]
    cache = policy.cache
    assert (cache.device_retained, cache.offloading_bytes, cache.host_retained) == (4, 4, 4)  # both tiers, meanwhile
    assert seen(policy.transfer_ended()) == [
        ("transfer_end", "b", ("device_to_host", "s0")), ("admit", "b", None), ("reserve", "b", None),
        ("run", "b", ("b",)),
    ]  # fmt: skip
    c = ask("c", (1, 2, 3, 9, 4), 2, (3, 3))
    assert seen(policy.arrive(c)) == []  # the one active slot is b's
    for _ in range(3):
        ran(policy, [b])
    return policy, b, c, a


def test_pressure_offloads_the_least_recent_state_and_a_host_hit_reloads_it():
    policy, b, c, _ = pressed()
    # b retains 7; c needs 6 with 3 free: b's state cannot go to the host without dropping the state c reuses,
    # so it is dropped; c's state is reloaded before its prefill runs.
    assert ran(policy, [b], last=(b,)) == [
        ("stop", "b", "budget"), ("release", "b", None), ("retain", "b", "s1@device"), ("leave", "b", 7),
        ("drop", "c", "s1@device"), ("admit", "c", "s0@host"), ("reserve", "c", None), ("reload", "c", "s0@reloading"),
        ("transfer_start", "c", ("host_to_device", "s0")),
    ]  # fmt: skip
    assert seen(policy.transfer_ended()) == [("transfer_end", "c", ("host_to_device", "s0")), ("run", "c", ("c",))]
    assert (c.reused, c.reuse_tier) == (4, "host")
    assert (policy.cache.device_retained, policy.cache.host_retained, policy.cache.reserved) == (0, 0, 6)


def test_a_cancel_during_a_reload_ends_the_request_at_the_reload_end_retaining_its_prefix():
    policy, b, c, _ = pressed()
    ran(policy, [b], last=(b,))
    assert seen(policy.cancel(c)) == []  # reloading: honoured at the reload's end
    assert seen(policy.transfer_ended()) == [
        ("transfer_end", "c", ("host_to_device", "s0")), ("cancel", "c", "cancelled at reload end"),
        ("release", "c", None), ("retain", "c", "s2@device"), ("leave", "c", 4),
    ]  # fmt: skip


def test_room_on_the_host_is_made_by_dropping_its_least_recent_state_never_the_one_the_head_reuses():
    policy = KVResidency(system(device=8, host=6), 1)
    for request in (ask("x", (1, 2, 3), 1, (0,)), ask("y", (4, 5, 6), 1, (0,))):
        seen(policy.arrive(request))
        ran(policy, [request], last=(request,))  # x and y retain 3 each
    z = ask("z", (7, 8, 9, 10), 2, (0, 0))
    assert [d[0] for d in seen(policy.arrive(z))] == ["offload", "transfer_start"]  # x's state to the host
    assert [d[:2] for d in seen(policy.transfer_ended())][1] == ("admit", "z")
    ran(policy, [z])
    ran(policy, [z], last=(z,))  # z retains 5: the device is full, y's 3 and z's 5
    w = ask("w", (4, 5, 6, 11), 1, (0,))
    # w reuses y's state; z's state goes to the host, where x's makes room.
    assert seen(policy.arrive(w)) == [
        ("drop", "w", "s0@host"), ("offload", "w", "s2@offloading"), ("transfer_start", "w", ("device_to_host", "s2")),
    ]  # fmt: skip
    assert seen(policy.transfer_ended())[1] == ("admit", "w", "s1@device")


def test_a_state_hit_while_it_is_offloaded_is_reloaded_after_the_offload_on_the_link():
    policy = KVResidency(system(device=10, host=10, active=2), 1)
    a = ask("a", (1, 2, 3), 1, (0,))
    seen(policy.arrive(a))
    ran(policy, [a], last=(a,))
    b, c = ask("b", tuple(range(10, 18)), 1), ask("c", (1, 2, 3, 4), 2)
    assert [d[0] for d in seen(policy.arrive(b))] == ["offload", "transfer_start"]
    assert seen(policy.arrive(c)) == []  # behind b: nobody overtakes the head
    assert seen(policy.cancel(b)) == [
        ("cancel", "b", "cancelled while waiting"), ("admit", "c", "s0@offloading"), ("reserve", "c", None),
        ("reload", "c", "s0@offloading"),
    ]  # fmt: skip
    assert seen(policy.transfer_ended()) == [
        ("transfer_end", "b", ("device_to_host", "s0")), ("transfer_start", "c", ("host_to_device", "s0")),
    ]  # fmt: skip
    assert seen(policy.transfer_ended()) == [("transfer_end", "c", ("host_to_device", "s0")), ("run", "c", ("c",))]
    assert (policy.cache.device_retained, policy.cache.host_retained, policy.cache.reserved) == (0, 0, 5)


def test_rejections_at_arrival_name_their_reason():
    policy = KVResidency(system(device=10, host=0, requests=2, cap=3), 1)
    assert seen(policy.arrive(ask("over cap", (1,), 4))) == [
        ("reject", "over cap", "max_new_tokens 4 > max_new_tokens_cap 3")
    ]
    assert seen(policy.arrive(ask("too long", tuple(range(10)), 2))) == [
        ("reject", "too long", "reservation 11 bytes > device_kv_bytes 10")
    ]
    seen(policy.arrive(ask("active", (1, 2), 2)))
    assert seen(policy.arrive(ask("waiting", (3, 4), 2))) == []
    assert seen(policy.arrive(ask("third", (5, 6), 2))) == [("reject", "third", "max_requests 2 already in the system")]


def test_a_cancel_ends_a_request_at_its_next_step_boundary():
    policy = KVResidency(system(device=20, host=0, active=2), 1)
    p, q, r = ask("p", (1, 2), 3, (5, 5, 5)), ask("q", (3, 4), 3), ask("r", (5, 6), 3)
    assert [d[0] for d in seen(policy.arrive(p))] == ["admit", "reserve", "run"]
    assert [d[0] for d in seen(policy.arrive(q))] == ["admit", "reserve"]  # ready; the compute is p's
    assert seen(policy.arrive(r)) == []  # both slots taken
    assert seen(policy.cancel(r)) == [("cancel", "r", "cancelled while waiting")]
    assert seen(policy.cancel(q)) == [
        ("cancel", "q", "cancelled between steps"), ("release", "q", None), ("leave", "q", 0),
    ]  # fmt: skip
    assert seen(policy.cancel(p)) == [] and seen(policy.cancel(p)) == []  # running: at its step's end, once
    assert ran(policy, [p]) == [
        ("cancel", "p", "cancelled at step boundary"), ("release", "p", None), ("retain", "p", "s0@device"),
        ("leave", "p", 2),
    ]  # fmt: skip
    assert (policy.active, policy.in_system, policy.cache.reserved) == (0, 0, 0)


@pytest.mark.parametrize("batching", [True, False])
def test_continuous_batching_runs_every_ready_decode_step_together_and_a_prefill_alone(batching):
    policy = KVResidency(system(device=100, host=0, active=3, batching=batching), 1)
    a, b, c = (ask(name, (i, i), 4, (0, 0, 0, 0)) for i, name in enumerate("abc"))
    assert seen(policy.arrive(a))[-1] == ("run", "a", ("a",))
    seen(policy.arrive(b))
    assert ran(policy, [a]) == [("run", "b", ("b",))]  # the ready queue's head: b's prefill
    seen(policy.arrive(c))
    together = ("a", "b") if batching else ("a",)
    assert ran(policy, [b]) == [("run", "a", together)]
    assert ran(policy, [a, b] if batching else [a]) == [("run", "c", ("c",))]


# -- both drivers -----------------------------------------------------------------------------------------------


class Recording(KVResidency):
    """The policy, recording what its driver told it and what it decided, in order."""

    records: list[list[tuple]] = []

    def __init__(self, system, kv_bytes_per_position):
        super().__init__(system, kv_bytes_per_position)
        self.record: list[tuple] = []
        Recording.records.append(self.record)

    def told(self, what: tuple, decisions):
        self.record.append(("told", *what))
        for kind, request, subject in decisions:
            self.record.append((kind, request.request_id, shown(subject)))
            yield kind, request, subject

    def arrive(self, request):
        return self.told(("arrive", request.request_id), super().arrive(request))

    def cancel(self, request):
        return self.told(("cancel", request.request_id), super().cancel(request))

    def step_ended(self, request, end=None, reason=""):
        return self.told(
            ("step_ended", request.request_id, request.step, end), super().step_ended(request, end, reason)
        )

    def work_ended(self):
        return self.told(("work_ended",), super().work_ended())

    def transfer_ended(self):
        return self.told(("transfer_ended",), super().transfer_ended())


def workload(kv_bytes: int) -> tuple[list[InferenceRequest], dict]:
    """Phases far enough apart to end before the next begins, on a device of 40 positions and a host of 20.

    A budget of one id retains exactly the prompt, so later prompts can continue it whatever the model
    selects: a1 and b1 leave A and B; a2 reuses A from the device; c1 pushes B to the host; b2 reuses it from
    there (reloaded; the state of a2 is dropped, the host too small for it); two requests are rejected; of three
    arriving together, the third is cancelled while waiting, the second while ready, the first while it
    runs; then an identical sequence is retained once."""
    A, B, C, X = tuple(range(1, 11)), tuple(range(20, 32)), tuple(range(40, 60)), tuple(range(70, 78))
    phases = [
        [("a1", A, 1)], [("b1", B, 1)], [("a2", A + (90, 91, 92, 93, 94), 3)], [("c1", C, 4)],
        [("b2", B + (95, 96, 97, 98), 2)], [("over cap", (1, 2), 9), ("too long", tuple(range(100, 145)), 1)],
        [("h1", (201, 202, 203, 204, 205, 206), 3), ("h2", (211, 212, 213, 214, 215, 216), 3),
         ("h3", (221, 222, 223, 224, 225, 226), 2)],
        [("x1", X, 1)], [("x2", X, 1)],
    ]  # fmt: skip
    requests = [
        InferenceRequest(name, prompt, GenerationPolicy(budget), 400_000 * phase + offset)
        for phase, arrivals in enumerate(phases)
        for offset, (name, prompt, budget) in enumerate(arrivals)
    ]
    cancels = [("h3", 10), ("h2", 11), ("h1", 12)]
    actions = [{"kind": "cancel", "at_us": 400_000 * 6 + at, "request_id": name} for name, at in cancels]
    actions += [{"kind": "consume", "at_us": 400_000 * 3 + 5, "request_id": "a2", "output_bytes": 1}]
    return requests, {"actions": actions}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    artifact = tiny_model(tmp_path_factory.mktemp("model"), seed=3)
    return ModelExecution.from_artifact(artifact, artifact.tokenizer())


@pytest.mark.parametrize("policy", ["serialized", "continuous_batching"])
def test_kvsims_engine_and_the_inference_engine_are_told_the_same_and_decide_the_same(tiny, policy, monkeypatch):
    execution = tiny
    positions = execution.costs.kv_bytes_per_position
    config = parse_system({
        "max_requests": 16, "max_new_tokens_cap": 8,
        "scheduling": {"max_active_requests": 2, "policy": policy},
        "kv_cache": {"device_kv_bytes": 40 * positions, "host_kv_bytes": 20 * positions},
        "transfer": {"link_bytes_per_us": 1000, "link_latency_us": 10},
        "compute_service": {"compute_flops_per_us": 2000000, "memory_bytes_per_us": 20000},
    })  # fmt: skip
    requests, actions = workload(positions)
    interaction = parse_interaction(actions)
    Recording.records = []
    monkeypatch.setattr(inference.engine, "KVResidency", Recording)
    monkeypatch.setattr(kvsim.engine, "KVResidency", Recording)
    served = InferenceEngine(execution, config).serve(requests, interaction)
    document = json.loads(json.dumps(measured_run(execution, config, served, kind="policy", interaction=interaction)))
    replay(read_measured_run(document, "0" * 64))
    engine_record, kvsim_record = Recording.records
    assert kvsim_record == engine_record
    decided = {entry for entry in engine_record if entry[0] != "told"}
    kinds = {entry[0] for entry in decided}
    assert {"offload", "reload", "drop", "reject", "retain", "retain_skip", "transfer_start", "transfer_end"} <= kinds
    hits = {entry[1]: entry[2] for entry in decided if entry[0] == "admit"}
    assert hits["a2"] == "s0@device" and hits["b2"] == "s1@host" and hits["c1"] is None
    assert {entry[2] for entry in decided if entry[0] == "cancel"} == {
        "cancelled while waiting",
        "cancelled between steps",
        "cancelled at step boundary",
    }
