"""`kvsim run --system S.json --computations C.json [--workload W.json]`: the parts a user holds, composed.

A composed run writes the very record of the same parts wrapped by hand in one INPUT.json, and a part
that holds another kind of file is refused, naming the file and what it holds.
"""

import json
from pathlib import Path

import pytest

from jgpt.cli.main import main as jgpt

EXAMPLE = json.loads((Path(__file__).parent / "data" / "kvsim_worked_example.json").read_text())
SYSTEM = EXAMPLE["system"] | {
    "max_new_tokens_cap": 16,
    "kv_cache": {"device_kv_bytes": 10**8, "host_kv_bytes": 10**8},
}


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    """A directory with a system, a synthesized computation document and a record of them."""
    directory = tmp_path_factory.mktemp("parts")
    (directory / "system.json").write_text(json.dumps(SYSTEM))
    assert jgpt(["kvsim", "synthesize", "--requests", "30", "--out", str(directory / "doc.json")]) == 0
    assert jgpt(["kvsim", "run", "--system", str(directory / "system.json"), "--computations",
                 str(directory / "doc.json"), "--out", str(directory / "record.json"), "--quiet"]) == 0  # fmt: skip
    return directory


def _ids(parts: Path) -> list[str]:
    return [r["request_id"] for r in json.loads((parts / "doc.json").read_text())["requests"]]


def _wrapped(tmp_path: Path, parts: Path, **more) -> bytes:
    """The record of an INPUT.json holding the parts (the document by its path, as users write it)."""
    (tmp_path / "doc.json").write_bytes((parts / "doc.json").read_bytes())
    (tmp_path / "input.json").write_text(json.dumps({"system": SYSTEM, "computations": "doc.json", **more}))
    record = tmp_path / "wrapped.json"
    assert jgpt(["kvsim", "run", str(tmp_path / "input.json"), "--out", str(record), "--quiet"]) == 0
    return record.read_bytes()


def _composed(tmp_path: Path, parts: Path, *workload: str, out: str = "composed.json") -> bytes:
    record = tmp_path / out
    command = ["kvsim", "run", "--system", str(parts / "system.json"), "--computations", str(parts / "doc.json")]
    assert jgpt([*command, *workload, "--out", str(record), "--quiet"]) == 0
    return record.read_bytes()


def test_a_composed_run_writes_the_record_of_the_parts_wrapped(tmp_path, parts):
    assert (parts / "record.json").read_bytes() == _wrapped(tmp_path, parts)


def test_a_kvsim_workload_part_is_the_wrapped_workload(tmp_path, parts):
    ids = _ids(parts)[::-1][:20]  # other arrivals than the document's, in another order
    workload = {"kind": "retimed", "requests": [{"request_id": i, "arrival_us": 500 * n} for n, i in enumerate(ids)]}
    (tmp_path / "w.json").write_text(json.dumps(workload))
    composed = _composed(tmp_path, parts, "--workload", str(tmp_path / "w.json"))
    assert composed == _wrapped(tmp_path, parts, workload=workload)
    assert composed != (parts / "record.json").read_bytes()


def test_a_jgpt_workload_document_gives_its_arrivals_and_customer_interaction(tmp_path, parts):
    """The Workload document jgpt record and jgpt serve read: its request bodies are what the computations
    were recorded from, so kvsim takes the arrivals and the customer interaction."""
    ids = _ids(parts)[:10]
    arrivals = [{"request_id": i, "arrival_us": 1000 * n} for n, i in enumerate(ids)]
    interaction = {"actions": [{"kind": "cancel", "at_us": 1500, "request_id": ids[1]}]}
    document = {"kind": "chat", "requests": [a | {"request": {"text": "hello"}} for a in arrivals],
                "customer_interaction": interaction}  # fmt: skip
    (tmp_path / "w.json").write_text(json.dumps(document))
    composed = _composed(tmp_path, parts, "--workload", str(tmp_path / "w.json"))
    wrapped = _wrapped(
        tmp_path, parts, workload={"kind": "chat", "requests": arrivals}, customer_interaction=interaction
    )
    assert composed == wrapped and b'"cancel_request"' in composed


@pytest.mark.parametrize(
    ("option", "source", "holds"),
    [
        ("--system", "doc.json", "a recorded computation document"),
        ("--system", "record.json", "a kvsim record"),
        ("--system", "fragment.json", "a calibrated service fragment"),
        ("--system", "input.json", "a kvsim input"),
        ("--computations", "system.json", "a system"),
        ("--computations", "record.jsonl", "a kvsim record (`kvsim run --out`), streamed"),
        ("--computations", "measured.json", "a measured-run document"),
        ("--workload", "doc.json", "a recorded computation document"),
    ],
)
def test_a_part_of_another_kind_is_refused_naming_the_file_and_what_it_holds(
    tmp_path, parts, capsys, option, source, holds
):
    files = {"system": parts / "system.json", "doc": parts / "doc.json"}
    (tmp_path / "fragment.json").write_text(json.dumps({"compute_service": {}, "calibration": {}}))
    (tmp_path / "input.json").write_text(json.dumps({"system": SYSTEM, "computations": "doc.json"}))
    (tmp_path / "measured.json").write_text(json.dumps({"format": "jgpt-measured-run"}))
    (tmp_path / "record.json").write_bytes((parts / "record.json").read_bytes())
    assert jgpt(["kvsim", "run", "--system", str(files["system"]), "--computations", str(files["doc"]),
                 "--out", str(tmp_path / "record.jsonl"), "--quiet"]) == 0  # fmt: skip
    (tmp_path / "doc.json").write_bytes(files["doc"].read_bytes())
    (tmp_path / "system.json").write_bytes(files["system"].read_bytes())
    given = {"--system": files["system"], "--computations": files["doc"]} | {option: tmp_path / source}
    record = tmp_path / "out.json"
    code = jgpt(["kvsim", "run", *(str(x) for pair in given.items() for x in pair), "--out", str(record)])
    err = capsys.readouterr().err
    assert code == 2 and not record.exists()
    assert f"{option}: {tmp_path / source} holds {holds}" in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--system", "S"], "--computations: needed: give INPUT.json, or --system and --computations"),
        (["--computations", "C"], "--system: needed"),
        ([], "--system: needed"),
        (["INPUT", "--system", "S"], "--system: give INPUT.json or its parts"),
        (["--system", "S", "--computations", "C", "--out", "C"], "--out: "),
    ],
)
def test_a_missing_or_doubled_part_is_one_error(tmp_path, parts, capsys, arguments, message):
    names = {"S": parts / "system.json", "C": parts / "doc.json", "INPUT": parts / "system.json"}
    before = (parts / "doc.json").read_bytes()
    assert jgpt(["kvsim", "run", *(str(names.get(a, a)) for a in arguments)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert (parts / "doc.json").read_bytes() == before
