"""Training and inference over a 2-D device mesh (data x model) on 8 emulated CPU devices.

Must-shows: data parallel plus FSDP-style sharding of weights and optimizer
state follows the one-device loss curve within 1e-5 relative per step; tensor-
parallel inference gives the one-device logits (within the state tolerance)
and the same ids; each device stores 1/model of the sharded weights and KV
state. The device count is fixed when jax starts, so the measurements run in a
child process (this file run as a script) and the tests read its JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
DEVICES, MODEL_AXIS = 8, 2
STEPS = 8
# The float32 state tolerance of the inference tests (test_inference.py): cached against full-prefix logits.
STATE_TOLERANCE = 1e-5
TINY_RUN = {
    "architecture": {"width": 32, "ffn": 64, "context": 64, "layers": 2, "heads": 2},
    "train_conversations": 200, "development_conversations": 16, "steps": 6, "batch_size": 8, "warmup_steps": 2,
    "log_every": 1, "eval_every": 3, "checkpoint_every": 3, "selection": "final", "seed": 3,
}  # fmt: skip


def environment(devices: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


@pytest.fixture(scope="module")
def measured() -> dict:
    done = subprocess.run([sys.executable, __file__], cwd=REPO, env=environment(DEVICES), capture_output=True, check=False,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_data_by_model_mesh_follows_the_one_device_loss_curve(measured):
    one, mesh = np.array(measured["losses_one_device"]), np.array(measured["losses_mesh"])
    assert measured["mesh_shape"] == {"data": DEVICES // MODEL_AXIS, "model": MODEL_AXIS}
    assert len(one) == STEPS and not np.array_equal(one, np.full_like(one, one[0]))
    np.testing.assert_allclose(mesh, one, rtol=1e-5, atol=0)


def test_weights_and_optimizer_moments_are_split_fsdp_style(measured):
    # Matrices split over data (width) and model (heads, units): 1/8 of each on every device.
    assert measured["query_spec"] == [None, "data", "model"]
    assert measured["moment_spec"] == measured["query_spec"]
    assert measured["matrix_bytes_per_device"] * DEVICES == measured["matrix_bytes"]


def test_tensor_parallel_inference_gives_the_one_device_logits_and_ids(measured):
    assert measured["prefill_logit_error"] < STATE_TOLERANCE
    assert measured["decode_logit_error"] < STATE_TOLERANCE
    assert measured["ids_one_device"] == measured["ids_tensor_parallel"]
    assert len(measured["ids_one_device"][0]) == 12


def test_tensor_parallel_weights_and_kv_state_are_divided_by_the_model_axis(measured):
    # Heads over the model axis; the 2 rows do not divide the 4 data-axis devices, so rows stay whole.
    assert measured["kv_spec"] == [None, None, "model"]
    assert measured["kv_bytes_per_device"] * MODEL_AXIS == measured["kv_bytes"]
    # Every weight matrix splits; what stays whole on each device is the norm scales and width-sized biases.
    whole, split = measured["weight_bytes"], measured["weight_bytes_per_device"]
    assert split == (whole - measured["replicated_bytes"]) // MODEL_AXIS + measured["replicated_bytes"]
    assert split < 0.52 * whole


def test_training_command_on_a_mesh_follows_one_device(tmp_path):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY_RUN))

    def losses(devices: int, *extra: str) -> list[float]:
        out = tmp_path / f"run{devices}"
        command = [
            sys.executable,
            "-m",
            "training",
            "train",
            "--config",
            str(config),
            "--out",
            str(out),
            "--quiet",
            *extra,
        ]
        done = subprocess.run(
            command, cwd=REPO, env=environment(devices), capture_output=True, text=True, timeout=600, check=False
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["devices"] == devices
        return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]

    np.testing.assert_allclose(losses(4, "--model-axis", "2"), losses(1), rtol=1e-5, atol=0)


def test_a_model_axis_that_does_not_divide_the_devices_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "training", "train", "--out", str(tmp_path / "run"), "--model-axis", "3"],
                          cwd=REPO, env=environment(1), capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2 and "model_axis: 3 does not divide the 1 devices" in done.stderr
    assert not (tmp_path / "run").exists()


def _train(mesh, steps: int):
    """Losses of `steps` updates of a tiny GPT over `mesh`, and the final state (as the trainer places it)."""
    import jax
    import jax.numpy as jnp

    from jgpt.model.architecture import ModelArchitecture
    from jgpt.model.weights import initialize
    from training import optimizer, sharding
    from training.batches import TokenStream
    from training.config import TrainingConfig
    from training.step import make_train_step, start

    architecture = ModelArchitecture(vocabulary=260, width=32, ffn=64, context=16, layers=2, heads=4)
    adamw = optimizer.adamw(TrainingConfig(steps=20, warmup_steps=2))
    state = start(initialize(architecture, 0)[0], adamw)
    placement = sharding.state_shardings(state, mesh)
    state = jax.device_put(state, placement)
    tokens = np.random.default_rng(0).integers(0, 260, 4000, dtype=np.int32)
    data = jax.device_put(TokenStream(jnp.asarray(tokens), architecture.context), sharding.replicated(mesh))
    step = make_train_step(architecture, adamw, jax.random.key(1), 8, sharding.batch_sharding(mesh), True, placement)
    losses = []
    for _ in range(steps):
        state, metrics = step(state, data)
        losses.append(float(metrics["loss"]))
    return losses, state


def _infer(mesh) -> dict:
    import jax

    from inference.execution import ModelExecution
    from inference.generation import generate
    from inference.policy import GenerationPolicy, InferenceRequest
    from inference.tensor_parallel import TensorParallelExecution
    from jgpt.model.architecture import ModelArchitecture
    from jgpt.model.kv_state import StateIdentity
    from jgpt.model.weights import initialize
    from jgpt.runtime.mesh import addressable_bytes

    architecture = ModelArchitecture(vocabulary=260, width=32, ffn=64, context=64, layers=2, heads=4)
    one = ModelExecution(initialize(architecture, 3)[0], architecture, StateIdentity("c", "t", "float32"))
    split = TensorParallelExecution.over(one, mesh)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    (logits_one, state_one), (logits_split, state_split) = one.prefill(prompts), split.prefill(prompts)
    (next_one, _), (next_split, _) = one.decode(state_one, [4, 5]), split.decode(state_split, [4, 5])
    requests = [InferenceRequest(f"r{i}", p, GenerationPolicy(12)) for i, p in enumerate(prompts)]
    ids = lambda execution: [list(r.output_ids) for r in generate(execution, requests).responses]
    error = lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    replicated = [x for x in jax.tree.leaves(split.weights) if x.sharding.is_fully_replicated]
    return {
        "prefill_logit_error": error(logits_one, logits_split),
        "decode_logit_error": error(next_one, next_split),
        "ids_one_device": ids(one),
        "ids_tensor_parallel": ids(split),
        "kv_spec": list(state_split.keys.sharding.spec),
        "kv_bytes": state_split.keys.nbytes,
        "kv_bytes_per_device": addressable_bytes(state_split.keys),
        "weight_bytes": sum(x.nbytes for x in jax.tree.leaves(split.weights)),
        "weight_bytes_per_device": addressable_bytes(split.weights),
        "replicated_bytes": sum(x.nbytes for x in replicated),
    }


def _measure() -> dict:
    import jax

    from jgpt.runtime.mesh import addressable_bytes, mesh

    assert jax.device_count() == DEVICES
    grid = mesh(MODEL_AXIS)
    losses_one, _ = _train(mesh(1, jax.devices()[:1]), STEPS)
    losses_mesh, state = _train(grid, STEPS)
    matrices = [state.weights.query, state.weights.ff_up, state.weights.ff_down, state.weights.attention_output]
    return {
        "mesh_shape": dict(grid.shape),
        "losses_one_device": losses_one,
        "losses_mesh": losses_mesh,
        "query_spec": list(state.weights.query.sharding.spec),
        "moment_spec": list(state.optimizer_state[1][0].mu.query.sharding.spec),
        "matrix_bytes": sum(x.nbytes for x in matrices),
        "matrix_bytes_per_device": addressable_bytes(matrices),
        **_infer(grid),
    }


if __name__ == "__main__":
    print(json.dumps(_measure()))
