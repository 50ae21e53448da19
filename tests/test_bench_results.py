"""Bench results: every file under bench/results/ reads as a result, and docs/results.md is generated from them.

A bench writes one JSON file per run (bench/result.py); `python bench/results_page.py` writes the page.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import result, results_page  # noqa: E402
from jgpt.foundation.errors import ApiError  # noqa: E402

FIGURES = {"batch 1": {"jgpt": {"decode_step_ms": 16.76, "same_ids": True, "tok_per_s": 59.7}}}


def test_every_committed_result_reads_and_the_page_is_generated_from_them():
    assert sorted(result.RESULTS.glob("*.json")), "bench/results/ holds no result"
    for path in result.RESULTS.glob("*.json"):
        result.read_result(path)
    assert results_page.PAGE.read_text() == results_page.page(), (
        "docs/results.md is not what `python bench/results_page.py` writes: rerun it"
    )


def test_a_run_writes_a_result_that_reads_back_with_its_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "decode.py"), "--quick"])
    run = result.BenchRun.start("decode", "Decode speed.\n\nMore.")
    path = run.write(FIGURES, tmp_path, note="a smoke run", plots={"plot.png": b"\x89PNG"})
    document = result.read_result(path)
    assert document["command"] == "python bench/decode.py --quick"
    assert document["title"] == "Decode speed."
    assert document["figures"] == FIGURES
    assert document["plots"] == [path.stem + "-plot.png"]
    assert (tmp_path / document["plots"][0]).read_bytes() == b"\x89PNG"
    assert document["load"]["before"] >= 0 and document["machine"]["cores"] >= 1


def test_the_page_shows_the_latest_result_of_each_bench(tmp_path):
    for date, step in (("2026-12-05T10:00:00Z", 20.0), ("2026-12-06T10:00:00Z", 16.5)):
        document = _document(date=date, figures={"batch 1": {"jgpt": {"decode_step_ms": step}}})
        (tmp_path / f"decode-{date[:10]}.json").write_text(json.dumps(document))
    text = results_page.page(tmp_path, tmp_path / "results.md")
    assert "| jgpt | 16.5 |" in text and "20.0" not in text
    assert "[decode-2026-12-06.json](decode-2026-12-06.json)" in text


@pytest.mark.parametrize(
    "change, field",
    [
        ({"figures": {"t": {"r": {"decode_step": 1.0}}}}, "figures.t.r.decode_step"),
        ({"figures": {"t": {"r": {"Step_ms": 1.0}}}}, "figures.t.r.Step_ms"),
        ({"figures": {"t": {"r": {"step_ms": [1.0]}}}}, "figures.t.r.step_ms"),
        ({"date": "2026-12-06 10:00"}, "date"),
        ({"extra": 1}, "extra"),
        ({"version": 2}, "version"),
        ({"plots": ["missing.png"]}, "plots"),
    ],
)
def test_a_bad_result_is_refused_naming_its_field(tmp_path, change, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_document() | change))
    with pytest.raises(ApiError) as refused:
        result.read_result(path)
    assert refused.value.field == field


def test_the_schema_accepts_what_the_reader_accepts():
    jsonschema.validate(_document(), result.schema())
    for path in result.RESULTS.glob("*.json"):
        jsonschema.validate(json.loads(path.read_text()), result.schema())


def _document(date: str = "2026-12-06T10:00:00Z", figures: dict | None = None) -> dict:
    return {
        "format": "jgpt-bench-result",
        "version": 1,
        "bench": "decode",
        "title": "Decode speed.",
        "date": date,
        "command": "python bench/decode.py",
        "commit": "abc1234",
        "dirty": False,
        "machine": {
            "cpu": "x",
            "cores": 2,
            "usable_cores": 2,
            "memory_bytes": 1 << 33,
            "python": "3.11",
            "jax": "0.10.2",
            "malloc": None,
        },  # fmt: skip
        "load": {"before": 0.5, "after": None},
        "transcribed": None,
        "note": "",
        "figures": figures or FIGURES,
        "plots": [],
    }
