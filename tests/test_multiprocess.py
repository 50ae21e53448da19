"""Training across processes: two processes on localhost joined by `jax.distributed`, collectives over gloo.

Must-show: the two processes, each with one CPU device, train the same steps
as one process with one device and end with the same weights (within float32
reduction-order noise), with weights and Adam moments split FSDP-style across
the processes. Each process is this file run as a script; the coordinator's
address and the process id come from the environment, as a launcher sets them.
The same holds for `python -m training train` itself, which also writes one
run (process 0's files, every process's checkpoint shards) and resumes it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PROCESSES, STEPS = 2, 5
# Per weight, after STEPS Adam updates: the gradient all-reduce sums in another order than one device does.
WEIGHT_TOLERANCE = 1e-5
TINY_RUN = {
    "architecture": {"width": 32, "ffn": 64, "context": 64, "layers": 2, "heads": 2},
    "train_conversations": 200, "development_conversations": 16, "steps": 4, "batch_size": 8, "warmup_steps": 1,
    "log_every": 1, "eval_every": 2, "checkpoint_every": 2, "selection": "final", "seed": 3,
}  # fmt: skip
RUN_FILES = ["checkpoints", "loss.png", "metrics.jsonl", "model", "run.json", "train.lock"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(arguments: list[list[str]], env: dict[str, str]) -> list[subprocess.Popen]:
    """`python ARGUMENTS...` per argument list, the i-th as process i."""
    from training.sharding import PROCESS_ID_ENV

    return [
        subprocess.Popen([sys.executable, *args], cwd=REPO, env=env | {PROCESS_ID_ENV: str(i)}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for i, args in enumerate(arguments)
    ]  # fmt: skip


def _finished(children: list[subprocess.Popen]) -> list[tuple[str, str]]:
    """Each child's (stdout, stderr), once all have exited 0."""
    outputs = [child.communicate(timeout=600) for child in children]
    for child, (_, stderr) in zip(children, outputs):
        assert child.returncode == 0, stderr
    return outputs


def _distributed_environment() -> dict[str, str]:
    from training.sharding import COORDINATOR_ENV, PROCESSES_ENV

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return env | {COORDINATOR_ENV: f"localhost:{_free_port()}", PROCESSES_ENV: str(PROCESSES)}


def test_two_processes_train_the_same_steps_to_the_same_weights_as_one(tmp_path):
    outputs = _finished(_launch([[__file__, str(tmp_path / f"process{i}.npz")] for i in range(PROCESSES)],
                                _distributed_environment()))  # fmt: skip
    reports = [json.loads(stdout.splitlines()[-1]) for stdout, _ in outputs]  # gloo prints its connections first
    assert [r["process_index"] for r in reports] == [0, 1]
    assert all(r["devices"] == PROCESSES and r["local_devices"] == 1 for r in reports)
    assert reports[0]["query_spec"][:2] == [None, "data"]  # the width split across the two processes
    assert reports[0]["losses"] == reports[1]["losses"]  # one global loss, seen by both

    one_losses, one_weights, _ = _train(None)
    np.testing.assert_allclose(reports[0]["losses"], one_losses, rtol=1e-5, atol=0)
    worst = 0.0
    for i in range(PROCESSES):
        gathered = np.load(tmp_path / f"process{i}.npz")
        assert sorted(gathered) == sorted(one_weights)
        for name, value in one_weights.items():
            np.testing.assert_allclose(gathered[name], value, rtol=0, atol=WEIGHT_TOLERANCE, err_msg=name)
            worst = max(worst, float(np.max(np.abs(gathered[name] - value))))
        assert any(not np.array_equal(gathered[name], _initial()[name]) for name in one_weights)  # it did train
    relative = np.max(np.abs(np.array(reports[0]["losses"]) / one_losses - 1))
    print(f"2 processes vs 1: max abs weight difference {worst:.2e}, max relative loss difference {relative:.2e}")


def test_jgpt_train_over_two_processes_writes_one_run_reaches_one_process_weights_and_resumes(tmp_path):
    from jgpt.artifacts.artifact import load_artifact

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY_RUN))
    train = lambda out, *flags: [
        "-m",
        "training",
        "train",
        "--config",
        str(config),
        "--out",
        str(out),
        "--quiet",
        *flags,
    ]
    two, one = tmp_path / "two", tmp_path / "one"
    alone = _launch([train(one)], {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    outputs = _finished(_launch([train(two)] * PROCESSES, _distributed_environment()) + alone)

    summaries = [stdout[stdout.find("{\n") :] if "{\n" in stdout else "" for stdout, _ in outputs]  # gloo prints first
    assert json.loads(summaries[0])["devices"] == PROCESSES and summaries[1] == ""  # process 0 alone reports
    assert sorted(path.name for path in two.iterdir()) == sorted(path.name for path in one.iterdir()) == RUN_FILES
    assert [record["step"] for record in _metrics(two)] == list(range(1, TINY_RUN["steps"] + 1))  # written once
    last = two / "checkpoints" / str(TINY_RUN["steps"])
    assert {path.name for path in last.rglob("ocdbt.process_*")} >= {f"ocdbt.process_{i}" for i in range(PROCESSES)}
    distributed, single = (load_artifact(run / "model").weights.as_dict() for run in (two, one))
    worst = max(float(np.max(np.abs(np.asarray(distributed[k]) - np.asarray(single[k])))) for k in single)
    assert worst <= WEIGHT_TOLERANCE

    # Resume across processes: from the checkpoint before the last, to the same weights as the run uninterrupted.
    shutil.rmtree(last)
    shutil.rmtree(two / "model")
    _finished(_launch([train(two, "--resume")] * PROCESSES, _distributed_environment()))
    resumed = load_artifact(two / "model").weights.as_dict()
    assert all(np.array_equal(np.asarray(resumed[k]), np.asarray(distributed[k])) for k in distributed)
    assert [record["step"] for record in _metrics(two)] == list(range(1, TINY_RUN["steps"] + 1))
    print(f"jgpt train, 2 processes vs 1: max abs weight difference {worst:.2e}; resumed over 2 processes: identical")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _architecture():
    from jgpt.model.architecture import LlamaArchitecture

    return LlamaArchitecture(vocabulary=260, width=32, ffn=64, context=16, layers=2, heads=2)


def _initial() -> dict:
    from jgpt.model.weights import initialize

    return {k: np.asarray(v) for k, v in initialize(_architecture(), 0)[0].as_dict().items()}


def _train(mesh):
    """(losses, weights as numpy, the query weight's PartitionSpec) of STEPS updates over `mesh` (None: this process's first device)."""
    import jax
    import jax.numpy as jnp

    from jgpt.model.weights import initialize
    from jgpt.runtime.mesh import batch_sharding, replicated
    from jgpt.runtime.mesh import mesh as device_mesh
    from training import optimizer, sharding
    from training.batches import TokenStream
    from training.config import TrainingConfig
    from training.step import make_train_step, start

    mesh = device_mesh(1, jax.local_devices()[:1]) if mesh is None else mesh
    architecture = _architecture()
    adamw = optimizer.adamw(TrainingConfig(steps=20, warmup_steps=1))
    state = start(initialize(architecture, 0)[0], adamw)
    placement = sharding.state_shardings(state, mesh)
    state = jax.device_put(state, placement)
    tokens = np.random.default_rng(0).integers(0, 260, 3000, dtype=np.int32)
    data = jax.device_put(TokenStream(jnp.asarray(tokens), architecture.context), replicated(mesh))
    step = make_train_step(architecture, adamw, jax.random.key(1), 8, batch_sharding(mesh), True, placement)
    losses = []
    for _ in range(STEPS):
        state, metrics = step(state, data)
        losses.append(float(metrics["loss"]))
    weights = {k: np.asarray(v) for k, v in sharding.to_host(state.weights).as_dict().items()}
    return losses, weights, list(state.weights.query.sharding.spec)


def _process(out: str) -> None:
    import jax

    from jgpt.runtime.mesh import mesh
    from training import sharding

    sharding.initialize_distributed()
    grid = mesh(1)  # both processes' devices on the data axis
    losses, weights, spec = _train(grid)
    np.savez(out, **weights)
    print(json.dumps({
        "process_index": jax.process_index(), "devices": jax.device_count(), "local_devices": jax.local_device_count(),
        "losses": losses, "query_spec": spec,
    }))  # fmt: skip


if __name__ == "__main__":
    _process(sys.argv[1])
