"""The speculative-k-sweep lab: generate arms decode for real, every arm selects greedy's ids, the record replays.

One module-scoped run of the shipped lab's design on a tiny random-weight model: greedy,
a draft with the target's own weights (it proposes the target's own ids) and prompt
lookup, at K = 2, on two of the lab's requests with a budget of 6 ids.
"""

import copy
import hashlib
import json
import shutil

import pytest

from experiments.commands.lab import summary_text
from experiments.experiment_design import ExperimentDesign, default_catalog
from experiments.experiment_execution import run_lab
from experiments.experiment_replay import replay
from jgpt.foundation.errors import ApiError

from conftest import lab_defaults, tiny_model

SHIPPED = default_catalog().lab("speculative-k-sweep")


def _design(points, requests=2):
    document = SHIPPED.to_json()
    document["sweep"] = [{"values": points}]
    document["workload"]["requests"] = document["workload"]["requests"][:requests]
    return ExperimentDesign.from_json(document)


def _speculative(draft, k):
    return {"decoding.rule": "speculative", "decoding.draft_model_id": draft, "decoding.speculation_tokens": k}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    model = tiny_model(tmp_path_factory.mktemp("model"), seed=3)
    defaults = lab_defaults(model, max_new_tokens=6)
    points = [{"decoding.rule": "greedy"}, _speculative(str(model.path), 2), _speculative("prompt-lookup", 2)]
    recordings = {}
    run = run_lab(_design(points), tmp_path_factory.mktemp("lab") / "sweep", defaults=defaults, recordings=recordings)
    return run, model, defaults, recordings


def test_the_shipped_lab_sweeps_k_1_to_8_with_the_draft_and_prompt_lookup_against_greedy():
    decodings = [{s.control: s.value for s in arm.execution.experiments} for arm in SHIPPED.arms()]
    assert decodings[0] == {"execution.runner": "generate", "decoding.rule": "greedy"}
    for draft in ("chat-draft", "prompt-lookup"):
        assert sorted(
            d["decoding.speculation_tokens"] for d in decodings if d.get("decoding.draft_model_id") == draft
        ) == list(range(1, 9))
    assert SHIPPED.served and not SHIPPED.planned


def test_every_arm_selects_greedys_ids_and_the_record_replays(sweep):
    run, model, _, _ = sweep
    record = run.record
    assert record == replay(run.directory / "record.json")
    recorded = json.loads((run.directory / "computations-0.json").read_text())
    greedy_ids = {r["request_id"]: r["output_ids"] for r in recorded["requests"]}
    assert len(greedy_ids) == 2
    for arm in record["arms"]:
        decoding_run = json.loads((run.directory / arm["decoding_run"]["path"]).read_text())
        assert {r["request_id"]: r["output_ids"] for r in decoding_run["requests"]} == greedy_ids  # checked here too
        assert arm["outcomes"] == decoding_run["totals"] and arm["outcomes"]["same_ids_as_greedy"] is True
        assert arm["outcomes"]["decode_tokens_per_s"] > 0
    greedy, same, lookup = (arm["outcomes"] for arm in record["arms"])
    assert greedy["drafted"] == 0 and greedy["acceptance_rate"] is None and greedy["ids_per_round"] == 1.0
    assert greedy["rounds"] == greedy["decode_ids"] == sum(len(ids) - 1 for ids in greedy_ids.values())
    # a draft with the target's weights proposes the target's own ids: 2 accepted and the target's own a round,
    # until the reply's last n % 3 ids, all accepted
    decoded = [len(ids) - 1 for ids in greedy_ids.values()]
    assert same["rounds"] == sum(-(-n // 3) for n in decoded) < greedy["rounds"]
    assert same["accepted"] == sum(2 * (n // 3) + n % 3 for n in decoded)
    assert lookup["drafted"] > 0 and 0 <= lookup["accepted"] <= lookup["drafted"]
    assert decoding_run["decoding"]["draft_checkpoint_sha256"] is None  # the last arm's: prompt lookup
    rows = json.loads((run.directory / "summary.json").read_text())["arms"]
    assert rows[0]["vs_greedy"] == 1.0 and all(row["source"].startswith("measured with generate") for row in rows)
    assert rows[1]["vs_greedy"] == pytest.approx(same["decode_tokens_per_s"] / greedy["decode_tokens_per_s"])
    text = summary_text(json.loads((run.directory / "summary.json").read_text()))
    assert text.count("same as greedy") == 3 and "DIFFER" not in text


def test_the_report_shows_the_decoding_rows_as_data_read_into_text(sweep):
    run = sweep[0]
    page = (run.directory / "report.html").read_text()
    assert (run.directory / "plots" / "arms.png").is_file()
    data = json.loads(page.split('<script type="application/json" id="data">')[1].split("</script>")[0])
    assert [row["label"] for row in data["summary"]["arms"]] == [arm["label"] for arm in run.record["arms"]]
    assert "innerHTML" not in page and "decode_tokens_per_s" in page


def _copy(run, tmp_path):
    directory = tmp_path / "copy"
    shutil.copytree(run.directory, directory)
    return directory, json.loads((directory / "record.json").read_text())


def test_an_edited_decoding_run_is_refused(sweep, tmp_path):
    directory, record = _copy(sweep[0], tmp_path)
    entry = record["arms"][2]["decoding_run"]
    document = json.loads((directory / entry["path"]).read_text())
    document["requests"][0]["output_ids"][-1] += 1  # an id greedy did not select, the totals left as they were
    data = (json.dumps(document, indent=1) + "\n").encode()
    (directory / entry["path"]).write_bytes(data)
    entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (directory / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    with pytest.raises(ApiError) as refused:
        replay(directory / "record.json")
    assert refused.value.field == "record.arms[2].outcomes"
    (directory / entry["path"]).write_bytes(data + b" ")
    with pytest.raises(ApiError, match="size"):
        replay(directory / "record.json")


@pytest.mark.parametrize(
    ("point", "field", "reason"),
    [
        ({"decoding.rule": "beam"}, "decoding.rule", "beam"),
        ({"decoding.rule": "speculative"}, "decoding.draft_model_id", "needs a draft"),
        ({"decoding.rule": "greedy", "decoding.speculation_tokens": 2}, "decoding.speculation_tokens", "speculative"),
        (_speculative("prompt-lookup", 0), "decoding.speculation_tokens", ">= 1"),
    ],
)
def test_a_bad_decoding_control_is_refused_naming_it(point, field, reason):
    with pytest.raises(ApiError) as refused:
        _design([{"decoding.rule": "greedy"}, point])
    assert field in f"{refused.value.field}: {refused.value.reason}" and reason in str(refused.value)


def test_decoding_controls_on_a_kvsim_arm_and_k_past_the_bound_are_refused(sweep, tmp_path):
    document = _design([{"decoding.rule": "greedy"}, _speculative("prompt-lookup", 2)]).to_json() | {"settings": []}
    with pytest.raises(ApiError, match="decoding.rule: applies only to arms with execution.runner=generate"):
        ExperimentDesign.from_json(copy.deepcopy(document))
    del document["sweep"], document["answer"]  # the answer compares the sweep's arms
    document["settings"] = [{"control": "execution.runner", "value": "generate"}] + [
        {"control": name, "value": value} for name, value in _speculative("prompt-lookup", 17).items()
    ]
    _, _, defaults, recordings = sweep
    with pytest.raises(ApiError) as refused:  # the recording is shared: only the arm runs
        run_lab(
            ExperimentDesign.from_json(document),
            tmp_path / "out",
            defaults=defaults,
            recordings=recordings,
            report=False,
            plots=False,
        )
    assert "decoding.speculation_tokens" in refused.value.field and "1..16" in refused.value.reason
    assert not (tmp_path / "out").exists()
