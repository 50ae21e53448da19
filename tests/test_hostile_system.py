"""What the machine can throw at a command: devices and pipes as inputs, outputs the system
refuses (a full disk, a file system that cannot hold the file), outputs that hold other files,
and launcher environment variables. Each was a traceback, a hang or a deleted file before.

Every refusal is checked as tests/hostile.py checks any other: exit 2, one line naming the
field or path, no traceback, inputs byte-identical, nothing left behind.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.foundation import identity
from jgpt.foundation.errors import ApiError
from tests.hostile import FUZZ, assert_refused, run_jgpt

DATA = Path(__file__).parent / "data"
NO_MODEL = "/nonexistent/jgpt-model"

# Commands that read one file named on the command line (and may write under `out`), with the field they name.
READERS = {
    "kvsim run": (lambda i, out: ["kvsim", "run", i, "--out", out / "record.json"], "INPUT"),
    "kvsim plot": (lambda i, out: ["kvsim", "plot", i, "--out-dir", out / "plots"], "RECORD"),
    "tokenize --turns": (lambda i, out: ["tokenize", "--turns", i], "turns"),
    "tokenize --tokenizer": (lambda i, out: ["tokenize", "--tokenizer", i, "hi"], "tokenizer"),
    "catalog": (lambda i, out: ["catalog", "--catalog", i], "catalog"),
    "lab replay": (lambda i, out: ["lab", "replay", i], "record"),
    "kvsim calibrate": (lambda i, out: ["kvsim", "calibrate", i, "--out", out / "service.json"], "MEASURED[0]"),
}


@pytest.mark.parametrize("name", READERS)
def test_a_device_as_input_is_refused_not_read_without_end(tmp_path, name):
    """/dev/zero used to be read until MemoryError (a traceback after minutes)."""
    argv, field = READERS[name]
    line = assert_refused(argv("/dev/zero", tmp_path), watch=[tmp_path])
    assert f"{field}: cannot read /dev/zero: not a file or a pipe" in line, line


@pytest.mark.parametrize("limit", [0, 100, 5000])
def test_a_pipe_is_read_up_to_the_limit_and_no_further(tmp_path, monkeypatch, limit):
    """A pipe (`jgpt kvsim run <(...)`) is a valid input; one that never ends stops at READ_LIMIT."""
    monkeypatch.setattr(identity, "READ_LIMIT", 1000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = b"x" * limit
    writer = threading.Thread(target=lambda: _write_ignoring_a_closed_reader(fifo, data))
    writer.start()
    try:
        if limit <= 1000:
            assert identity.read_bytes(fifo, "INPUT") == data
        else:
            with pytest.raises(ApiError, match=r"^INPUT: cannot read .*fifo: larger than 1000 bytes"):
                identity.read_bytes(fifo, "INPUT")
    finally:
        writer.join(timeout=10)


def _write_ignoring_a_closed_reader(fifo: Path, data: bytes) -> None:
    try:
        with open(fifo, "wb") as stream:
            stream.write(data)
    except BrokenPipeError:  # the reader stopped at its limit
        pass


def test_a_regular_file_past_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(identity, "READ_LIMIT", 10)
    source = tmp_path / "input.json"
    source.write_bytes(b'{"a": [1, 2, 3]}')
    with pytest.raises(ApiError, match=r"^INPUT: cannot read .*input.json: larger than 10 bytes"):
        identity.read_bytes(source, "INPUT")


def _no_space(descriptor, *args, **kwargs):
    """os.fdopen whose stream's writes fail as on a full disk (there is no tiny tmpfs to fill here)."""

    class Full:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            os.close(descriptor)

        def writelines(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return Full()


def test_a_full_disk_keeps_the_old_output_and_says_so_in_one_line(tmp_path, monkeypatch):
    source, out = tmp_path / "input.json", tmp_path / "record.json"
    shutil.copyfile(DATA / "kvsim_worked_example.json", source)
    out.write_bytes(b"the previous record")
    monkeypatch.setattr(identity.os, "fdopen", _no_space)
    line = assert_refused(["kvsim", "run", source, "--out", out], inputs=[source, out], watch=[tmp_path])
    assert line.endswith(f": error: {out}: cannot write: No space left on device"), line


def test_a_full_disk_while_drawing_plots_leaves_no_half_drawn_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from kvsim.cache_run import record_json, simulate
    from kvsim.inputs import load_input

    source = tmp_path / "record.json"
    source.write_bytes(record_json(simulate(**load_input(DATA / "kvsim_worked_example.json"))))
    (tmp_path / "plots").mkdir()

    def full(self, path, **kwargs):
        Path(path).write_bytes(b"half a png")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(Figure, "savefig", full)
    line = assert_refused(["kvsim", "plot", source, "--out-dir", tmp_path / "plots"], inputs=[source], watch=[tmp_path])
    assert "occupancy.tmp.png: No space left on device" in line, line


# Outputs on a file system that cannot hold a new file: /proc refuses every create.
UNWRITABLE = {
    "kvsim run": lambda record: ["kvsim", "run", DATA / "kvsim_worked_example.json", "--out", "/proc/jgpt-record.json"],
    "kvsim synthesize": lambda record: [
        "kvsim",
        "synthesize",
        "--requests",
        "2",
        "--out",
        "/proc/jgpt-computations.json",
    ],
    "kvsim perfetto": lambda record: ["kvsim", "perfetto", record, "--out", "/proc/jgpt-trace.json"],
    "kvsim plot": lambda record: ["kvsim", "plot", record, "--out-dir", "/proc/jgpt-plots"],
    "tokenize --train": lambda record: [
        "tokenize",
        "--train",
        DATA / "kvsim_azure_sample.csv",
        "--vocab-size",
        "270",
        "--out",
        "/proc/jgpt-tokenizer.json",
    ],
}


@pytest.mark.parametrize("name", UNWRITABLE)
def test_an_output_the_file_system_refuses_is_one_line_naming_it(tmp_path, name):
    from kvsim.cache_run import record_json, simulate
    from kvsim.inputs import load_input

    record = tmp_path / "record.json"
    record.write_bytes(record_json(simulate(**load_input(DATA / "kvsim_worked_example.json"))))
    line = assert_refused(UNWRITABLE[name](record), inputs=[record], watch=[tmp_path])
    assert ": /proc/jgpt-" in line and ("No such file or directory" in line or "not permitted" in line), line


@FUZZ
@given(value=st.one_of(st.integers(max_value=0), st.integers(min_value=2**53 + 1, max_value=2**80)))
def test_tokenize_train_refuses_a_min_frequency_out_of_range_naming_it(tmp_path, value):
    """2^70 used to reach the Rust trainer as an OverflowError traceback."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text some text\n")
    line = assert_refused(
        [
            "tokenize",
            "--train",
            corpus,
            "--vocab-size",
            "270",
            "--min-frequency",
            value,
            "--out",
            tmp_path / "tokenizer.json",
        ],
        inputs=[corpus],
        watch=[tmp_path],
    )
    assert ": --min-frequency: must be an integer in [1, " in line, line


@FUZZ
@given(value=st.one_of(st.integers(max_value=0), st.integers(min_value=2**31, max_value=2**80)))
def test_generate_refuses_a_budget_past_int32_before_loading(value):
    """2^70 passed the policy and ended in OverflowError at np.int32, after the model had loaded."""
    line = assert_refused(["generate", "--model", NO_MODEL, "--max-new-tokens", value, "hi"])
    assert ": max_new_tokens: must be an integer in 1..2147483647" in line, line


@FUZZ
@given(value=st.one_of(st.integers(max_value=0), st.integers(min_value=2**31, max_value=2**80)))
def test_a_workload_budget_past_int32_is_refused_naming_the_request(tmp_path, value):
    workload = tmp_path / "workload.json"
    workload.write_text(
        json.dumps(
            {
                "kind": "requests",
                "requests": [
                    {
                        "request_id": "a",
                        "arrival_us": 0,
                        "request": {"text": "hi", "generation": {"max_new_tokens": value}},
                    }
                ],
            }
        )
    )
    line = assert_refused(
        ["record", workload, "--out", tmp_path / "out.json", "--model", NO_MODEL], inputs=[workload], watch=[tmp_path]
    )
    assert "max_new_tokens: must be an integer in 1..2147483647" in line, line


def test_lab_run_never_replaces_a_directory_holding_other_files(lab_run, tmp_path):
    """A directory with a record.json used to be replaced whole, a person's files beside it included."""
    cases = {
        "notes beside a run": ("notes.txt", b"mine"),
        "a file in its plots": ("plots/notes.txt", b"mine"),
        "a directory in it": ("data/kept.json", b"{}"),
        "a record of something else": ("record.json", json.dumps({"format": "something else"}).encode()),
        "a record that is not JSON": ("record.json", b"{"),
    }
    for n, (what, (name, data)) in enumerate(cases.items()):
        out = tmp_path / f"run-{n}"
        shutil.copytree(lab_run.directory, out)
        (out / "plots").mkdir()
        (out / "plots" / "arms.png").write_bytes(b"png")
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(data)
        line = assert_refused(["lab", "run", "admission-slots-latency", "--out", out], inputs=[out / name], watch=[out])
        assert f": out: {out} is a non-empty directory that is not a lab run's" in line, f"{what}: {line}"
    link = tmp_path / "link-to-a-run"
    link.symlink_to(lab_run.directory)
    assert_refused(
        ["lab", "run", "admission-slots-latency", "--out", link],
        inputs=[lab_run.directory / "record.json"],
        watch=[lab_run.directory],
        field="out",
    )


def test_lab_run_may_replace_an_earlier_run_with_its_plots_and_report(lab_run, tmp_path):
    from experiments.experiment_execution import _check_replaceable

    earlier = tmp_path / "run"
    shutil.copytree(lab_run.directory, earlier)
    (earlier / "plots").mkdir()
    (earlier / "plots" / "arms.png").write_bytes(b"png")
    (earlier / "report.html").write_text("<!DOCTYPE html>")
    _check_replaceable(earlier)
    _check_replaceable(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    _check_replaceable(tmp_path / "empty")


@pytest.mark.parametrize(("processes", "process", "field"), [
    ("abc", "0", "JGPT_NUM_PROCESSES"), ("0", "0", "JGPT_NUM_PROCESSES"), ("2", "-1", "JGPT_PROCESS_ID"),
    ("2", "2", "JGPT_PROCESS_ID"), (str(2**70), "0", "JGPT_NUM_PROCESSES"), ("٣", "0", "JGPT_NUM_PROCESSES"),
])  # fmt: skip
def test_launcher_variables_that_are_not_a_process_layout_are_refused_naming_them(
    monkeypatch, processes, process, field
):
    """int("abc") was a ValueError traceback before jax.distributed started."""
    from training.sharding import initialize_distributed

    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1")
    monkeypatch.setenv("JGPT_NUM_PROCESSES", processes)
    monkeypatch.setenv("JGPT_PROCESS_ID", process)
    with pytest.raises(ApiError) as error:
        initialize_distributed()
    assert error.value.field == field


def test_a_command_line_input_that_ends_in_a_closed_pipe_is_read_whole(tmp_path):
    """`jgpt kvsim run <(cat input.json)`: the read is not refused for being a pipe."""
    fifo = tmp_path / "input"
    os.mkfifo(fifo)
    writer = threading.Thread(
        target=lambda: _write_ignoring_a_closed_reader(fifo, (DATA / "kvsim_worked_example.json").read_bytes())
    )
    writer.start()
    code, stdout, stderr = run_jgpt(["kvsim", "run", fifo])
    writer.join(timeout=10)
    assert code == 0 and "busy" in stdout, stderr


@FUZZ
@given(label=st.text(st.characters(codec="utf-8", categories=["Cc", "Cf", "Zl", "Zp"]), min_size=1, max_size=8))
def test_catalog_listing_prints_a_crafted_label_escaped_on_its_own_line(tmp_path, label):
    """A label holding ESC ] 0; ... BEL retitled the terminal, a CR or line break forged a row."""
    catalog = json.loads((Path(__file__).resolve().parent.parent / "checkpoints" / "catalog.json").read_text())
    catalog["models"][0]["label"] = f"x{label}y"
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(catalog))
    code, stdout, stderr = run_jgpt(["catalog", "--catalog", path])
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert len(lines) == 2 + len(catalog["models"]) and all(line.isprintable() for line in lines), stdout
    assert "x" + label.encode("unicode_escape").decode("ascii") + "y" in lines[2]


def test_an_output_name_of_the_longest_length_is_written(tmp_path):
    """A 255-byte name is a valid file, but its temporary `.NAME.xxxx.tmp` was too long to create."""
    out = tmp_path / ("r" * 250 + ".json")
    code, _, stderr = run_jgpt(["kvsim", "run", DATA / "kvsim_worked_example.json", "--out", out])
    assert code == 0 and json.loads(out.read_bytes())["events"], stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


TINY_TRAINING = [
    "--steps",
    "1",
    "--layers",
    "1",
    "--width",
    "32",
    "--ffn",
    "64",
    "--heads",
    "2",
    "--batch-size",
    "2",
    "--train-conversations",
    "20",
    "--quiet",
]


@pytest.mark.parametrize("held", [
    {"notes.txt": b"mine"}, {"run.json": b"my own run.json"}, {"holiday.tmp.png": b"png"},
    {".model.backup/f": b"x"}, {"run.json": b"{}", "notes.txt": b"mine"},
])  # fmt: skip
def test_train_never_writes_into_a_directory_holding_other_files(tmp_path, held):
    """`train --out DIR` replaced DIR/run.json and metrics.jsonl and swept DIR/*.tmp.png and DIR/.model.*
    of any directory; a refused run also left DIR/train.lock behind."""
    out = tmp_path / "mine"
    for name, data in held.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    line = assert_refused(["train", "--out", out, *TINY_TRAINING], inputs=[out / name for name in held], watch=[out])
    assert ": out: " in line and ("holds no earlier run's run.json" in line or "a training run does not write" in line)


def test_train_may_start_again_over_an_earlier_runs_files(tmp_path):
    from training.config import TrainingConfig
    from training.trainer import RunDirectory, _check_only_a_run

    run = RunDirectory(tmp_path / "run")
    _check_only_a_run(run)  # missing
    run.root.mkdir()
    (run.root / "train.lock").write_text("1")
    _check_only_a_run(run)  # empty but for the lock
    run.config.write_text(json.dumps(TrainingConfig().to_json()))
    for name in ("metrics.jsonl", "loss.png", ".run.json.x1.tmp", "loss.tmp.png"):
        (run.root / name).write_text("")
    (run.root / ".model.x1").mkdir()
    (run.root / "checkpoints").mkdir()
    _check_only_a_run(run)  # a run killed before its first checkpoint
