"""Issue 13's fuzz suite: every file-reading command, fed hostile files, arguments and output paths.

Each entry point is called in-process (tests/hostile.py) with hypothesis input:

* a hostile document (wrong types anywhere, deep nesting, NaN or overflowing numbers,
  random bytes, broken JSON) or a valid document with one value made hostile: the command
  either accepts it or refuses it cleanly (exit 2, one `FIELD: reason` line, no traceback),
  its input is untouched, and a refusal leaves nothing behind;
* deep or non-finite JSON: always refused, naming the input's field;
* a hostile output path (a directory, a missing parent, a file as parent, the input itself
  or a link to it): refused naming `--out` before any work, whatever the input holds.

No example loads a model: commands that would (record, generate, train, eval, catalog add)
are given input they must refuse first, or a model, output or artifact that cannot exist,
so a valid document is refused too, by the later check. `JGPT_FUZZ_EXAMPLES` (default 200,
the CI size) sets the examples per test; a nightly run uses e.g. JGPT_FUZZ_EXAMPLES=5000.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostile import (
    FUZZ,
    HOSTILE_SCALARS,
    NON_FINITE,
    assert_clean,
    assert_refused,
    deep_json,
    extreme_numbers,
    hostile_json,
    hostile_outputs,
    mutated_json,
    run_jgpt,
)  # fmt: skip

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parent.parent
EXAMPLE = json.loads((DATA / "kvsim_worked_example.json").read_text())
TURNS = [{"role": "system", "text": "be brief"}, {"role": "user", "text": "héllo"}, {"role": "assistant", "text": "hi"}]
WORKLOAD = {
    "kind": "requests",
    "requests": [
        {"request_id": "a", "arrival_us": 0, "request": {"text": "hi", "generation": {"max_new_tokens": 4}}},
        {"request_id": "b", "arrival_us": 5, "request": {"turns": [{"role": "user", "text": "x"}]}},
        {"request_id": "c", "arrival_us": 7, "request": {"prompt_ids": [257, 72, 259, 258]}},
    ],
}
CONFIG = {
    "architecture": {"width": 32, "ffn": 64, "context": 64, "layers": 1, "heads": 2, "position": "rope"},
    "train_conversations": 100, "steps": 10, "batch_size": 4, "warmup_steps": 1, "learning_rate": 0.003,
    "development_fraction": 0.1, "seed": 1, "unroll": True, "data": None,
}  # fmt: skip
MOONCAKE = [json.loads(line) for line in (DATA / "kvsim_mooncake_sample.jsonl").read_text().splitlines()]
AZURE = list(csv.reader(io.StringIO((DATA / "kvsim_azure_sample.csv").read_text())))
CATALOG = json.loads((REPO / "checkpoints" / "catalog.json").read_text())
NO_MODEL = "/nonexistent/jgpt-model"
SYSTEM, SERVED = (
    DATA / "engine_system.json",
    DATA / "engine_workload.json",
)  # valid inputs of `serve` beside the fuzzed one


def _record() -> bytes:
    """A kvsim record of the worked example (what replay, plot and perfetto read), as kvsim writes it."""
    from kvsim.cache_run import record_json, simulate
    from kvsim.inputs import load_input

    return record_json(simulate(**load_input(DATA / "kvsim_worked_example.json")))


RECORD_BYTES = _record()
RECORD = json.loads(RECORD_BYTES)


# A small grouped-query Llama's Hugging Face config.json, as `--model-config` reads one.
HF_CONFIG = {
    "model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "torch_dtype": "bfloat16",
}  # fmt: skip
# A built-in lab as a file of one's own (`jgpt lab show PATH.json`).
LAB_FILE = json.loads((Path(__file__).parents[1] / "experiments/labs/host-tier-vs-recompute.json").read_text())


@dataclass(frozen=True)
class Reader:
    """An entry point that reads one JSON file: how to call it, the field it names, a valid document."""

    argv: Callable[[Path, Path], list]  # (input path, output path) -> argv
    field: str  # what a refusal of the whole file names
    document: Any
    accepted: tuple[int, ...] = (0,)
    where: Callable[[tuple, Any], bool] = lambda path, value: True  # which values a mutation may change
    wrong_type: bool = False
    reads_non_finite: bool = False  # parses NaN and refuses it later, naming the member that holds it


def _viewed(path: tuple, value) -> bool:
    """Paths plot and perfetto read (kvsim.record_view checks exactly these)."""
    from kvsim.record_view import EVENT, OUTCOME

    if path[:1] == ("events",):
        return len(path) < 3 or path[2] in EVENT
    if path[:2] == ("outcomes", "requests"):
        return len(path) < 4 or path[3] in OUTCOME
    return path[:3] == ("declaration", "system", "kv_cache") and path[3:4] != ("retention_policy",)


READERS = {
    "tokenize --turns": Reader(lambda i, o: ["tokenize", "--turns", i], "turns", TURNS),
    "record": Reader(lambda i, o: ["record", i, "--out", o, "--model", NO_MODEL], "workload", WORKLOAD, accepted=()),
    "serve": Reader(
        lambda i, o: ["serve", i, "--system", SYSTEM, "--out", o, "--model", NO_MODEL],
        "workload",
        WORKLOAD,
        accepted=(),
    ),
    "serve --system": Reader(
        lambda i, o: ["serve", SERVED, "--system", i, "--out", o, "--model", NO_MODEL],
        "system",
        json.loads((DATA / "engine_system.json").read_text()),
        accepted=(),
    ),
    "kvsim run": Reader(lambda i, o: ["kvsim", "run", i, "--out", o], "INPUT", EXAMPLE),
    "kvsim replay": Reader(lambda i, o: ["kvsim", "replay", i], "record", RECORD, accepted=(0, 1)),
    "kvsim plot": Reader(
        lambda i, o: ["kvsim", "plot", i, "--out-dir", o], "record", RECORD, where=_viewed, wrong_type=True
    ),
    "kvsim perfetto": Reader(lambda i, o: ["kvsim", "perfetto", i, "--out", o], "record", RECORD),
    "kvsim import-trace mooncake": Reader(
        lambda i, o: ["kvsim", "import-trace", i, "--format", "mooncake", "--block-tokens", "4", "--out", o],
        "trace line 1",
        MOONCAKE[0],
    ),
    # A valid config is refused too: --out is the config file itself, so no example trains.
    "train --config": Reader(
        lambda i, o: ["train", "--config", i, "--out", i, "--quiet"], "config", CONFIG, accepted=()
    ),
    "catalog add": Reader(
        lambda i, o: ["catalog", "--catalog", i, "add", NO_MODEL, "--id", "x", "--label", "y"],
        "catalog",
        CATALOG,
        accepted=(),
        reads_non_finite=True,
    ),
    "catalog": Reader(lambda i, o: ["catalog", "--catalog", i], "catalog", CATALOG, reads_non_finite=True),
    "lab replay": Reader(lambda i, o: ["lab", "replay", i], "record", {"lab": "x", "arms": []}, accepted=()),
    "kvsim synthesize --model-config": Reader(
        lambda i, o: ["kvsim", "synthesize", "--requests", "4", "--model-config", i, "--out", o],
        "--model-config",
        HF_CONFIG,
    ),
    "lab show PATH": Reader(lambda i, o: ["lab", "show", i], "lab", LAB_FILE),
}


def _paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "input.json", tmp_path / "out" / "output.json"


def _prepare(tmp_path: Path, data: bytes) -> tuple[Path, Path]:
    source, out = _paths(tmp_path)
    source.write_bytes(data)
    out.parent.mkdir(exist_ok=True)
    return source, out


def _documents(reader: Reader) -> st.SearchStrategy[bytes]:
    mutated = mutated_json(reader.document, reader.where, reader.wrong_type)
    return mutated if reader.wrong_type else st.one_of(hostile_json(), mutated)


def test_synthesize_will_not_write_over_its_model_config(tmp_path):
    """--out naming the file --model-config reads (given as it or as its directory) is refused, nothing written."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(HF_CONFIG))
    for named in (config, tmp_path):
        argv = ["kvsim", "synthesize", "--requests", "4", "--model-config", named, "--out", config]
        assert_refused(argv, inputs=[config], watch=[tmp_path], field="--out")


@pytest.mark.parametrize("name", READERS)
@FUZZ
@given(data=st.data())
def test_hostile_documents_are_accepted_or_refused_cleanly(tmp_path, name, data):
    reader = READERS[name]
    source, out = _prepare(tmp_path, data.draw(_documents(reader)))
    assert_clean(reader.argv(source, out), inputs=[source], watch=[tmp_path], accepted=reader.accepted)


@pytest.mark.parametrize("name", READERS)
@FUZZ
@given(data=st.one_of(deep_json(), st.sampled_from(NON_FINITE).map(lambda n: b'{"x": [' + n + b"]}")))
def test_deep_or_non_finite_json_is_refused_naming_the_input(tmp_path, name, data):
    reader = READERS[name]
    source, out = _prepare(tmp_path, data)
    named = None if reader.reads_non_finite and data.startswith(b'{"x"') else f": {reader.field}"
    assert_refused(reader.argv(source, out), inputs=[source], watch=[tmp_path], field=named)


@FUZZ
@given(data=mutated_json(EXAMPLE, lambda path, value: type(value) in (int, float), replacements=extreme_numbers()))
def test_every_record_kvsim_run_writes_can_be_viewed(tmp_path, data):
    """What kvsim accepts it can also draw: 1e308 as a link latency once passed `run` and broke `plot`."""
    from kvsim.cache_run import read_record
    from kvsim.perfetto import trace_chunks
    from kvsim.record_lines import whole_view
    from kvsim.record_view import check_viewable

    source, out = _prepare(tmp_path, data)
    if assert_clean(["kvsim", "run", source, "--out", out], inputs=[source], watch=[tmp_path]) == 0:
        assert json.loads(b"".join(trace_chunks(whole_view(check_viewable(read_record(out.read_bytes()))))))[
            "traceEvents"
        ]


WRITERS = {
    "tokenize --train": lambda i, o: ["tokenize", "--train", i, "--vocab-size", "300", "--out", o],
    "record": lambda i, o: ["record", i, "--out", o, "--model", NO_MODEL],
    "kvsim run": lambda i, o: ["kvsim", "run", i, "--out", o],
    "kvsim perfetto": lambda i, o: ["kvsim", "perfetto", i, "--out", o],
    "kvsim import-trace": lambda i, o: ["kvsim", "import-trace", i, "--format", "azure", "--out", o],
    "report": lambda i, o: ["report", i, "--out", o],
}


@pytest.mark.parametrize("name", WRITERS)
@FUZZ
@given(data=st.data())
def test_hostile_output_paths_are_refused_before_any_work(tmp_path, name, data):
    source = tmp_path / "input.json"
    source.write_bytes(data.draw(st.one_of(hostile_json(), st.just(json.dumps(RECORD).encode()))))
    what, out = data.draw(st.sampled_from(hostile_outputs(tmp_path, source)))
    refused = assert_refused(WRITERS[name](source, out), inputs=[source], watch=[tmp_path])
    assert ": --out: " in refused, f"{what}: {refused}"


@FUZZ
@given(data=st.data())
def test_synthesize_refuses_hostile_output_paths(tmp_path, data):
    file = tmp_path / "a-file"
    file.write_text("kept")
    what, out = data.draw(st.sampled_from(hostile_outputs(tmp_path, file)[:3]))  # it reads no input
    requests = data.draw(st.integers(1, 5))
    refused = assert_refused(
        ["kvsim", "synthesize", "--requests", requests, "--out", out], inputs=[file], watch=[tmp_path]
    )
    assert ": --out: " in refused, f"{what}: {refused}"


DIRECTORY_WRITERS = {
    "kvsim plot": lambda i, o: ["kvsim", "plot", i, "--out-dir", o],
    "lab run": lambda i, o: ["lab", "run", "admission-slots-latency", "--out", o],
    # A directory where a file is, and a path under a file: refused by the run directory check.
    "train": lambda i, o: ["train", "--out", o, "--quiet"],
}


@pytest.mark.parametrize("name", DIRECTORY_WRITERS)
@pytest.mark.parametrize("where", ["the input file", "under the input file"])
def test_a_file_where_a_directory_is_written_is_refused(tmp_path, name, where):
    source = tmp_path / "input.json"
    source.write_bytes(json.dumps(RECORD).encode())
    out = source if where == "the input file" else source / "plots"
    refused = assert_refused(DIRECTORY_WRITERS[name](source, out), inputs=[source], watch=[tmp_path])
    assert "-out" in refused or ": out: " in refused


# -- entry points whose hostile input is text or arguments rather than JSON -------------------


@FUZZ
@given(corpus=st.binary(max_size=300))
def test_tokenize_train_on_random_bytes_trains_or_refuses_cleanly(tmp_path, corpus):
    source, out = _prepare(tmp_path, corpus)
    code = assert_clean(["tokenize", "--train", source, "--vocab-size", "300", "--out", out], inputs=[source],
                        watch=[tmp_path])  # fmt: skip
    assert code == 2 or json.loads(out.read_text())["model"]["type"] == "BPE"


@st.composite
def _azure_rows(draw) -> bytes:
    rows = [list(row) for row in AZURE]
    hostile = st.one_of(
        st.text(max_size=30),
        st.sampled_from([str(v) for v in HOSTILE_SCALARS]),
        st.sampled_from(["2023-11-16 18:15:46+05:00", "2023-11-16T18:15:46Z", "", "1e999", "9" * 5000]),
    )
    for _ in range(draw(st.integers(1, 3))):
        row = draw(st.integers(0, len(rows) - 1))
        if draw(st.booleans()) and rows[row]:
            rows[row][draw(st.integers(0, len(rows[row]) - 1))] = draw(hostile)
        else:  # a short or long row
            rows[row] = rows[row][: draw(st.integers(0, len(rows[row])))] + draw(st.lists(hostile, max_size=2))
    text = io.StringIO()
    csv.writer(text).writerows(rows)
    return text.getvalue().encode("utf-8", "surrogatepass")  # a lone surrogate: bytes that are not UTF-8


@FUZZ
@given(data=st.data())
def test_azure_trace_rows_of_any_shape_are_imported_or_refused_cleanly(tmp_path, data):
    source, out = _prepare(tmp_path, data.draw(st.one_of(_azure_rows(), hostile_json())))
    assert_clean(
        ["kvsim", "import-trace", source, "--format", "azure", "--out", out], inputs=[source], watch=[tmp_path]
    )


@FUZZ
@given(data=st.data())
def test_mooncake_traces_with_a_hostile_line_are_imported_or_refused_cleanly(tmp_path, data):
    line = data.draw(st.integers(0, len(MOONCAKE) - 1))
    lines = [json.dumps(row).encode() for row in MOONCAKE]
    lines[line] = data.draw(st.one_of(mutated_json(MOONCAKE[line]), hostile_json()))
    source, out = _prepare(tmp_path, b"\n".join(lines))
    assert_clean(["kvsim", "import-trace", source, "--format", "mooncake", "--block-tokens", "4", "--out", out],
                 inputs=[source], watch=[tmp_path])  # fmt: skip


SIZES = st.one_of(st.integers(-(2**64), 0), st.integers(10**5 + 1, 2**70))


@FUZZ
@given(option=st.sampled_from(["--requests", "--layers", "--width", "--context", "--precision-bytes"]), value=SIZES)
def test_synthesize_refuses_sizes_out_of_bounds_naming_the_option(tmp_path, option, value):
    if option != "--requests" and value > 0:  # model dimensions only need to be positive: counts, not arrays
        value = -value
    out = tmp_path / "computations.json"
    assert_refused(["kvsim", "synthesize", option, value, "--out", out], watch=[tmp_path], field=option)


@FUZZ
@given(block_tokens=st.one_of(st.integers(-(2**64), 0), st.integers(4097, 2**70)))
def test_import_trace_refuses_a_block_size_beyond_the_context(tmp_path, block_tokens):
    source, out = _prepare(tmp_path, (DATA / "kvsim_mooncake_sample.jsonl").read_bytes())
    assert_refused(["kvsim", "import-trace", source, "--format", "mooncake", "--block-tokens", block_tokens,
                    "--out", out], inputs=[source], watch=[tmp_path], field="--block-tokens")  # fmt: skip


@FUZZ
@given(ids=st.one_of(st.text(max_size=40).filter(lambda t: not _integers(t)),
                     st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=5).filter(lambda v: min(v) < 0)
                     .map(lambda v: ",".join(map(str, v)))))  # fmt: skip
def test_generate_refuses_ids_that_are_not_token_ids_before_loading(ids):
    assert_refused(["generate", f"--ids={ids}", "--model", NO_MODEL], field="ids")


def _integers(text: str) -> bool:
    try:
        return bool([int(part) for part in text.split(",")])
    except ValueError:
        return False


@FUZZ
@given(option=st.sampled_from(["--conversations", "--seed", "--development-fraction"]),
       value=st.one_of(st.integers(-(2**64), -1), st.integers(1_000_001, 2**70), st.sampled_from(["nan", "inf", "-0.5", "1.5"])))  # fmt: skip
def test_eval_refuses_hostile_sizes_before_loading_the_model(option, value):
    if option == "--conversations" and isinstance(value, str):
        value = -1
    if option == "--seed" and (isinstance(value, str) or value > 0):
        value = -1
    if option == "--development-fraction" and not isinstance(value, str):
        value = "nan" if value > 0 else value
    field = option.removeprefix("--").replace("-", "_")
    line = assert_refused(["eval", option, value, "--model", NO_MODEL])
    assert f": {field}: " in line or "argument" in line


@FUZZ
@given(lab=st.text(max_size=30), action=st.sampled_from(["show", "run"]))
def test_lab_show_and_run_refuse_unknown_ids(tmp_path, lab, action):
    from experiments.experiment_design import default_catalog

    if lab in {design.id for design in default_catalog().experiments} or lab.startswith("-"):
        lab = f"no-{lab}"
    argv = ["lab", action, lab] + (["--out", tmp_path / "out"] if action == "run" else [])
    assert_refused(argv, watch=[tmp_path], field=": lab: ")


@FUZZ
@given(option=st.sampled_from(["--id", "--role", "--stop-ids"]), value=st.text(max_size=12))
def test_catalog_add_refuses_bad_options_before_loading(tmp_path, option, value):
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps(CATALOG))
    arguments = {"--id": "x", "--label": "y"}
    if option == "--id":
        arguments["--id"] = " " * len(value)
    elif option == "--role":
        arguments["--role"] = value if value != "default" and not value.startswith("-") else "admin"
    else:
        arguments["--stop-ids"] = f"-{abs(hash(value)) % 1000 + 1}"
    argv = ["catalog", "--catalog", catalog, "add", NO_MODEL, *(x for pair in arguments.items() for x in pair)]
    assert_refused(argv, inputs=[catalog], watch=[tmp_path], field=option if option != "--id" or value else None)


def test_the_fuzz_fixtures_are_accepted_as_given(tmp_path):
    """The valid documents the mutations start from are valid: a refusal above is the mutation's doing."""
    for name in ("tokenize --turns", "kvsim run", "kvsim replay", "kvsim plot", "kvsim perfetto", "catalog"):
        reader = READERS[name]
        data = RECORD_BYTES if reader.document is RECORD else json.dumps(reader.document).encode()
        (tmp_path / name).mkdir()
        source, out = _prepare(tmp_path / name, data)
        code, _, stderr = run_jgpt(reader.argv(source, out))
        assert code == 0, f"{name}: {stderr}"


# -- the issue's own examples, one by one ------------------------------------------------------


def _edited(document, edit) -> bytes:
    copy = json.loads(json.dumps(document))
    edit(copy)
    return json.dumps(copy).encode()


def _long_prompt(row: dict) -> None:
    row.update(input_length=10_000, hash_ids=list(range(20)))


ISSUE_EXAMPLES = {
    # class 5: non-finite numbers
    "train --learning-rate inf": (None, lambda i, o: ["train", "--learning-rate", "inf", "--out", o], "learning_rate"),
    "train config NaN": (b'{"learning_rate": NaN}', lambda i, o: ["train", "--config", i, "--out", o], "config"),
    "train config out 5": (b'{"out": 5}', lambda i, o: ["train", "--config", i], "out"),
    "kvsim link_latency_us 1e308": (
        _edited(EXAMPLE, lambda d: d["system"]["transfer"].update(link_latency_us=1e308)),
        lambda i, o: ["kvsim", "run", i, "--out", o], "system.transfer.link_latency_us"),
    "kvsim a rate of 5e-324": (
        _edited(EXAMPLE, lambda d: d["system"]["compute_service"].update(compute_flops_per_us=5e-324)),
        lambda i, o: ["kvsim", "run", i, "--out", o], "system.compute_service.compute_flops_per_us"),
    # class 9: validation gaps
    "catalog add --stop-ids -5": (json.dumps(CATALOG).encode(), lambda i, o: [
        "catalog", "--catalog", i, "add", NO_MODEL, "--id", "x", "--label", "y", "--stop-ids", "-5", "1000000000"],
        "--stop-ids"),
    "catalog add empty --id": (json.dumps(CATALOG).encode(), lambda i, o: [
        "catalog", "--catalog", i, "add", NO_MODEL, "--id", "", "--label", "y"], "--id"),
    "catalog add --role admin": (json.dumps(CATALOG).encode(), lambda i, o: [
        "catalog", "--catalog", i, "add", NO_MODEL, "--id", "x", "--label", "y", "--role", "admin"], "--role"),
    "workload kind a number": (_edited(WORKLOAD, lambda d: d.update(kind=5)),
                               lambda i, o: ["record", i, "--out", o, "--model", NO_MODEL], "workload.kind"),
    "workload kind an object": (_edited(WORKLOAD, lambda d: d.update(kind={})),
                                lambda i, o: ["record", i, "--out", o, "--model", NO_MODEL], "workload.kind"),
    "kvsim stop_reason whatever": (
        _edited(EXAMPLE, lambda d: d["computations"]["requests"][0]["outcome"].update(stop_reason="whatever")),
        lambda i, o: ["kvsim", "run", i, "--out", o], "outcome.stop_reason"),
    "import-trace a 10,000-token prompt": (
        _edited(MOONCAKE[0], _long_prompt), lambda i, o: ["kvsim", "import-trace", i, "--format", "mooncake", "--out", o],
        "trace line 1.input_length"),
    "eval --seed -1": (None, lambda i, o: ["eval", "--seed", "-1", "--model", NO_MODEL], "seed"),
    "--block-tokens 0 names itself": (
        json.dumps(MOONCAKE[0]).encode(),
        lambda i, o: ["kvsim", "import-trace", i, "--format", "mooncake", "--block-tokens", "0", "--out", o],
        "--block-tokens"),
    "synthesize --requests -1 names itself": (None, lambda i, o: ["kvsim", "synthesize", "--requests", "-1", "--out", o],
                                              "--requests"),
    # resource bounds
    "tokenize --train --vocab-size 10^9": (b"corpus text\n", lambda i, o: [
        "tokenize", "--train", i, "--vocab-size", "1000000000", "--out", o], "--vocab-size"),
    "synthesize --requests 10^9": (None, lambda i, o: ["kvsim", "synthesize", "--requests", "1000000000", "--out", o],
                                   "--requests"),
    "trace output_length 5e7": (
        _edited(MOONCAKE[0], lambda row: row.update(output_length=50_000_000)),
        lambda i, o: ["kvsim", "import-trace", i, "--format", "mooncake", "--block-tokens", "4", "--out", o],
        "trace line 1.output_length"),
    "--block-tokens 10^8": (
        json.dumps(MOONCAKE[0]).encode(),
        lambda i, o: ["kvsim", "import-trace", i, "--format", "mooncake", "--block-tokens", "100000000", "--out", o],
        "--block-tokens"),
    "eval --conversations 10^9": (None, lambda i, o: ["eval", "--conversations", "1000000000", "--model", NO_MODEL],
                                  "conversations"),
}  # fmt: skip


@pytest.mark.parametrize("name", ISSUE_EXAMPLES)
def test_the_issues_examples_are_refused_naming_the_field(tmp_path, name):
    data, argv, field = ISSUE_EXAMPLES[name]
    source, out = _prepare(tmp_path, data or b"")
    line = assert_refused(argv(source, out), inputs=[source], watch=[tmp_path])
    assert f": error: {field}: " in line or f".{field}: " in line, line
