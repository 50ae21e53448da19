"""Whole training runs of a tiny model through the command line.

Must-shows: a SIGKILLed run resumed with --resume ends bitwise equal to an
uninterrupted run; four data-parallel devices follow the one-device loss curve
within 1e-5 relative per step; bad input is one clear error and leaves nothing
--resume could pick up; the artifact's provenance is complete and reproducible.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jgpt.artifacts.artifact import load_artifact
from jgpt.cli.main import main as jgpt
from training import conversation_corpus
from training.provenance import source_sha256

REPO = Path(__file__).resolve().parent.parent
TINY = {
    "architecture": {"width": 32, "ffn": 64, "context": 100, "layers": 2, "heads": 2},
    "train_conversations": 300,
    "development_conversations": 24,
    "steps": 120,
    "batch_size": 8,
    "warmup_steps": 10,
    "log_every": 1,
    "eval_every": 60,
    "checkpoint_every": 30,
    "selection": "final",
    "seed": 5,
}
KILL_AFTER_CHECKPOINT = 30


def train_command(out: Path, config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "training", "train", "--config", str(config), "--out", str(out), "--quiet", *extra]


def environment(devices: int = 1) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def run(out: Path, config: Path, *extra: str, devices: int = 1) -> dict:
    done = subprocess.run(train_command(out, config, *extra), cwd=REPO, env=environment(devices),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def losses(out: Path) -> np.ndarray:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, TINY["steps"] + 1))
    return np.array([r["loss"] for r in records])


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, config) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    return out, run(out, config)


def test_sigkill_then_resume_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path, config, uninterrupted):
    out = tmp_path / "run"
    process = subprocess.Popen(train_command(out, config), cwd=REPO, env=environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    checkpoint = out / "checkpoints" / str(KILL_AFTER_CHECKPOINT)
    while not checkpoint.is_dir() and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (out / "model").exists()
    assert not (out / "checkpoints" / str(TINY["steps"])).exists()

    resumed = run(out, config, "--resume")
    expected_out, expected = uninterrupted
    assert resumed["checkpoint_sha256"] == expected["checkpoint_sha256"]
    a, b = load_artifact(out / "model"), load_artifact(expected_out / "model")
    for name, tensor in a.weights.as_dict().items():
        assert np.array_equal(np.asarray(tensor), np.asarray(b.weights.as_dict()[name])), name
    assert np.array_equal(losses(out), losses(expected_out))


def test_four_devices_follow_the_one_device_loss_curve(tmp_path, config, uninterrupted):
    out = tmp_path / "run"
    summary = run(out, config, devices=4)
    assert summary["devices"] == 4 and uninterrupted[1]["devices"] == 1
    one, four = losses(uninterrupted[0]), losses(out)
    np.testing.assert_allclose(four, one, rtol=1e-5, atol=0)


def test_products_are_xlas_unless_blas_is_asked_for(tmp_path, config, uninterrupted):
    """The default is the pure-JAX reference: --products xla is the default run bit for bit. BLAS rounds
    differently (so its curve is not bitwise the same) but computes the same products: within 1e-3 relative
    over the first 30 steps, before the rounding differences compound."""
    one = losses(uninterrupted[0])
    xla, blas = tmp_path / "xla", tmp_path / "blas"
    run(xla, config, "--products", "xla")
    run(blas, config, "--products", "blas")
    assert np.array_equal(losses(xla), one)
    assert not np.array_equal(losses(blas), one)
    np.testing.assert_allclose(losses(blas)[:30], one[:30], rtol=1e-3, atol=0)
    assert json.loads((blas / "run.json").read_text())["products"] == "blas"


def test_attention_is_full_unless_causal_blocks_is_asked_for(tmp_path, config, uninterrupted):
    """--attention full is the default run bit for bit; causal_blocks and causal_blas (two blocks at this
    context of 100: 64 queries, then 36) skip the keys after each block and follow the full attention within
    1e-4 relative over the first 30 steps (the softmax sums fewer terms, so it may round differently)."""
    one = losses(uninterrupted[0])
    run(tmp_path / "full", config, "--attention", "full")
    assert np.array_equal(losses(tmp_path / "full"), one)
    for attention in ("causal_blocks", "causal_blas"):
        run(tmp_path / attention, config, "--attention", attention)
        np.testing.assert_allclose(losses(tmp_path / attention)[:30], one[:30], rtol=1e-4, atol=0)
        assert json.loads((tmp_path / attention / "run.json").read_text())["attention"] == attention


@pytest.mark.parametrize(
    "choice, refusal",
    [(("--products", "blas"), "products: blas needs one CPU device"),
     (("--attention", "causal_blas"), "attention: causal_blas needs one CPU device")],
)  # fmt: skip
def test_blas_kernels_on_several_devices_are_refused(tmp_path, config, choice, refusal):
    done = subprocess.run(train_command(tmp_path / "run", config, *choice), cwd=REPO,
                          env=environment(2), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert refusal in done.stderr
    assert not (tmp_path / "run").exists()


def test_provenance_is_complete_and_its_data_hash_reproduces_from_the_generator(uninterrupted):
    out, summary = uninterrupted
    provenance = load_artifact(out / "model").provenance
    assert set(provenance) == {"type", "kind", "seed", "step", "selection", "development_loss", "data_sha256",
                               "source_sha256", "preparation_run_sha256", "init_from",
                               "learning_rate_schedule"}  # fmt: skip
    assert provenance["init_from"] is None  # initialized weights, no parent
    assert all(value not in (None, "", {}) for name, value in provenance.items() if name != "init_from")
    assert provenance["learning_rate_schedule"] == {
        "warmup_steps": TINY["warmup_steps"], "schedule_steps": TINY["steps"], "steps": TINY["steps"],
        "peak_learning_rate": 3e-3, "final_learning_rate": 3e-3 * 0.05, "held_after_step": None,
    }  # fmt: skip
    assert (provenance["kind"], provenance["seed"], provenance["step"]) == ("conversations", 5, TINY["steps"])
    corpus = conversation_corpus.generate(5, TINY["train_conversations"], TINY["development_conversations"], 101)
    assert provenance["data_sha256"] == corpus.data_sha256
    now = source_sha256()
    assert set(provenance["source_sha256"]) == set(now)
    # The training package's own files must hash as they do now (the model core may be edited concurrently).
    assert {k: v for k, v in provenance["source_sha256"].items() if k.startswith("training/")} == {
        k: v for k, v in now.items() if k.startswith("training/")
    }
    assert (
        "training/step.py" in provenance["source_sha256"] and "jgpt/model/transformer.py" in provenance["source_sha256"]
    )
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_reports_the_training_development_loss_and_exact_match_per_skill(uninterrupted, capsys):
    out, _ = uninterrupted
    code = jgpt(
        ["eval", "--model", str(out / "model"), "--json", "--conversations", str(TINY["development_conversations"])]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    provenance = load_artifact(out / "model").provenance
    assert report["development_loss"] == pytest.approx(provenance["development_loss"], rel=1e-6)
    assert report["development_bits_per_byte"] > 0
    assert set(report["skills"]) == {"reverse", "sort", "add", "count", "recall"}
    held_out = conversation_corpus.split_conversations(
        TINY["seed"], "development", TINY["development_conversations"], TINY["architecture"]["context"] + 1
    )
    scored = lambda skill: sum(e.skill == skill for c in held_out for e in c.exchanges)
    assert {skill: s["exercises"] for skill, s in report["skills"].items()} == {
        skill: scored(skill) for skill in report["skills"]
    }
    assert all(0 <= s["exact_match"] <= 1 for s in report["skills"].values())


def test_exact_match_agrees_with_a_naive_full_recompute_greedy_loop(uninterrupted):
    import jax

    from inference.execution import ModelExecution
    from jgpt.model.transformer import forward
    from jgpt.tokenizers.tokenizer_file import load_tokenizer
    from training.corpus import held_out_conversations
    from training.evaluation import exact_match

    artifact = load_artifact(uninterrupted[0] / "model")
    tokenizer = load_tokenizer(artifact.tokenizer_path)
    held_out = conversation_corpus.split_conversations(5, "development", 4, 101)
    exercises = held_out_conversations(tokenizer, held_out, 101).exercises
    # The whole sequence each time, no cache, right-padded to the context as test_inference's reference is:
    # causal attention never lets a position see the padding after it, and one compiled program serves every
    # length (the forward run op by op took a second a token here, 61 s of this test).
    full_pass = jax.jit(forward, static_argnums=1)
    naive: dict[str, list[bool]] = {}
    for exercise in exercises:
        expected = [*tokenizer.encode_text(exercise.answer), tokenizer.turn_end_id]
        ids = list(exercise.prompt)
        for _ in expected:
            padded = np.zeros((1, artifact.architecture.context), np.int32)
            padded[0, : len(ids)] = ids
            logits = full_pass(artifact.weights, artifact.architecture, padded).logits
            ids.append(int(np.argmax(logits[0, len(ids) - 1])))
        naive.setdefault(exercise.skill, []).append(ids[len(exercise.prompt) :] == expected)
    report = exact_match(ModelExecution.from_artifact(artifact, tokenizer), tokenizer, exercises)
    assert {skill: r["exact_match"] for skill, r in report.items()} == {
        skill: sum(marks) / len(marks) for skill, marks in naive.items()
    }


def bad_input_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**TINY, "learning_rat": 0.1}))
    return {
        "missing data file": (["--data", str(tmp_path / "absent.txt")], "data: file not found"),
        "empty data file": (["--data", str(empty)], "is empty"),
        "unknown config key": (["--config", str(unknown)], "unknown keys: learning_rat"),
        "context too long": (["--context", "101"], "context: 101 is longer than the architecture allows (100)"),
        "unknown products": (["--products", "mkl"], "argument --products: invalid choice: 'mkl'"),
        "unknown attention": (["--attention", "flash"], "argument --attention: invalid choice: 'flash'"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing data file",
        "empty data file",
        "unknown config key",
        "context too long",
        "unknown products",
        "unknown attention",
    ],
)
def test_bad_input_is_one_clear_error_and_leaves_nothing_to_resume(tmp_path, config, case, capsys):
    arguments, message = bad_input_cases(tmp_path)[case]
    out = tmp_path / "run"
    code = jgpt(["train", "--config", str(config), "--out", str(out), "--quiet", *arguments])
    error = capsys.readouterr().err
    assert code == 2
    assert message in error and error.startswith("jgpt train: error:") and error.count("\n") == 1
    assert "Traceback" not in error
    assert not out.exists()
    # Nothing to resume from: --resume says so instead of continuing a partial run.
    assert jgpt(["train", "--config", str(config), "--out", str(out), "--quiet", "--resume"]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
