"""The calibrated ComputeService and StateTransfer, `jgpt kvsim calibrate` and `jgpt kvsim predict`.

The measured runs here are made by hand: kvsim itself, run with known calibrated
parameters, plays the engine, and its events are written out as the works a
measured-run document lists (docs/measured-run.md). Calibration must recover the
parameters from those works, and prediction must then reproduce the outcomes.
"""

from __future__ import annotations

import copy
import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_kvsim_model import EXAMPLE

from jgpt.cli import main as cli
from jgpt.foundation.errors import ApiError
from kvsim import parse_document, parse_system, record_json, record_value, rerun, simulate
from kvsim.analytic import AnalyticModel, analytic_computations
from kvsim.calibration import (
    SPREAD_POINTS,
    SPREAD_TAIL,
    fit,
    fitted_terms,
    host_fit,
    merge_service,
    nnls,
    step_overhead_us,
)
from kvsim.compute_service import (
    CalibratedComputeService,
    CalibratedTransfer,
    LinkTerms,
    WorkTerms,
    compute_service_json,
)
from kvsim.fidelity import compare, noise_band, predict, predicted_totals
from kvsim.measured_run import FORMAT, finishes, host_gaps, idle_us, read_measured_run
from kvsim.recorded import document_json
from kvsim.synthetic import conversations
from kvsim.system import system_json

from hostile import FUZZ, assert_clean, assert_refused, mutated_json

WINDOWS, BATCHES = [16, 32, 64, 128, 256], [1, 2, 4, 8]
TRUTH = {
    "compute_service": {
        "model": "calibrated",
        "prefill": {
            "fixed_us": 400,
            "per_position_us": 12,
            "per_slot_us": 3,
            "per_flop_us": 2e-06,
            "per_byte_us": 0,
            "after_idle_us": 250,
        },
        "decode": {
            "fixed_us": 150,
            "per_batch_us": {"2": 40, "4": 120, "8": 280},
            "per_slot_us": 0.5,
            "per_flop_us": 0,
            "per_byte_us": 0.0001,
            "after_idle_us": 0,
        },
        "step_overhead_us": 30,
        "after_idle_min_us": 0,
        "slot_capacity": 256,
        "prefill_window_buckets": WINDOWS,
        "decode_batch_buckets": BATCHES,
    },
    "transfer": {
        "model": "calibrated",
        "device_to_host": {"latency_us": 20, "per_byte_us": 0.001},
        "host_to_device": {"latency_us": 35, "per_byte_us": 0.002},
        "blocks_compute": True,  # like the engine: one serving thread
    },
}
MACHINE = {"platform": "test", "machine": "x86_64", "processor": "", "cpu_count": 2, "jax_version": "-",
           "jax_backend": "cpu", "device_kind": "cpu"}  # fmt: skip


def conversation_system(policy: str) -> dict:
    """Tight device bytes and a host tier, so that states are offloaded, reloaded and dropped."""
    return {
        "max_requests": 1000,
        "max_new_tokens_cap": 64,
        "scheduling": {"max_active_requests": 8, "policy": policy},
        "kv_cache": {"device_kv_bytes": 600_000, "host_kv_bytes": 400_000},
        "transfer": {"link_bytes_per_us": 10_000, "link_latency_us": 5},
        "compute_service": {"compute_flops_per_us": 10**6, "memory_bytes_per_us": 10**5},
    }


@pytest.fixture(scope="module")
def document():
    model = AnalyticModel(layers=2, width=64, ffn=256, vocabulary=260, precision_bytes=4)
    return document_json(analytic_computations(model, conversations(120, seed=3), "test"))


def measured_run(system: dict, document: dict, service: dict, slots: int = 256) -> dict:
    """A measured-run document of what kvsim, run with `service` at `slots` slots, did: its events become the works.

    kvsim plays an engine with one serving thread: each work or transfer begins when the thread is
    free, a compute work after the step overhead, and a request that ends holds the thread for the
    service's finish time once its state is retained."""
    service = service | {"compute_service": service["compute_service"] | {"slot_capacity": slots}}
    config = parse_system(merge_service(system, service))
    record = record_value(simulate(config, parse_document(document)))
    specs = {r.request_id: r for r in parse_document(document).requests}
    outcomes = record["outcomes"]["requests"]
    overhead = service["compute_service"]["step_overhead_us"]
    steps = dict.fromkeys(specs, 0)
    events = record["events"]
    ends = {e["causes"][0]: e["time_us"] for e in events if e["kind"] in ("compute_end", "transfer_end")}
    works, batch, free = [], [], 0  # free: when the serving thread is next free
    for index, event in enumerate(events):
        if event["kind"] in ("retain", "retain_skip"):
            retained = event["bytes"] if event["kind"] == "retain" else 0
            free = max(free, event["time_us"]) + config.compute_service.finish_us(retained)
        elif event["kind"] == "compute_start":
            batch.append(event)
            if index + 1 < len(events) and events[index + 1]["kind"] == "compute_start":
                continue  # the rest of the batch starts with it
            end = ends[batch[0]["event_id"]]
            works.append(_compute_work(batch, specs, outcomes, steps, max(event["time_us"], free) + overhead, end))
            batch, free = [], end
        elif event["kind"] == "transfer_start":
            kind = "offload" if event["transfer_direction"] == "device_to_host" else "reload"
            end = ends[event["event_id"]]
            begin = max(event["time_us"], free)
            works.append(_work(kind, [event["request_id"]], 0, 0, 0, 0, 0, event["bytes"], begin, end))
            free = end
    return {
        "format": FORMAT,
        "version": 1,
        "model": document["model"],
        "kv_bytes_per_position": document["kv_bytes_per_position"],
        "execution": document["execution"],
        "machine": MACHINE,
        "system": system_json(parse_system(system)),
        "engine": {
            "prefill_window_buckets": WINDOWS,
            "decode_batch_buckets": BATCHES,
            "slot_capacity": slots,
            "slot_rows": 8,
            "transfers": "synchronous",
        },
        "workload": record["declaration"]["workload"],
        "customer_interaction": None,
        "computations": document,
        "works": sorted(works, key=lambda w: w["end_us"]),
        "requests": outcomes,
        "totals": record["outcomes"]["totals"],
    }


def _compute_work(batch, specs, outcomes, steps, start, end) -> dict:
    flops = memory = context = 0
    for event in batch:
        spec, step = specs[event["request_id"]], steps[event["request_id"]]
        if step == 0:
            f, b = spec.prefill_cost(outcomes[event["request_id"]]["reuse_positions"])
        else:
            f, b = spec.decode_flops[step - 1], spec.decode_bytes[step - 1]
            context += len(spec.prompt_ids) + step - 1  # the positions the row held before the step
        flops, memory = flops + f, memory + (b if not memory else b - spec.fixed_memory_bytes)
        steps[event["request_id"]] += 1
    head = batch[0]["request_id"]
    if batch[0]["phase"] == "prefill":
        positions = len(specs[head].prompt_ids) - outcomes[head]["reuse_positions"]
        window = next(w for w in WINDOWS if w >= positions)
        return _work("prefill", [head], 1, window, flops, memory, positions, 0, start, end)
    rows = next(b for b in BATCHES if b >= len(batch))
    ids = [e["request_id"] for e in batch]
    return _work("decode", ids, rows, 1, flops, memory, len(batch), 0, start, end, context)


def _work(kind, ids, rows, window, flops, memory, processed, size, start, end, reused=0) -> dict:
    return {"work_id": 0, "kind": kind, "request_ids": ids, "rows": len(ids), "executed_rows": rows, "window": window,
            "processed_positions": processed, "reused_positions": reused, "matmul_flops": flops,
            "logical_memory_bytes": memory, "bytes": size, "start_us": start, "end_us": end, "wall_us": end - start}  # fmt: skip


def test_nnls_meets_the_optimality_conditions():
    """Independent check (Karush-Kuhn-Tucker): x >= 0, the gradient vanishes where x > 0 and is >= 0 where x = 0."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = rng.normal(size=(30, 4)) * np.asarray([1.0, 10.0, 1e6, 1e-3])
        b = rng.normal(size=30) * 5
        x = nnls(a, b)
        gradient = (a.T @ (a @ x - b)) / np.abs(a).max(axis=0)  # per unit-sized column
        assert np.all(x >= 0)
        assert np.all(np.abs(gradient[x > 0]) <= 1e-6 * (1 + np.abs(b).sum()))
        assert np.all(gradient[x == 0] >= -1e-6 * (1 + np.abs(b).sum()))
    a = rng.uniform(1, 2, size=(20, 3))
    b = a @ np.asarray([3.0, 0.5, 2.0])  # an exact non-negative solution is found exactly
    assert np.allclose(nnls(a, b), [3.0, 0.5, 2.0], rtol=1e-9)


def test_calibrated_durations_round_up_exactly():
    compute = parse_system(merge_service(EXAMPLE["system"], TRUTH)).compute_service
    assert isinstance(compute, CalibratedComputeService)
    assert compute.prefill == WorkTerms(
        Fraction(400), Fraction(12), Fraction(3), Fraction(2, 10**6), Fraction(0), Fraction(250)
    )
    # 17 new positions run the 32-position window: 400 + 12*32 + 3*256 + 2e-6 * 1,000,001 = 1554.000002 -> 1555.
    assert compute.work_us("prefill", 17, 1, 1_000_001, 5, 0) == (30, 1555)
    assert compute.work_us("prefill", 17, 1, 1_000_001, 5, 1) == (30, 1555 + 250)  # woke an idle engine
    # 3 decoding rows run the 4-row bucket: 150 + 120 + 0.5*256 + 1e-4 * 10,005 = 399.0005 -> 400.
    assert compute.work_us("decode", 1, 3, 99, 10_005, 0) == (30, 400)
    assert compute.work_us("decode", 1, 1, 0, 0, 0) == (30, 150 + 128)  # one row: the fixed time
    assert compute.work_us("decode", 1, 9, 0, 0, 0) == (30, 150 + 280 + 128)  # beyond the largest bucket: 8 rows' time
    # With a least idle time, a shorter wait does not count as waking the engine.
    waking = parse_system(merge_service(EXAMPLE["system"], _with_idle_minimum(TRUTH, 5000))).compute_service
    assert [waking.work_us("prefill", 17, 1, 1_000_001, 5, idle)[1] for idle in (0, 4999, 5000)] == [1555, 1555, 1805]
    transfer = parse_system(merge_service(EXAMPLE["system"], TRUTH)).transfer
    assert transfer == CalibratedTransfer(LinkTerms(20, Fraction(1, 1000)), LinkTerms(35, Fraction(2, 1000)), True)
    assert transfer.transfer_us("device_to_host", 1500) == 22 and transfer.transfer_us("host_to_device", 1500) == 38


def test_a_roofline_system_is_written_as_before_and_calibrated_records_replay(document):
    before = system_json(parse_system(EXAMPLE["system"]))
    explicit = copy.deepcopy(EXAMPLE["system"])
    explicit["compute_service"]["model"] = explicit["transfer"]["model"] = "roofline"
    assert (
        system_json(parse_system(explicit))
        == before
        == EXAMPLE["system"] | {"scheduling": before["scheduling"], "kv_cache": before["kv_cache"]}
    )
    calibration = {"backend": {"compute_device": "cpu"}, "machine": MACHINE, "sources": ["ab"], "works": 3}
    system = merge_service(conversation_system("continuous_batching"), TRUTH | {"calibration": calibration})
    run = simulate(parse_system(system), parse_document(document))
    data = record_json(run)
    declared = json.loads(data)["declaration"]["system"]
    assert declared["compute_service"] == TRUTH["compute_service"] and declared["calibration"] == calibration
    assert record_json(rerun(json.loads(data))) == data


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda s: s["compute_service"].update(model="measured"), "system.compute_service.model"),
        (
            lambda s: s["compute_service"]["prefill"].pop("per_position_us"),
            "system.compute_service.prefill.per_position_us",
        ),
        (
            lambda s: s["compute_service"]["decode"].update(per_position_us=1),
            "system.compute_service.decode.per_position_us",
        ),
        (lambda s: s["compute_service"]["decode"].update(fixed_us=-1), "system.compute_service.decode.fixed_us"),
        (
            lambda s: s["compute_service"]["decode"].update(per_batch_us={"1": 5}),
            "system.compute_service.decode.per_batch_us.1",
        ),
        (
            lambda s: s["compute_service"]["decode"].update(per_batch_us={"4": 5, "2": 1}),
            "system.compute_service.decode.per_batch_us",
        ),
        (
            lambda s: s["compute_service"]["decode"].update(per_batch_us={"2": -1}),
            "system.compute_service.decode.per_batch_us.2",
        ),
        (
            lambda s: s["compute_service"].update(decode_batch_buckets=[1, 4, 2]),
            "system.compute_service.decode_batch_buckets",
        ),
        (
            lambda s: s["compute_service"].update(prefill_window_buckets=[]),
            "system.compute_service.prefill_window_buckets",
        ),
        (lambda s: s["compute_service"].update(slot_capacity=0), "system.compute_service.slot_capacity"),
        (
            lambda s: s["transfer"]["host_to_device"].update(per_byte_us="1"),
            "system.transfer.host_to_device.per_byte_us",
        ),
        (lambda s: s["transfer"].pop("device_to_host"), "system.transfer.device_to_host"),
        (lambda s: s.update(calibration={"backend": {}}), "system.calibration.machine"),
        (
            lambda s: s["compute_service"].update(finish={"fixed_us": -1, "per_byte_us": 0}),
            "system.compute_service.finish.fixed_us",
        ),
        (
            lambda s: s["compute_service"].update(finish={"fixed_us": 1, "per_byte_us": "0"}),
            "system.compute_service.finish.per_byte_us",
        ),
        (lambda s: s["compute_service"].update(finish={"fixed_us": 1}), "system.compute_service.finish.per_byte_us"),
        (
            lambda s: s["compute_service"].update(finish={"fixed_us": 1, "per_byte_us": 0, "per_us": 0}),
            "system.compute_service.finish.per_us",
        ),
        (lambda s: s["compute_service"].update(finish=[1, 0]), "system.compute_service.finish"),
        (
            lambda s: s["compute_service"].update(finish={"fixed_us": True, "per_byte_us": 0}),
            "system.compute_service.finish.fixed_us",
        ),
        (lambda s: s["compute_service"].update(spread=SPREAD | {"seed": -1}), "system.compute_service.spread.seed"),
        (lambda s: s["compute_service"].update(spread=SPREAD | {"seed": 0.5}), "system.compute_service.spread.seed"),
        (
            lambda s: s["compute_service"].update(spread={"seed": 0, "prefill": [1, 1]}),
            "system.compute_service.spread.decode",
        ),
        (
            lambda s: s["compute_service"].update(spread=SPREAD | {"prefill": [1]}),
            "system.compute_service.spread.prefill",
        ),
        (
            lambda s: s["compute_service"].update(spread=SPREAD | {"decode": [1.2, 0.9]}),
            "system.compute_service.spread.decode",
        ),
        (
            lambda s: s["compute_service"].update(spread=SPREAD | {"decode": [-1, 1]}),
            "system.compute_service.spread.decode[0]",
        ),
        (
            lambda s: s["compute_service"].update(spread=SPREAD | {"decode": [1, "2"]}),
            "system.compute_service.spread.decode[1]",
        ),
        (
            lambda s: s["compute_service"].update(spread=SPREAD | {"decode": [1] * 1002}),
            "system.compute_service.spread.decode",
        ),
        (
            lambda s: s["compute_service"].update(spread=SPREAD | {"transfer": [1, 1]}),
            "system.compute_service.spread.transfer",
        ),
    ],
)
def test_bad_calibrated_systems_are_refused_naming_the_field(change, field):
    system = copy.deepcopy(merge_service(EXAMPLE["system"], TRUTH))
    change(system)
    with pytest.raises(ApiError) as error:
        parse_system(system)
    assert error.value.field == field


@pytest.mark.parametrize("policy", ["serialized", "continuous_batching"])
def test_calibration_recovers_the_service_that_produced_the_works(document, policy):
    measured = measured_run(conversation_system(policy), document, TRUTH)
    run = read_measured_run(measured, "0" * 64)
    assert {w["kind"] for w in run.works} == {"prefill", "decode", "offload", "reload"}
    smaller = read_measured_run(measured_run(conversation_system(policy), document, TRUTH, slots=160), "1" * 64)
    fragment, fits, notes = fit([run, smaller])
    compute_minimum = fragment["compute_service"]["after_idle_min_us"]
    assert notes == [] and compute_minimum == 0
    assert fragment["calibration"]["sources"] == ["0" * 64, "1" * 64]
    # Works are whole microseconds (durations round up), so the fit is exact to about a microsecond.
    assert all(f.mean_error_us < 1.0 for f in fits), fits
    compute, truth = fragment["compute_service"], TRUTH["compute_service"]
    assert compute["step_overhead_us"] == pytest.approx(truth["step_overhead_us"], abs=0.01)
    assert compute["prefill"]["fixed_us"] == pytest.approx(truth["prefill"]["fixed_us"], abs=3)
    assert compute["prefill"]["after_idle_us"] == pytest.approx(truth["prefill"]["after_idle_us"], abs=3)
    assert compute["prefill"]["per_slot_us"] == pytest.approx(truth["prefill"]["per_slot_us"], abs=0.05)
    assert compute["decode"]["per_slot_us"] == pytest.approx(truth["decode"]["per_slot_us"], abs=0.05)
    # Calibrated on one slot capacity, the per-slot terms are not identifiable: the fit says so and leaves them 0.
    assert any("per_slot_us is 0" in note for note in fit([run])[2])
    # Serialized decode always runs one row, so there is no batch size to time; batched steps time each
    # batch size they ran.
    batches = compute["decode"]["per_batch_us"]
    if policy == "continuous_batching":
        assert batches and all(
            t == pytest.approx(truth["decode"]["per_batch_us"][rows], abs=1) for rows, t in batches.items()
        )
    else:
        assert batches == {}
    for direction in ("device_to_host", "host_to_device"):
        assert fragment["transfer"][direction]["per_byte_us"] == pytest.approx(
            TRUTH["transfer"][direction]["per_byte_us"], rel=0.01
        )
    # The fitted service predicts the run it was fitted on to within a percent; hit rates exactly.
    rows = compare(measured["totals"], predict(run, fragment).outcomes["totals"])
    for row in rows:
        if row.exact:
            assert row.measured == row.predicted, row
        else:
            assert abs(row.error) < 0.01, row
    # The system's own hypothetical rates predict another run altogether.
    hypothetical = compare(measured["totals"], predict(run, None).outcomes["totals"])
    assert max(abs(row.error) for row in hypothetical if row.error is not None) > 0.5


# The engine's host time after a request ends (measured ~0.7-1 ms per finish on two cores), with values the
# fit must recover.
WITH_FINISH = TRUTH | {
    "compute_service": TRUTH["compute_service"] | {"finish": {"fixed_us": 700, "per_byte_us": 0.0005}}
}  # fmt: skip


def test_the_finish_time_holds_the_serving_thread_and_busies_no_compute(document):
    """A finish delays what the serving thread runs next; zero terms, like no terms, change nothing."""
    system = conversation_system("serialized") | {"scheduling": {"max_active_requests": 1, "policy": "serialized"},
                                                  "kv_cache": {"device_kv_bytes": 10**9, "host_kv_bytes": 0}}  # fmt: skip
    compute = parse_system(merge_service(system, WITH_FINISH)).compute_service
    assert compute.finish_us(0) == 700 and compute.finish_us(1001) == 701  # 700 + 0.5005, rounded up
    assert compute_service_json(compute)["finish"] == {"fixed_us": 700, "per_byte_us": 0.0005}
    assert "finish" not in compute_service_json(parse_system(merge_service(system, TRUTH)).compute_service)
    base = record_value(simulate(parse_system(merge_service(system, TRUTH)), parse_document(document)))
    finish_only = copy.deepcopy(TRUTH)
    finish_only["compute_service"]["finish"] = {"fixed_us": 700, "per_byte_us": 0}
    held = record_value(simulate(parse_system(merge_service(system, finish_only)), parse_document(document)))
    assert held["outcomes"]["totals"]["compute_busy_us"] == base["outcomes"]["totals"]["compute_busy_us"]
    assert held["outcomes"]["totals"]["end_us"] > base["outcomes"]["totals"]["end_us"]
    # A request admitted when the one before it ended (one at a time) ends its prefill 700 us later than
    # without the finish time: after it, the step overhead and the prefill itself.
    specs, held_compute = {r.request_id: r for r in parse_document(document).requests}, parse_system(
        merge_service(system, finish_only)).compute_service  # fmt: skip
    by_id, waits = {e["event_id"]: e for e in held["events"]}, []
    for admit in (e for e in held["events"] if e["kind"] == "admit" and len(e["causes"]) == 2):
        if by_id[admit["causes"][1]]["kind"] != "release":
            continue
        spec, outcome = specs[admit["request_id"]], held["outcomes"]["requests"][admit["request_id"]]
        reused = outcome["reuse_positions"]
        overhead, prefill = held_compute.work_us(
            "prefill", len(spec.prompt_ids) - reused, 1, *spec.prefill_cost(reused), 0
        )
        first_token = outcome["first_token_us"]
        waits.append(first_token - admit["time_us"] - (700 + overhead + prefill))
    assert len(waits) > 10 and set(waits) == {0}
    zero = copy.deepcopy(TRUTH)
    zero["compute_service"]["finish"] = {"fixed_us": 0, "per_byte_us": 0}
    same = record_value(simulate(parse_system(merge_service(system, zero)), parse_document(document)))
    assert same["events"] == base["events"] and same["outcomes"] == base["outcomes"]  # zero terms change nothing


@pytest.mark.parametrize("policy", ["serialized", "continuous_batching"])
def test_calibration_recovers_the_finish_term(document, policy):
    measured = read_measured_run(measured_run(conversation_system(policy), document, WITH_FINISH), "0" * 64)
    smaller = read_measured_run(measured_run(conversation_system(policy), document, WITH_FINISH, slots=160), "1" * 64)
    fragment, fits, _ = fit([measured, smaller])
    compute, truth = fragment["compute_service"], WITH_FINISH["compute_service"]
    assert compute["finish"]["fixed_us"] == pytest.approx(700, abs=3)
    assert compute["finish"]["per_byte_us"] == pytest.approx(0.0005, rel=0.05)
    assert compute["step_overhead_us"] == pytest.approx(truth["step_overhead_us"], abs=2)
    host = next(f for f in fits if f.kind == "host")
    assert host.mean_error_us < 1.0 and {"finishes 0", "finishes 1"} <= set(host.residuals)
    # Residuals per shape: every shape the works ran, each about 0 (the service made the works).
    decode = next(f for f in fits if f.kind == "decode")
    assert {"capacity 160", "capacity 256", "slot rows 8", "rows 1", "position 64"} <= set(decode.residuals)
    assert all(abs(mean) < 0.01 for _, mean in decode.residuals.values()), decode.residuals
    rows = compare(measured.document["totals"], predict(measured, fragment).outcomes["totals"])
    assert all(row.measured == row.predicted if row.exact else abs(row.error) < 0.01 for row in rows), rows
    # Fitted without the term (the model before it): the fragment has none, and predicts worse.
    before, _, _ = fit([measured, smaller], optional=())
    assert "finish" not in before["compute_service"]
    # A replay refits with the terms the recorded fragment holds, and gets it back.
    assert fitted_terms(fragment) == ("finish", "spread", "after_other") and fitted_terms(before) == ()
    assert fit([measured, smaller], fitted_terms(before))[0] == before
    worse = compare(measured.document["totals"], predict(measured, before).outcomes["totals"])
    assert max(abs(r.error) for r in worse if r.error is not None) > max(
        abs(r.error) for r in rows if r.error is not None
    )


# A per-work spread with a known distribution: each work's mean time times a multiplier uniform on [0.8, 1.2].
SPREAD = {"seed": 7, "prefill": [0.8, 1.2], "decode": [0.8, 1.2]}
WITH_SPREAD = TRUTH | {"compute_service": TRUTH["compute_service"] | {"spread": SPREAD}}


AFTER_OTHER_TRUTH = WITH_FINISH | {
    "compute_service": WITH_FINISH["compute_service"]
    | {"prefill": WITH_FINISH["compute_service"]["prefill"] | {"after_other_us": 60},
       "decode": WITH_FINISH["compute_service"]["decode"] | {"after_other_us": 90},
       "finish": {"fixed_us": 500, "per_byte_us": 0.0005, "per_slot_us": 1.5}}
}  # fmt: skip


def test_a_work_after_another_kind_of_work_and_a_finish_per_slot_are_charged_exactly():
    """after_other_us is added when the serving thread last started another kind of work or a transfer; a
    finish's per-slot term is charged for the engine's slot capacity; both are written only when given."""
    compute = parse_system(merge_service(EXAMPLE["system"], AFTER_OTHER_TRUTH)).compute_service
    alone = compute.work_us("decode", 1, 1, 0, 0, 0)[1]
    assert alone == 150 + 128  # nothing started before it (the first work of a run)
    assert compute.work_us("decode", 1, 1, 0, 0, 0, 0, "decode")[1] == alone
    assert compute.work_us("decode", 1, 1, 0, 0, 0, 0, "prefill")[1] == alone + 90
    assert compute.work_us("decode", 1, 1, 0, 0, 0, 0, "transfer")[1] == alone + 90
    assert compute.work_us("prefill", 17, 1, 1_000_001, 5, 0, 0, "decode")[1] == 1555 + 60
    assert compute.work_us("prefill", 17, 1, 1_000_001, 5, 1, 0, "transfer")[1] == 1555 + 250 + 60  # both apply
    assert compute.finish_us(1001) == 500 + 1 + 384  # 500 + 0.5005 + 1.5 * 256, rounded up
    written = compute_service_json(compute)
    assert written["decode"]["after_other_us"] == 90 and written["finish"]["per_slot_us"] == 1.5
    assert parse_system(merge_service(EXAMPLE["system"], {"compute_service": written})).compute_service == compute
    before = compute_service_json(parse_system(merge_service(EXAMPLE["system"], WITH_FINISH)).compute_service)
    assert "after_other_us" not in before["decode"] and "per_slot_us" not in before["finish"]


@pytest.mark.parametrize("policy", ["serialized", "continuous_batching"])
def test_calibration_recovers_the_work_after_another_and_the_finish_per_slot(document, policy):
    """Works made by a service with both terms, at two slot capacities: the fit recovers them and predicts
    the runs' latencies within 1%; fitted without them, the fragment predicts worse."""
    runs = [read_measured_run(measured_run(conversation_system(policy), document, AFTER_OTHER_TRUTH, slots), sha)
            for slots, sha in ((256, "0" * 64), (160, "1" * 64))]  # fmt: skip
    fragment, _, _ = fit(runs)
    compute = fragment["compute_service"]
    assert compute["decode"]["after_other_us"] == pytest.approx(90, abs=3)
    assert compute["prefill"]["after_other_us"] == pytest.approx(60, abs=5)
    assert compute["finish"]["per_slot_us"] == pytest.approx(1.5, abs=0.05)
    assert compute["finish"]["fixed_us"] == pytest.approx(500, abs=10)
    rows = compare(runs[0].document["totals"], predict(runs[0], fragment).outcomes["totals"])
    assert all(row.measured == row.predicted if row.exact else abs(row.error) < 0.01 for row in rows), rows
    before, _, _ = fit(runs, ("finish", "spread"))
    assert "after_other_us" not in before["compute_service"]["decode"]
    worse = compare(runs[0].document["totals"], predict(runs[0], before).outcomes["totals"])
    assert max(abs(r.error) for r in worse if r.error is not None) > max(
        abs(r.error) for r in rows if r.error is not None
    )


def test_a_spread_draws_each_work_from_its_quantiles_and_replays_byte_for_byte(document):
    system = merge_service(conversation_system("continuous_batching"), WITH_SPREAD)
    compute = parse_system(system).compute_service
    # A 32-position prefill's mean time is 400 + 12*32 + 3*256 = 1552 us; the multipliers of many works are
    # uniform on [0.8, 1.2]: mean 1, a tenth of them within each tenth of the range.
    times = np.asarray([compute.work_us("prefill", 17, 1, 0, 0, 0, work)[1] for work in range(4000)]) / 1552
    assert 0.8 <= times.min() and times.max() <= 1.2 + 1 / 1552 and abs(times.mean() - 1) < 0.01
    assert np.all(np.abs(np.histogram(times, bins=10, range=(0.8, 1.2 + 1 / 1552))[0] / 4000 - 0.1) < 0.025)
    # One seed is one run: the record replays byte for byte; another seed draws other times.
    run = record_json(simulate(parse_system(system), parse_document(document)))
    declared = json.loads(run)["declaration"]["system"]["compute_service"]
    assert declared["spread"] == SPREAD and record_json(rerun(json.loads(run))) == run
    reseeded = merge_service(
        system, {"compute_service": WITH_SPREAD["compute_service"] | {"spread": SPREAD | {"seed": 8}}}
    )
    assert (
        json.loads(record_json(simulate(parse_system(reseeded), parse_document(document))))["events"]
        != json.loads(run)["events"]
    )
    # A spread of a single point, 1, is no spread: the same events and outcomes as the mean times alone.
    ones = {"compute_service": TRUTH["compute_service"] | {"spread": {"seed": 7, "prefill": [1, 1], "decode": [1, 1]}}}
    same, base = (record_value(simulate(parse_system(merge_service(system, service)), parse_document(document)))
                  for service in (ones, TRUTH))  # fmt: skip
    assert same["events"] == base["events"] and same["outcomes"] == base["outcomes"]


@pytest.mark.parametrize("policy", ["serialized", "continuous_batching"])
def test_calibration_recovers_a_known_spread(document, policy):
    """Works made with the uniform spread: the fit's terms are the means, its spread the uniform quantiles."""
    runs = [read_measured_run(measured_run(conversation_system(policy), document, WITH_SPREAD, slots), f"{slots:064d}")
            for slots in (256, 160)]  # fmt: skip
    fragment, fits, _ = fit(runs)
    compute = fragment["compute_service"]
    probabilities = np.linspace(SPREAD_TAIL, 1 - SPREAD_TAIL, SPREAD_POINTS)
    for kind in ("prefill", "decode"):
        quantiles = np.asarray(compute["spread"][kind], dtype=float)
        assert len(quantiles) == SPREAD_POINTS and np.all(np.diff(quantiles) >= 0)
        assert np.max(np.abs(quantiles - (0.8 + 0.4 * probabilities))) < 0.05, (kind, quantiles)
        assert np.mean((quantiles[1:] + quantiles[:-1]) / 2) == pytest.approx(1, abs=1e-5)  # mean 1 by construction
    assert compute["spread"]["seed"] == 0
    # Without the spread every work takes its mean: the works' spread shows as the fit's error, which the
    # uniform multiplier puts at about a tenth of a work's time on average.
    prefill = next(f for f in fits if f.kind == "prefill")
    assert 0.07 < prefill.mean_relative_error < 0.13


def test_a_prediction_with_a_spread_is_the_median_over_seeds(document):
    system = conversation_system("serialized") | {"kv_cache": {"device_kv_bytes": 10**9, "host_kv_bytes": 0}}
    run = read_measured_run(measured_run(system, document, WITH_SPREAD), "0" * 64)
    totals = [predict(run, WITH_SPREAD | {"compute_service": WITH_SPREAD["compute_service"] | {"spread": SPREAD | {"seed": seed}}})
              .outcomes["totals"] for seed in range(7, 10)]  # fmt: skip
    predicted = predicted_totals(run, WITH_SPREAD, repeats=3)
    for name in ("ttft", "tpot", "e2e"):
        values = [t["latency_us"][name]["p90"] for t in totals]
        assert len(set(values)) > 1 and predicted["latency_us"][name]["p90"] == sorted(values)[1]
    assert predicted["token_hit_rate"] == totals[0]["token_hit_rate"]
    measured = run.document["totals"]  # without a spread, one simulation: its own figures
    assert compare(measured, predicted_totals(run, TRUTH)) == compare(measured, predict(run, TRUTH).outcomes["totals"])


def test_the_noise_band_is_how_far_the_median_of_n_runs_strays():
    """noise_band resamples the measured runs; checked against medians of runs drawn afresh from the
    distribution they came from (log-normal, sigma 0.2: a figure's spread between engine runs), within 15%."""
    rng = np.random.default_rng(1)
    measured = np.exp(0.2 * rng.standard_normal(3000))
    for repeats in (1, 5, 15):
        fresh = np.median(np.exp(0.2 * rng.standard_normal((20000, repeats))), axis=1)
        reference = float(np.quantile(np.abs(fresh - 1), 0.9))  # the distribution's median is exactly 1
        assert noise_band(measured, repeats) == pytest.approx(reference, rel=0.15)
    assert noise_band(measured[:15], 45) < noise_band(measured[:15], 15) < noise_band(measured[:15], 5)
    assert noise_band([7.0] * 5) == 0 and noise_band(measured[:9]) == noise_band(list(measured[:9]))


def test_predict_reports_the_median_over_seeds_and_writes_one_seeds_run(document, tmp_path, capsys):
    """`jgpt kvsim predict` predicts what the bench predicts: each figure's median over --seeds simulated runs
    (default 5); the record it writes is the run of the spread's own seed, and replays byte for byte."""
    system = conversation_system("serialized") | {"kv_cache": {"device_kv_bytes": 10**9, "host_kv_bytes": 0}}
    measured = measured_run(system, document, WITH_SPREAD)
    run = read_measured_run(measured, "0" * 64)
    paths = {name: tmp_path / f"{name}.json" for name in ("measured", "service", "record")}
    paths["measured"].write_text(json.dumps(measured))
    paths["service"].write_text(json.dumps(WITH_SPREAD))
    common = ("predict", str(paths["measured"]), "--service", str(paths["service"]))
    code, out, _ = run_cli(capsys, *common, "--seeds", "3", "--json", "--out", str(paths["record"]))
    expected = compare(run.document["totals"], predicted_totals(run, WITH_SPREAD, repeats=3))
    assert code == 0 and json.loads(out) == [row.to_json() for row in expected]
    one = compare(run.document["totals"], predict(run, WITH_SPREAD).outcomes["totals"])
    assert [row.predicted for row in expected] != [row.predicted for row in one]  # the median is not one seed's run
    record = paths["record"].read_bytes()
    assert record == record_json(predict(run, WITH_SPREAD)) and record_json(rerun(json.loads(record))) == record
    assert json.loads(record)["declaration"]["system"]["compute_service"]["spread"]["seed"] == SPREAD["seed"]
    streamed = tmp_path / "record.jsonl"  # the same run, streamed: it replays line by line
    code, out, _ = run_cli(capsys, *common, "--out", str(streamed))
    assert code == 0 and "median over 5 simulated runs, spread seeds 7-11" in out.splitlines()[0]
    assert out.splitlines()[-1] == f"record written to {streamed}: one simulated run, spread seed 7"
    assert run_cli(capsys, "replay", str(streamed))[0] == 0
    code, out, _ = run_cli(capsys, *common[:2], "--seeds", "3")  # the run's own rates: no spread, one run
    assert code == 0 and "own rates; one simulated run" in out.splitlines()[0]
    code, _, err = run_cli(capsys, *common, "--seeds", "0")
    assert code == 2 and "--seeds: must be at least 1" in err and len(err.strip().splitlines()) == 1


def _with_idle_minimum(service: dict, minimum: int) -> dict:
    return service | {"compute_service": service["compute_service"] | {"after_idle_min_us": minimum}}


def test_calibration_finds_how_long_an_engine_must_idle_to_run_cold(document):
    """Only works after idle stretches of at least the truth's minimum pay the penalty; a fit that counts
    every idle work (minimum 0, the only choice before) errs more than the fit with a found minimum."""
    system = conversation_system("serialized") | {"kv_cache": {"device_kv_bytes": 10**9, "host_kv_bytes": 0}}
    spread = {**document, "requests": [r | {"arrival_us": 40 * r["arrival_us"]} for r in document["requests"]]}
    measured = read_measured_run(measured_run(system, spread, _with_idle_minimum(TRUTH, 20_000)), "0" * 64)
    idle = [i for i, w in zip(idle_us(measured), measured.works) if w["kind"] == "prefill" and i > 0]
    assert sum(i >= 20_000 for i in idle) > 5 and sum(i < 20_000 for i in idle) > 5  # both kinds of wait occur
    fragment, fits, _ = fit([measured])
    minimum = fragment["compute_service"]["after_idle_min_us"]
    assert minimum > 0 and not [i for i in idle if (i >= minimum) != (i >= 20_000)]  # the same works count as cold
    assert fragment["compute_service"]["prefill"]["after_idle_us"] == pytest.approx(250, abs=3)
    assert all(f.mean_error_us < 1.0 for f in fits[:2]), fits


def test_step_overhead_is_the_host_time_before_compute_works_and_waking_an_idle_engine_is_marked():
    def work(kind, request, start, end):
        return _work(kind, [request], 1, 16, 0, 0, 1, 0, start, end)

    works = [work("prefill", "a", 0, 100), work("decode", "a", 150, 200), work("offload", "a", 220, 250),
             work("decode", "a", 300, 400), work("decode", "a", 470, 500), work("prefill", "b", 5000, 5100)]  # fmt: skip
    # Idle from 500 until b arrives at 4990; the offload's 20 us before it are the transfer's, not compute's.
    requests = {"a": {"arrival_us": 0, "prompt_positions": 10, "selected_tokens": 3},
                "b": {"arrival_us": 4990, "prompt_positions": 5, "selected_tokens": 1}}  # fmt: skip
    run = type("Run", (), {"document": {"requests": requests}, "works": works, "retained_bytes_per_position": 100})
    assert host_gaps(run) == [0, 50, 20, 50, 70, 10]
    assert idle_us(run) == [
        1,
        0,
        0,
        0,
        0,
        4490,
    ]  # a's prefill and b's woke the engine (idle since before 0, and 4490 us)
    assert step_overhead_us([run]) == (0 + 50 + 50 + 70 + 10) / 5
    # a ends with its last decode and retains 10 + 3 - 1 positions, b with its prefill (5 positions).
    assert finishes(run) == [(0, 0)] * 4 + [(1, 1200), (1, 500)]
    # The finish fit's samples: compute works right after compute works, not after an idle stretch that
    # followed a finish (b's prefill): the two decode steps, 50 and 70 us after one, nothing ended before.
    host = host_fit([run])
    assert host.count == 2 and host.terms == {"step_overhead_us": 60, "finish.fixed_us": 0, "finish.per_byte_us": 0}


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = cli.main(["kvsim", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_calibrate_and_predict_commands(document, tmp_path, capsys):
    calibration_run = tmp_path / "calibration.json"
    calibration_run.write_text(json.dumps(measured_run(conversation_system("continuous_batching"), document, TRUTH)))
    other = tmp_path / "other.json"
    other_system = conversation_system("serialized") | {"kv_cache": {"device_kv_bytes": 10**9, "host_kv_bytes": 0}}
    other.write_text(json.dumps(measured_run(other_system, document, TRUTH)))
    service = tmp_path / "service.json"
    code, out, _ = run_cli(capsys, "calibrate", str(calibration_run), "--out", str(service))
    assert code == 0 and service.exists()
    assert [line.split()[0] for line in out.splitlines()[1:5]] == ["prefill", "decode", "offload", "reload"]
    fragment = json.loads(service.read_text())
    assert set(fragment) == {"compute_service", "transfer", "calibration"}
    assert fragment["calibration"]["machine"] == MACHINE and fragment["calibration"]["works"] > 100
    assert {"finish", "spread"} <= set(fragment["compute_service"]) and "after_other_us" in fragment["compute_service"][
        "decode"
    ]
    # --without leaves a term out: the fit of the model without it.
    lean = tmp_path / "lean.json"
    code, _, _ = run_cli(capsys, "calibrate", str(calibration_run), "--out", str(lean), "--without", "finish",
                         "--without", "after_other")  # fmt: skip
    compute = json.loads(lean.read_text())["compute_service"]
    assert code == 0 and "finish" not in compute and "spread" in compute and "after_other_us" not in compute["decode"]
    code, out, _ = run_cli(capsys, "predict", str(other), "--service", str(service), "--json")
    rows = {row["field"]: row for row in json.loads(out)}
    assert (
        code == 0
        and abs(rows["e2e.p90"]["error"]) < 0.01
        and rows["hit_rate_device"]["measured"] == rows["hit_rate_device"]["predicted"]
    )
    code, out, _ = run_cli(capsys, "predict", str(other))
    assert code == 0 and "own rates" in out.splitlines()[0] and "ttft.p50" in out
    # Bad input: exit 2, one line naming the field, nothing written.
    not_measured = tmp_path / "bad.json"
    not_measured.write_text(json.dumps({"format": "jgpt-recorded-computations"}))
    code, _, err = run_cli(capsys, "calibrate", str(not_measured), "--out", str(tmp_path / "s2.json"))
    assert code == 2 and "MEASURED[0]" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s2.json").exists()
    service.write_text(json.dumps({"compute_service": {"model": "calibrated"}}))
    code, _, err = run_cli(capsys, "predict", str(other), "--service", str(service))
    assert code == 2 and "system.compute_service.after_idle_min_us: missing required field" in err


@pytest.mark.parametrize("blocks", [False, True])
def test_a_link_that_blocks_compute_runs_works_and_transfers_one_at_a_time(document, blocks):
    """An engine that copies states on its serving thread: each work or transfer runs once the thread is free."""
    service = copy.deepcopy(TRUTH)
    service["transfer"]["blocks_compute"] = blocks
    system = parse_system(merge_service(conversation_system("continuous_batching"), service))
    record = record_value(simulate(system, parse_document(document)))
    events = record["events"]
    ends = {e["causes"][0]: e["time_us"] for e in events if e["kind"] in ("compute_end", "transfer_end")}
    started = [e for e in events if e["kind"] == "transfer_start" or (e["kind"] == "compute_start" and
               e["event_id"] in ends)]  # one start per batch: the one its compute_end names  # fmt: skip
    finishes = [ends[e["event_id"]] for e in started]
    one_thread = all(a <= b for a, b in zip(finishes, finishes[1:]))
    assert one_thread == blocks and sum(e["kind"] == "transfer_start" for e in started) > 10
    if blocks:  # a transfer takes its own duration once the thread is free
        for before, (event, end) in zip(finishes, zip(started[1:], finishes[1:])):
            if event["kind"] == "transfer_start":
                begin = max(event["time_us"], before)
                assert end - begin == system.transfer.transfer_us(event["transfer_direction"], event["bytes"])
    assert record["declaration"]["system"]["transfer"]["blocks_compute"] is blocks


@pytest.fixture(scope="module")
def small_measured(tmp_path_factory):
    """A small measured run and its fitted fragment, as files (for the hostile-input checks)."""
    model = AnalyticModel(layers=2, width=64, ffn=256, vocabulary=260, precision_bytes=4)
    document = document_json(analytic_computations(model, conversations(12, seed=5), "test"))
    measured = measured_run(conversation_system("continuous_batching"), document, TRUTH)
    fragment, _, _ = fit([read_measured_run(measured, "0" * 64)])
    directory = tmp_path_factory.mktemp("measured")
    (directory / "measured.json").write_text(json.dumps(measured))
    (directory / "service.json").write_text(json.dumps(fragment))
    return measured, fragment, directory


@FUZZ
@given(data=st.data())
def test_hostile_measured_runs_and_fragments_are_accepted_or_refused_cleanly(small_measured, tmp_path, data):
    measured, fragment, directory = small_measured
    which = data.draw(st.sampled_from(["measured", "service"]))
    bad = tmp_path / f"{which}.json"
    bad.write_bytes(data.draw(mutated_json(measured if which == "measured" else fragment)))
    others = {"measured": directory / "measured.json", "service": directory / "service.json"} | {which: bad}
    inputs = list(others.values())
    assert_clean(["kvsim", "predict", others["measured"], "--service", others["service"]], inputs=inputs)
    if which == "measured":
        out = tmp_path / "out" / "fragment.json"
        out.parent.mkdir(exist_ok=True)
        assert_clean(["kvsim", "calibrate", bad, "--out", out], inputs=inputs, watch=[out.parent])


def test_a_work_for_no_request_is_refused_naming_it(small_measured, tmp_path):
    """Found by the fuzz test above in CI: a work with empty request_ids reached the fit (max() of nothing)."""
    measured, _, _ = small_measured
    bad = json.loads(json.dumps(measured))
    bad["works"][0]["request_ids"] = []
    with pytest.raises(ApiError) as error:
        read_measured_run(bad, "0" * 64)
    assert error.value.field.endswith("works[0].request_ids"), error.value
    (tmp_path / "measured.json").write_text(json.dumps(bad))
    assert_refused(
        ["kvsim", "calibrate", tmp_path / "measured.json", "--out", tmp_path / "out.json"],
        inputs=[tmp_path / "measured.json"],
        watch=[tmp_path],
        field="works[0].request_ids",
    )
