"""The second red-team pass: the surfaces added after the first (tests/test_hostile_input.py).

* kvsim's streamed record (JSON Lines): one line made hostile, read by `replay`, `plot` and
  `perfetto`; cut short or signalled while it is written;
* a calibrated service with a `spread` and `finish` in a kvsim input: any value made hostile
  is run or refused cleanly, and what runs replays and draws;
* the launcher's environment of `jgpt train` (`JAX_COORDINATOR_ADDRESS`, `JAX_PLATFORMS`):
  each was a traceback, a native crash or a hang before.

Checks as tests/hostile.py makes them: exit 2 and one line naming the field, no traceback,
inputs byte-identical, nothing left behind.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.foundation.errors import ApiError
from tests.hostile import FUZZ, assert_clean, assert_refused, extreme_numbers, hostile_json, mutated_json, run_jgpt

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parent.parent
EXAMPLE = json.loads((DATA / "kvsim_worked_example.json").read_text())
DEADLINE = 120  # seconds a subprocess may take on a loaded 2-core machine


@pytest.fixture(scope="module")
def streamed_lines(tmp_path_factory) -> list[bytes]:
    """The worked example's streamed record, line by line (without their newlines)."""
    record = tmp_path_factory.mktemp("streamed") / "record.jsonl"
    code, _, stderr = run_jgpt(["kvsim", "run", DATA / "kvsim_worked_example.json", "--out", record, "--quiet"])
    assert code == 0, stderr
    return record.read_bytes().split(b"\n")[:-1]


VIEWERS = {
    "replay": lambda i, o: ["kvsim", "replay", i],
    "plot": lambda i, o: ["kvsim", "plot", i, "--out-dir", o],
    "perfetto": lambda i, o: ["kvsim", "perfetto", i, "--out", o],
}


@FUZZ
@given(data=st.data())
def test_a_streamed_record_with_a_hostile_line_is_read_or_refused_cleanly(streamed_lines, tmp_path, data):
    lines = list(streamed_lines)
    at = data.draw(st.integers(0, len(lines) - 1), label="line")
    lines[at] = data.draw(
        st.one_of(mutated_json(json.loads(lines[at])), hostile_json().filter(lambda b: b"\n" not in b))
    )
    directory = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example: what an accepted one wrote stays
    source = directory / "record.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    viewer = data.draw(st.sampled_from(sorted(VIEWERS)), label="viewer")
    argv = VIEWERS[viewer](source, directory / "view")
    code = assert_clean(argv, inputs=[source], watch=[directory], accepted=(0, 1) if viewer == "replay" else (0,))
    if code == 2 and at > 0:  # refused naming a line (with its head changed the file is read as a whole-JSON record)
        _, _, stderr = run_jgpt(argv)
        assert "error: record line " in stderr, stderr


def test_a_streamed_record_cut_inside_a_line_is_refused_naming_it(streamed_lines, tmp_path):
    source = tmp_path / "record.jsonl"
    source.write_bytes(b"\n".join(streamed_lines[:5]) + b"\n" + streamed_lines[5][:7])
    for argv in (VIEWERS[v](source, tmp_path / "out") for v in sorted(VIEWERS)):
        code, _, stderr = run_jgpt(argv)
        assert code == 2 and "record line 6: is cut off" in stderr, stderr


SPREAD = {"seed": 7, "prefill": [0.8, 1.0, 1.2], "decode": [0.5, 1.5]}
CALIBRATED = {
    "model": "calibrated",
    "prefill": {"fixed_us": 400, "per_position_us": 12, "per_slot_us": 3, "per_flop_us": 2e-06, "per_byte_us": 0,
                "after_idle_us": 250},
    "decode": {"fixed_us": 150, "per_batch_us": {"2": 40, "4": 120}, "per_slot_us": 0.5, "per_flop_us": 0,
               "per_byte_us": 0.0001, "after_idle_us": 0},
    "step_overhead_us": 30, "after_idle_min_us": 0, "slot_capacity": 256,
    "prefill_window_buckets": [16, 32, 64], "decode_batch_buckets": [1, 2, 4],
    "finish": {"fixed_us": 3, "per_byte_us": 0.001}, "spread": SPREAD,
}  # fmt: skip
CALIBRATED_EXAMPLE = EXAMPLE | {"system": EXAMPLE["system"] | {
    "compute_service": CALIBRATED,
    "transfer": {"model": "calibrated", "device_to_host": {"latency_us": 20, "per_byte_us": 0.001},
                 "host_to_device": {"latency_us": 35, "per_byte_us": 0.002}, "blocks_compute": True},
}}  # fmt: skip


def _in_service(path: tuple, value) -> bool:
    return path[:2] in (("system", "compute_service"), ("system", "transfer"))


@FUZZ
@given(data=st.data())
def test_a_hostile_calibrated_service_with_a_spread_runs_and_replays_or_is_refused_cleanly(tmp_path, data):
    numbers = data.draw(st.booleans(), label="a number at the edges")
    document = data.draw(mutated_json(
        CALIBRATED_EXAMPLE, (lambda p, v: _in_service(p, v) and type(v) in (int, float)) if numbers else _in_service,
        replacements=extreme_numbers() if numbers else None))  # fmt: skip
    directory = Path(tempfile.mkdtemp(dir=tmp_path))
    source = directory / "input.json"
    source.write_bytes(document)
    record = directory / data.draw(st.sampled_from(["record.json", "record.jsonl"]), label="record")
    if assert_clean(["kvsim", "run", source, "--out", record, "--quiet"], inputs=[source], watch=[directory]) == 0:
        code, stdout, stderr = run_jgpt(["kvsim", "replay", record])
        assert code == 0, stdout + stderr
        code, _, stderr = run_jgpt(["kvsim", "perfetto", record, "--out", directory / "trace.json"])
        assert code == 0 and json.loads((directory / "trace.json").read_text())["traceEvents"], stderr


def test_the_calibrated_fixture_runs(tmp_path):
    """The document the mutations above start from is valid: a refusal there is the mutation's doing."""
    source = tmp_path / "input.json"
    source.write_text(json.dumps(CALIBRATED_EXAMPLE))
    code, stdout, stderr = run_jgpt(["kvsim", "run", source, "--json"])
    assert code == 0 and json.loads(stdout)["outcomes"]["totals"], stderr


# -- signals while a streamed record is written ------------------------------------------------------


@pytest.fixture(scope="module")
def long_input(tmp_path_factory) -> Path:
    """A kvsim input whose run writes its record for seconds."""
    directory = tmp_path_factory.mktemp("long")
    made = subprocess.run([sys.executable, "-m", "kvsim", "synthesize", "--requests", "12000", "--out",
                           str(directory / "computations.json")], cwd=REPO, capture_output=True, text=True,
                          timeout=DEADLINE)  # fmt: skip
    assert made.returncode == 0, made.stderr
    system = {"max_requests": 12000, "max_new_tokens_cap": 4096, "scheduling": {"max_active_requests": 8},
              "kv_cache": {"device_kv_bytes": 1 << 30, "host_kv_bytes": 1 << 31},
              "transfer": {"link_bytes_per_us": 1000, "link_latency_us": 2},
              "compute_service": {"compute_flops_per_us": 1e8, "memory_bytes_per_us": 1e6}}  # fmt: skip
    (directory / "input.json").write_text(json.dumps({"system": system, "computations": "computations.json"}))
    return directory / "input.json"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_a_streamed_record_is_written_keeps_the_old_record(long_input, tmp_path, signum):
    record = tmp_path / "record.jsonl"
    record.write_text("an earlier record\n")
    # SIGINT as a terminal delivers it: an xdist worker ignores SIGINT, and a child would inherit that.
    run = subprocess.Popen([sys.executable, "-m", "kvsim", "run", str(long_input), "--out", str(record), "--quiet"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        _wait_for_a_written_temporary_file(tmp_path, run)
    finally:
        run.send_signal(signum)
        code = run.wait(DEADLINE)
    stderr = run.stderr.read()
    assert code == 128 + signum and "Traceback" not in stderr, stderr
    assert record.read_text() == "an earlier record\n" and [p.name for p in tmp_path.iterdir()] == ["record.jsonl"]


def _wait_for_a_written_temporary_file(directory: Path, process: subprocess.Popen) -> None:
    import time

    deadline = time.monotonic() + DEADLINE
    while not any(p.stat().st_size for p in directory.glob(".record.jsonl.*.tmp")):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "no temporary record was written"
        time.sleep(0.02)


# -- the launcher's environment ---------------------------------------------------------------------


@pytest.mark.parametrize("address", ["localhost", ":", "localhost:0", "[::1]:70000", "a host:1234", "host:12a"])
def test_a_coordinator_address_that_is_not_host_and_port_is_refused_naming_it(monkeypatch, address):
    """JAX splits the port off unchecked: 'localhost' was an IndexError, ':' a native crash, port 0 a hang."""
    from training.sharding import initialize_distributed

    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", address)
    monkeypatch.setenv("JGPT_NUM_PROCESSES", "1")
    monkeypatch.setenv("JGPT_PROCESS_ID", "0")
    with pytest.raises(ApiError) as error:
        initialize_distributed()
    assert error.value.field == "JAX_COORDINATOR_ADDRESS" and "HOST:PORT" in error.value.reason


def test_a_coordinator_outside_any_cluster_without_a_process_layout_is_refused_naming_it():
    """jax.distributed's ValueError ('Number of processes must be defined') was a traceback.

    In a fresh interpreter, as `jgpt train` joins before its first use of JAX: in this test process JAX's
    backend may already be up, and jax.distributed then refuses for that reason instead."""
    environment = {k: v for k, v in os.environ.items() if k not in ("JGPT_NUM_PROCESSES", "JGPT_PROCESS_ID")}
    environment["JAX_COORDINATOR_ADDRESS"] = "localhost:1234"
    probe = ("from jgpt.foundation.errors import ApiError\n"
             "from training.sharding import initialize_distributed\n"
             "try:\n    initialize_distributed()\n"
             "except ApiError as error:\n    print(error.field)\n    print(error.reason)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=DEADLINE)  # fmt: skip
    field, reason = (done.stdout.split("\n", 1) + [""])[:2]
    assert done.returncode == 0 and field == "JAX_COORDINATOR_ADDRESS" and "set JGPT_NUM_PROCESSES" in reason, (
        done.stderr
    )


TINY_TRAIN = ["train", "--steps", "1", "--batch-size", "2", "--layers", "1", "--width", "16", "--ffn", "16",
              "--heads", "2", "--context", "64", "--train-conversations", "20", "--quiet"]  # fmt: skip


@pytest.mark.parametrize(("command", "environment", "field"), [
    (["devices"], {"JAX_PLATFORMS": "no-such-backend"}, "JAX_PLATFORMS"),
    (TINY_TRAIN, {"JAX_PLATFORMS": "no-such-backend"}, "JAX_PLATFORMS"),
    (TINY_TRAIN, {"JAX_COORDINATOR_ADDRESS": "localhost", "JGPT_NUM_PROCESSES": "1", "JGPT_PROCESS_ID": "0"},
     "JAX_COORDINATOR_ADDRESS"),
])  # fmt: skip
def test_a_launcher_environment_jax_cannot_start_in_is_one_line_naming_the_variable(
    tmp_path, command, environment, field
):
    """A backend JAX cannot start was a RuntimeError traceback from `jgpt devices` and `jgpt train`."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "jgpt", *command, *(["--out", str(out)] if command[0] == "train" else [])]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=DEADLINE,
                          env=os.environ | environment)  # fmt: skip
    assert done.returncode == 2 and done.stderr.splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith(f"jgpt {command[0]}: error: {field}: "), done.stderr
    assert not out.exists()


def _full_after_two_chunks(descriptor, *args, **kwargs):
    """os.fdopen whose stream takes two chunks of a streamed record, then fails as a full disk does."""

    class FillsUp:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            os.close(descriptor)

        def writelines(self, chunks):
            for taken, _ in enumerate(chunks):
                if taken == 2:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return FillsUp()


def test_a_disk_that_fills_while_a_streamed_record_is_written_keeps_the_old_record(tmp_path, monkeypatch):
    """The simulation's thread, blocked handing over its next chunk, is stopped; nothing is left behind."""
    from jgpt.foundation import identity

    source, out = tmp_path / "input.json", tmp_path / "record.jsonl"
    source.write_bytes((DATA / "kvsim_worked_example.json").read_bytes())
    out.write_bytes(b"the previous record\n")
    threads = threading.active_count()
    monkeypatch.setattr(identity.os, "fdopen", _full_after_two_chunks)
    line = assert_refused(["kvsim", "run", source, "--out", out, "--quiet"], inputs=[source, out], watch=[tmp_path])
    assert line.endswith(f": error: {out}: cannot write: No space left on device"), line
    assert threading.active_count() == threads


@pytest.mark.parametrize("what", ["a directory", "a device", "a FIFO"])
def test_training_data_that_is_not_a_regular_file_is_refused_as_such(tmp_path, what):
    """It was refused as 'file not found', which a directory or /dev/zero is not."""
    data = {"a directory": tmp_path / "corpus", "a device": Path("/dev/zero"), "a FIFO": tmp_path / "fifo"}[what]
    if what == "a directory":
        data.mkdir()
    elif what == "a FIFO":
        os.mkfifo(data)
    out = tmp_path / "run"
    line = assert_refused([*TINY_TRAIN, "--tokenizer", "bpe", "--data", data, "--out", out], watch=[tmp_path])
    assert line.endswith(f": error: data: {data} is not a regular file"), line


def test_import_hf_names_the_config_when_its_sizes_do_not_fit_together(tmp_path):
    """Found by the import fuzz test at seed 31: n_embd 1 with 2 heads was refused naming 'width', a field of jgpt's."""
    from tests.test_path_confinement import tiny_gpt2

    model = tiny_gpt2(tmp_path / "hf")
    config = json.loads((model / "config.json").read_text()) | {"n_embd": 1, "n_head": 2}
    (model / "config.json").write_text(json.dumps(config))
    line = assert_refused(["import-hf", model, "--out", tmp_path / "out"], inputs=[model / "config.json"],
                          watch=[tmp_path])  # fmt: skip
    assert ": error: config.json: describes no valid architecture: width: 1 is not divisible by heads=2" in line, line
