"""`make demo`: the main job end to end with the shipped default checkpoint."""

from __future__ import annotations

import json

from experiments.commands import demo


def test_demo_explains_the_prompt_answers_runs_the_default_lab_and_writes_its_report(tmp_path, capsys):
    assert demo.main("demo", ["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out

    # The prompt is shown span by span, control tokens included, before any answer.
    assert "turn framing" in out and "<|assistant|>" in out
    assert out.index("turn framing") < out.index("== answers from chat")
    # Every built-in prompt gets an answer with its stop reason.
    assert out.count("[turn_end]") + out.count("[max_new_tokens]") + out.count("[context]") == 4

    lab = tmp_path / demo.DEFAULT_LAB
    record = json.loads((lab / "record.json").read_bytes())
    assert [arm["label"] for arm in record["arms"]] and all(arm["outcomes"] for arm in record["arms"])
    assert (lab / "report.html").is_file() and str((lab / "report.html").resolve()) in out
