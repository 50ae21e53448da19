"""Concurrent and interrupted commands, as real processes: the train lock, SIGTERM cleanup, the resume sweep.

Every wait is bounded (`DEADLINE` seconds), so a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEADLINE = 240
TERMINATED = 128 + signal.SIGTERM
# Long enough never to finish while the tests look at it; checkpoints early so --resume has one.
ENDLESS = {
    "architecture": {"width": 32, "ffn": 64, "context": 64, "layers": 1, "heads": 2},
    "train_conversations": 200, "development_conversations": 16, "steps": 1_000_000, "batch_size": 4,
    "warmup_steps": 1, "log_every": 1, "eval_every": 1_000_000, "checkpoint_every": 3, "seed": 1,
}  # fmt: skip


def _wait_for(condition, what: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"the process ended (exit {process.returncode}) before {what}: {process.stderr.read()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _train(out: Path, config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "training", "train", "--config", str(config), "--out", str(out), "--quiet", *extra]


def _holder(out: Path) -> str:
    lock = out / "train.lock"
    return lock.read_text().strip() if lock.exists() else ""


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") or ".tmp" in p.name)


def _checkpointed(out: Path) -> bool:
    return (out / "checkpoints").is_dir() and any(p.name.isdigit() for p in (out / "checkpoints").iterdir())


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """A training run in progress (lock held, a checkpoint written), stopped at the end if a test did not."""
    root = tmp_path_factory.mktemp("lock")
    config, out = root / "endless.json", root / "run"
    config.write_text(json.dumps(ENDLESS))
    process = subprocess.Popen(_train(out, config), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _holder(out) == str(process.pid) and _checkpointed(out), "the first checkpoint", process)
        yield process, out, config
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(DEADLINE)


def test_train_lock_refuses_a_second_run_on_the_same_out_naming_the_holder(training):
    first, out, config = training
    metrics_before = (out / "run.json").read_bytes()
    second = subprocess.run(_train(out, config), cwd=REPO, capture_output=True, text=True, timeout=DEADLINE)
    assert second.returncode == 2, second.stderr
    assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
    assert f"in use by another jgpt train (process {first.pid})" in second.stderr
    resumed = subprocess.run(
        _train(out, config, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=DEADLINE
    )
    assert resumed.returncode == 2 and f"(process {first.pid})" in resumed.stderr
    assert first.poll() is None, "the refused runs must not disturb the running one"
    assert (out / "run.json").read_bytes() == metrics_before and _holder(out) == str(first.pid)


def test_sigterm_cleanup_of_a_training_run_and_resume_sweeps_stale_staging(training):
    first, out, config = training
    first.send_signal(signal.SIGTERM)
    assert first.wait(DEADLINE) == TERMINATED
    assert first.stderr.read().strip().endswith("terminated")
    assert _leftovers(out) == []
    # What SIGKILL during the model save leaves (no cleanup can run), and a killed atomic write:
    staging = out / ".model.k1ll3d"
    staging.mkdir()
    (staging / "manifest.json").write_text("{}")
    (out / ".run.json.abc123.tmp").write_text("{")
    resumed = subprocess.Popen(_train(out, config, "--resume"), cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for(lambda: _holder(out) == str(resumed.pid) and _leftovers(out) == [], "the resume's sweep", resumed)
    finally:
        resumed.send_signal(signal.SIGTERM)
        code = resumed.wait(DEADLINE)
    assert code == TERMINATED and _leftovers(out) == []
    assert all(json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())


def test_sigterm_cleanup_of_kvsim_run_leaves_no_temporary_record(tmp_path):
    computations = tmp_path / "computations.json"
    made = subprocess.run([sys.executable, "-m", "kvsim", "synthesize", "--requests", "4000", "--out", str(computations)],
                          cwd=REPO, capture_output=True, text=True, timeout=DEADLINE)  # fmt: skip
    assert made.returncode == 0, made.stderr
    system = {"max_requests": 64, "max_new_tokens_cap": 16, "scheduling": {"max_active_requests": 4},
              "kv_cache": {"device_kv_bytes": 1 << 26, "host_kv_bytes": 1 << 28, "retention_policy": "lru"},
              "transfer": {"link_bytes_per_us": 1000, "link_latency_us": 2},
              "compute_service": {"compute_flops_per_us": 1e6, "memory_bytes_per_us": 1e5}}  # fmt: skip
    (tmp_path / "input.json").write_text(json.dumps({"system": system, "computations": computations.name}))
    record = tmp_path / "record.json"
    run = subprocess.Popen([sys.executable, "-m", "kvsim", "run", str(tmp_path / "input.json"), "--out", str(record)],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for(lambda: any(tmp_path.glob(".record.json.*.tmp")), "the record's temporary file", run)
    finally:
        run.send_signal(signal.SIGTERM)
        code = run.wait(DEADLINE)
    assert code == TERMINATED, run.stderr.read()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["computations.json", "input.json"]


def test_sigterm_cleanup_of_an_artifact_save_removes_its_staging(tmp_path):
    """SIGTERM arriving while the weights are being written: the staging directory goes with it."""
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from jgpt.artifacts import artifact
        from jgpt.model.architecture import ModelArchitecture
        from jgpt.foundation.errors import run_guarded
        from jgpt.model.weights import initialize

        save = artifact._save_weights
        def save_then_wait(directory, weights):
            save(directory, weights)
            print("saving", flush=True)
            time.sleep({DEADLINE})
        artifact._save_weights = save_then_wait
        architecture = ModelArchitecture(vocabulary=260, width=8, ffn=16, context=8, layers=1, heads=2)
        weights, provenance = initialize(architecture, 0)
        sys.exit(run_guarded("save", lambda: artifact.save_artifact({str(tmp_path / "model")!r}, architecture,
                                                                    weights, provenance)))
    """)
    process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        assert process.stdout.readline().strip() == "saving", process.stderr.read()
        assert [p.name[:7] for p in tmp_path.iterdir()] == [".model."]  # the staging directory exists
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(DEADLINE)
    assert code == TERMINATED and process.stderr.read().strip() == "save: terminated"
    assert list(tmp_path.iterdir()) == []


def test_sigterm_cleanup_waits_for_a_deferred_block_then_terminates():
    """An orbax save runs under termination_deferred: SIGTERM lets it finish, then ends the command."""
    from jgpt.foundation.errors import run_guarded, termination_deferred

    steps, before = [], signal.getsignal(signal.SIGTERM)

    def command():
        with termination_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            steps.append("the save finished")
        steps.append("after the save")  # never reached: the held-back SIGTERM ends the command here

    assert run_guarded("test", command) == TERMINATED
    assert steps == ["the save finished"]
    assert signal.getsignal(signal.SIGTERM) == before  # run_guarded put the previous handler back


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed exception, reported
def test_a_sigterm_whose_exception_is_swallowed_still_ends_the_command():
    """Python runs a signal handler at the main thread's next bytecode; inside a garbage-collection callback
    (JAX registers one) its exception is printed and dropped. The command must end as terminated anyway: at
    the next `raise_if_terminated` (the train loop calls it every step) or, at the latest, when it returns."""
    import gc

    from jgpt.foundation.errors import raise_if_terminated, run_guarded

    def terminated_inside_a_collection(steps: list[str], check: bool):
        def callback(phase, info):
            if phase == "start":
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, before the callback returns

        def command():
            gc.callbacks.append(callback)
            try:
                gc.collect()
            finally:
                gc.callbacks.remove(callback)
            steps.append("after the collection")  # reached: the handler's exception was swallowed
            if check:
                raise_if_terminated()
                steps.append("after the check")  # never reached

        return command

    for check, expected in ((True, ["after the collection"]), (False, ["after the collection"])):
        steps: list[str] = []
        assert run_guarded("test", terminated_inside_a_collection(steps, check)) == TERMINATED
        assert steps == expected
    raise_if_terminated()  # run_guarded cleared the request when its command ended: nothing raised here
