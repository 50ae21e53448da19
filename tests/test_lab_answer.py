"""Each lab declares how its question is answered; the answer is computed from a record's arms and rows.

No model runs here: a record is assembled from a built-in lab's arms (resolved over the generation
defaults, as `jgpt lab run` resolves them) and summary rows written out by hand, so every expected
figure below is worked out from the rows, not by the code under test. The arms figure's labels are
checked for overlap by their drawn bounding boxes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.experiment_design import ExperimentDesign, default_catalog
from experiments.generation_defaults import generation_defaults
from experiments.lab_answer import computed_answer
from experiments.report_figures import arms_figure, overlapping_labels
from experiments.report_tables import arms_table, html_table, same_in_every_arm
from jgpt.foundation.errors import ApiError
from jgpt.foundation.units import byte_rate, duration_us, flop_count, flop_rate, percent

CATALOG = default_catalog()


def record_of(lab_id: str, rows: list[dict]) -> dict:
    lab = CATALOG.lab(lab_id)
    defaults = generation_defaults().execution
    arms = [{"label": a.label, "execution": a.execution.over(defaults).to_json()} for a in lab.arms()]
    return {"lab": lab.to_json(), "arms": arms, "rows": [{"label": a["label"]} | r for a, r in zip(arms, rows)]}


def answer_of(lab_id: str, rows: list[dict], fidelity=None) -> dict:
    record = record_of(lab_id, rows)
    return computed_answer(record, record["rows"], fidelity)


def test_every_built_in_lab_declares_an_answer():
    assert all(lab.answer is not None for lab in CATALOG.experiments)
    assert {lab.answer["kind"] for lab in CATALOG.experiments} == {
        "crossover",
        "saturation",
        "trend",
        "comparison",
        "best",
        "fidelity",
    }


def test_the_crossover_is_bracketed_by_two_arms_and_interpolated_on_a_log_scale():
    # arms: host 0 x link 30/300/3000, then host 16 MiB x link 30/300/3000 (the lab's sweep order)
    ttft = [5078, 5078, 5078, 33876, 5372, 4114]
    answer = answer_of("host-tier-vs-recompute", [{"ttft_p50_us": t} for t in ttft])
    (flip,) = answer["flips"]
    assert flip["between"] == [300, 3000] and flip["to"] == "the host tier"
    # margin (baseline - candidate): -294 at 300, +964 at 3000; zero at 10**(log10 300 + 294/1258)
    assert flip["estimate"] == pytest.approx(10 ** (math.log10(300) + 294 / 1258), rel=1e-9)
    assert "below about 514 MB/s of link bandwidth" in answer["text"]
    assert "between the arms at 300 MB/s and 3.00 GB/s" in answer["text"]
    rows = answer["table"]["rows"]
    assert [r[3]["text"] for r in rows] == ["recompute", "recompute", "the host tier"]
    assert rows[0][1] == {"text": "33.9 ms", "exact": 33876}  # human text, exact value kept


def test_no_crossover_is_said_when_one_side_always_wins():
    answer = answer_of("host-tier-vs-recompute", [{"ttft_p50_us": t} for t in [10, 10, 10, 5, 5, 5]])
    assert answer["flips"] == [] and answer["text"].startswith("The host tier wins by TTFT p50 at every")


def test_saturation_finds_the_first_value_from_which_steps_stay_within_tolerance():
    tpot = [19527.75, 1828.5, 1009.0, 963.0]  # the lab's evidence: -90.6%, -44.8%, -4.6%
    answer = answer_of("decode-compute-vs-memory-bound", [{"tpot_p50_us": t} for t in tpot])
    assert answer["knee"] == 100000
    assert "from memory bandwidth 100 GB/s on" in answer["text"]
    assert "compute rate / memory bandwidth = 1 (100 GFLOP/s over 100 GB/s)" in answer["text"]
    flat = answer_of("decode-compute-vs-memory-bound", [{"tpot_p50_us": t} for t in [100, 50, 25, 12]])
    assert flat["knee"] is None and "does not settle" in flat["text"]


def test_comparison_ratios_and_best_arm():
    rows = [{"e2e_p50_us": 11101, "e2e_p90_us": 15128, "tpot_p50_us": 3281.25, "compute_busy_us": 15128}]
    rows.append({"e2e_p50_us": 6343, "e2e_p90_us": 7321, "tpot_p50_us": 1227.0, "compute_busy_us": 7321})
    answer = answer_of("serialized-vs-continuous-batching", rows)
    assert answer["ratios"]["e2e_p90_us"] == pytest.approx(7321 / 15128)
    assert "e2e p90 7.32 ms against 15.1 ms (0.48x)" in answer["text"]
    lab = CATALOG.lab("speculative-k-sweep")
    rates = [100.0] + [90.0 - i for i in range(len(lab.arms()) - 1)]
    rows = [{"decode_tokens_per_s": r, "same_ids_as_greedy": True} for r in rates]
    answer = answer_of("speculative-k-sweep", rows)
    assert answer["text"].startswith("No arm beats greedy (100.0 tok/s) by decode tok/s: the best other")
    assert "(0.90x greedy's)" in answer["text"] and "greedy's ids: yes in every arm" in answer["text"]
    rows[3]["decode_tokens_per_s"], rows[5]["same_ids_as_greedy"] = 120.0, False
    answer = answer_of("speculative-k-sweep", rows)
    assert answer["best"] == lab.arms()[3].label and answer["better_than_baseline"] == 1
    assert "greedy's ids: no in " in answer["text"]


def test_fidelity_counts_latencies_within_tolerance_and_exact_hit_rates():
    lab = CATALOG.lab("kvsim-fidelity")
    labels = [a.label for a in lab.arms()]
    rows = [
        {"field": "ttft.p50", "measured": 100, "predicted": 109, "exact": False, "error": 0.09},
        {"field": "e2e.p90", "measured": 100, "predicted": 80, "exact": False, "error": -0.2},
        {"field": "token_hit_rate", "measured": 0.5, "predicted": 0.5, "exact": True, "error": None},
        {"field": "compute_busy_us", "measured": 100, "predicted": 300, "exact": False, "error": 2.0},
    ]
    pairs = [{"measured": labels[0], "predicted": labels[1], "service": "calibrated", "rows": rows}]
    pairs.append({"measured": labels[0], "predicted": labels[2], "service": "roofline", "rows": rows[:1]})
    answer = answer_of("kvsim-fidelity", [{} for _ in labels], pairs)
    assert answer["verdict"] == "no" and (answer["within"], answer["of"]) == (1, 2)  # busy time is not a latency
    assert "the farthest is e2e.p90 of" in answer["text"] and "-20.0%" in answer["text"]


def test_trend_lists_every_value_in_sweep_order():
    rows = [
        {"token_hit_rate": h, "ttft_p50_us": 4000, "e2e_p90_us": 1, "compute_busy_us": 1}
        for h in (0, 0.078, 0.59, 0.59)
    ]
    answer = answer_of("device-budget-sweep", rows)
    assert "512 KiB -> 1.00 MiB -> 2.00 MiB -> 4.00 MiB" in answer["text"]
    assert "token hits 0.0% -> 7.8% -> 59.0% -> 59.0%" in answer["text"]


def _lab(edit) -> dict:
    document = json.loads(json.dumps(CATALOG.lab("host-tier-vs-recompute").to_json()))
    edit(document["answer"])
    return document


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda a: a.update(kind="guess"), "answer.kind"),
        (lambda a: a.update(metric="decode_tokens_per_s"), "answer.metric"),
        (lambda a: a.update(metric="nonsense"), "answer.metric"),
        (lambda a: a.update(sweep="no.such.control"), "answer.sweep"),
        (lambda a: a.update(sweep="scheduling.policy"), "answer.sweep"),
        (lambda a: a["candidate"]["arms"].update({"kv_cache.host_kv_bytes": 7}), "answer.candidate.arms"),
        (
            lambda a: a["baseline"]["arms"].update({"kv_cache.host_kv_bytes": -1}),
            "answer.baseline.arms.kv_cache.host_kv_bytes",
        ),
        (lambda a: a.pop("baseline"), "answer.baseline"),
        (lambda a: a.update(better="sideways"), "answer.better"),
    ],
)
def test_a_bad_answer_is_refused_naming_the_field(edit, field):
    with pytest.raises(ApiError) as caught:
        ExperimentDesign.from_json(_lab(edit))
    assert caught.value.field == field


def test_a_planned_lab_may_name_its_missing_controls():
    planned = CATALOG.lab("prefill-decode-disaggregation")
    assert planned.answer["candidate"]["arms"] == {"resource_graph.placement": "disaggregated"}
    document = planned.to_json()
    document["answer"]["candidate"]["arms"] = {"resource_graph.nothing": 1}
    with pytest.raises(ApiError) as caught:
        ExperimentDesign.from_json(document)
    assert caught.value.field == "answer.candidate.arms.resource_graph.nothing"


def test_the_arms_table_is_in_human_units_with_exact_titles_and_escaped():
    rows = [{"ttft_p50_us": 895.5 + i, "bytes_host_to_device": 2146304 * i, "completed": 18} for i in range(6)]
    record = record_of("host-tier-vs-recompute", rows)
    record["arms"][0]["label"] = '<script>"x"</script>'
    table = arms_table(record, {"arms": record["rows"]})
    assert table["columns"] == ["arm", "TTFT p50", "host->device"]  # completed is the same in every arm
    assert table["same"] == [[{"text": "completed", "exact": "completed"}, {"text": "18", "exact": 18}]]
    assert table["rows"][5][0]["text"] == "host kv budget 16.0 MiB, link bandwidth 3.00 GB/s"
    assert table["rows"][0][1:] == [{"text": "896 us", "exact": 895.5}, {"text": "0 B", "exact": 0}]
    assert table["rows"][1][2] == {"text": "2.05 MiB", "exact": 2146304}
    markup = html_table(table)
    assert '<td title="895.5">896 us</td>' in markup and "<script>" not in markup
    assert same_in_every_arm(table) == (
        '<p class="note" id="same-in-every-arm">The same in every arm: completed <span title="18">18</span>.</p>'
    )


@pytest.mark.parametrize("arms", [2, 6, 17])
def test_the_arms_figure_labels_do_not_overlap(arms):
    captions = [f"host kv budget {i}.00 MiB, link bandwidth {i}00 MB/s, arm {i}" for i in range(arms)]
    rows = [
        {"label": c, "ttft_p50_us": 1000 * (i + 1), "e2e_p90_us": 33876, "tpot_p50_us": 895.5, "token_hit_rate": 0.5}
        | {"bytes_host_to_device": 2146304 * i, "compute_busy_us": 42000}
        for i, c in enumerate(captions)
    ]
    figure = arms_figure({"lab": "a-lab", "arms": rows}, captions)
    assert overlapping_labels(figure) == []
    decoded = [
        {"label": c, "acceptance_rate": 0.5, "ids_per_round": 1.3, "decode_tokens_per_s": 90.0, "vs_greedy": 0.9}
        for c in captions
    ]
    assert overlapping_labels(arms_figure({"lab": "a-lab", "arms": decoded}, captions)) == []


def test_the_overlap_check_sees_overlapping_labels():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_xticks(range(8), [f"a long tick label {i}" for i in range(8)], fontsize=9)
    assert overlapping_labels(fig)
    plt.close(fig)


def test_units_of_rates_and_work():
    assert byte_rate(30) == "30.0 MB/s" and byte_rate(3000) == "3.00 GB/s" and byte_rate(1e6) == "1.00 TB/s"
    assert (
        flop_rate(100000) == "100 GFLOP/s" and flop_count(1158834176) == "1.16 GFLOP" and flop_count(950) == "950 FLOP"
    )
    assert percent(0.59209) == "59.2%" and percent(None) == "-"


@given(st.floats(min_value=1e-3, max_value=1e12))
def test_a_bandwidth_read_back_from_its_text_is_within_half_a_percent(bytes_per_us):
    number, unit = byte_rate(bytes_per_us).split()
    scale = {"B/s": 1, "kB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12, "PB/s": 1e15, "EB/s": 1e18}[unit]
    assert float(number) * scale == pytest.approx(bytes_per_us * 1e6, rel=0.005)


def test_report_writes_a_page_for_a_plain_kvsim_record_and_refuses_one_that_does_not_replay(tmp_path, capsys):
    from jgpt.cli.main import main as jgpt

    example = Path(__file__).parent / "data" / "kvsim_worked_example.json"
    record = tmp_path / "record.json"
    assert jgpt(["kvsim", "run", str(example), "--out", str(record)]) == 0
    page = tmp_path / "run.html"
    assert jgpt(["report", str(record), "--out", str(page)]) == 0
    text = page.read_text()
    document = json.loads(record.read_text())
    totals = document["outcomes"]["totals"]
    assert f'<td title="{totals["end_us"]}">' in text and "<script" not in text
    assert f"TTFT p50 {duration_us(totals['latency_us']['ttft']['p50'])}" in text
    assert all(f'<td class=l title="&quot;{r}&quot;">{r}</td>' in text for r in document["outcomes"]["requests"])
    document["outcomes"]["totals"]["end_us"] += 1
    record.write_text(json.dumps(document))
    capsys.readouterr()
    assert jgpt(["report", str(record), "--out", str(tmp_path / "edited.html")]) == 2
    assert "does not replay" in capsys.readouterr().err and not (tmp_path / "edited.html").exists()
    streamed = tmp_path / "record.jsonl"
    assert jgpt(["kvsim", "run", str(example), "--out", str(streamed)]) == 0
    capsys.readouterr()
    assert jgpt(["report", str(streamed), "--out", str(tmp_path / "streamed.html")]) == 2
    assert "is a streamed kvsim record; the report reads a whole one" in capsys.readouterr().err


def test_the_timeline_labels_do_not_overlap(tmp_path):
    from experiments.report_figures import timeline_figure
    from jgpt.cli.main import main as jgpt

    record = tmp_path / "record.json"
    assert (
        jgpt(["kvsim", "run", str(Path(__file__).parent / "data" / "kvsim_worked_example.json"), "--out", str(record)])
        == 0
    )
    assert overlapping_labels(timeline_figure(json.loads(record.read_text()), "kvsim worked example")) == []
