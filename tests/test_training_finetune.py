"""Fine-tuning (`jgpt train --init-from MODEL`), resume from the run's own configuration, and extension.

Must-shows: a run --init-from a parent artifact takes its first step from the parent's weights (the
first logged loss is the parent's loss on that batch, computed here with the forward pass and a float64
cross-entropy) on a GPT parent (learned positions) with the built-in conversations and a Llama parent
(rotary positions, grouped heads) with a text file; its provenance names the parent's identities; an
interrupted fine-tuning run resumed with `--resume` alone ends bitwise equal to an uninterrupted one; a
finished run extended with `--resume --steps M` is bitwise the run configured with that schedule from the
start; a resume given a differing flag names the field, the recorded value and the given one.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jgpt.artifacts.artifact import load_artifact, save_artifact
from jgpt.artifacts.catalog import load_model
from jgpt.cli.main import main as jgpt
from jgpt.foundation.errors import ApiError
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.weights import initialize
from jgpt.tokenizers.tokenizer import Tokenizer
from tests.test_training_run import REPO, environment, run, train_command
from training.config import TrainingConfig

PARENTS = {
    "gpt": ModelArchitecture(vocabulary=260, width=32, ffn=64, context=100, layers=2, heads=2),
    "llama": LlamaArchitecture(vocabulary=260, width=32, ffn=64, context=48, layers=2, heads=4, kv_heads=2),
}
# The parents' seed differs from the runs' own: weights initialized from the run's seed would not be the parent's.
PARENT_SEED, RUN_SEED = 11, 5
RECIPE = {"steps": 40, "batch_size": 8, "warmup_steps": 4, "learning_rate": 1e-3, "log_every": 1, "eval_every": 20,
          "checkpoint_every": 20, "selection": "final", "seed": RUN_SEED}  # fmt: skip
CONVERSATIONS = {"train_conversations": 200, "development_conversations": 16}
SENTENCES = ["the cat sat on the mat. ", "a dog ran to the park and back. ", "notes on training small models. "]


def losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.fixture(scope="module")
def parents(tmp_path_factory) -> dict[str, Path]:
    """A random-weight artifact of each family, saved with the byte tokenizer."""
    root = tmp_path_factory.mktemp("parents")
    for name, architecture in PARENTS.items():
        weights, provenance = initialize(architecture, PARENT_SEED)
        save_artifact(root / name, architecture, weights, provenance, Tokenizer.bytes_only())
    return {name: root / name for name in PARENTS}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "notes.txt"
    path.write_text("".join(SENTENCES[i % 3] + f"line {i}. " for i in range(200)))
    return path


def config_file(directory: Path, **fields) -> Path:
    path = directory / "finetune.json"
    path.write_text(json.dumps({**RECIPE, **fields}))
    return path


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory, parents, text_file) -> dict[str, tuple[Path, Path, dict]]:
    """(config file, run directory, summary) of an uninterrupted fine-tuning run from each parent: the GPT
    on the built-in conversations, the Llama on the text file."""
    runs = {}
    for name, data in (("gpt", CONVERSATIONS), ("llama", {"data": str(text_file)})):
        root = tmp_path_factory.mktemp(name)
        config = config_file(root, init_from=str(parents[name]), **data)
        runs[name] = (config, root / "run", run(root / "run", config))
    return runs


def parents_loss_on_the_first_batch(out: Path) -> float:
    """The parent's mean cross-entropy on the batch of step 0 of the run under `out`: the batch drawn as the
    train step draws it, the logits of the forward pass, the loss in float64 here."""
    import jax

    from jgpt.model.transformer import forward
    from training.corpus import prepare
    from training.trainer import DATA_STREAM, RunDirectory, recorded_config

    config = recorded_config(RunDirectory(out), "test")
    parent = load_model(config.init_from)
    corpus = prepare(config, parent.tokenizer())
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), DATA_STREAM), 0)
    batch = corpus.train.sample(key, config.batch_size)
    logits = np.asarray(forward(parent.weights, parent.architecture, batch.inputs).logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    targets = np.asarray(batch.targets)
    nats = -np.take_along_axis(log_probabilities, targets[..., None], axis=-1)[..., 0]
    mask = np.asarray(batch.mask, np.float64)
    return float((nats * mask).sum() / mask.sum())


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_the_first_step_starts_from_the_parents_loss_and_the_provenance_names_the_parent(fine_tuned, parents, family):
    _, out, summary = fine_tuned[family]
    first = losses(out)[1]
    assert first == pytest.approx(parents_loss_on_the_first_batch(out), rel=1e-5)
    # The run's own seed would have initialized other weights: this one is the parent's loss, not theirs.
    parent = load_artifact(parents[family])
    provenance = summary["provenance"]
    assert provenance["init_from"] == {
        "model": str(parents[family]),
        "path": str(parents[family]),
        "checkpoint_sha256": parent.checkpoint_sha256,
        "manifest_sha256": parent.manifest_sha256,
        "tokenizer_sha256": parent.tokenizer_sha256,
    }
    child = load_artifact(out / "model")
    assert child.architecture == parent.architecture and child.tokenizer_sha256 == parent.tokenizer_sha256
    assert child.checkpoint_sha256 != parent.checkpoint_sha256
    assert child.provenance["init_from"] == provenance["init_from"]
    assert provenance["learning_rate_schedule"]["held_after_step"] is None
    # Where the curve starts: the parent's development loss on this data, logged as step 0.
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and records[0]["development_loss"] > 0
    assert np.mean(list(losses(out).values())[-5:]) < first


def test_an_interrupted_fine_tuning_run_resumed_with_resume_alone_ends_bitwise_equal(tmp_path, fine_tuned):
    config, expected_out, expected = fine_tuned["llama"]
    out = tmp_path / "run"
    process = subprocess.Popen(train_command(out, config), cwd=REPO, env=environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    while not (out / "checkpoints" / str(RECIPE["checkpoint_every"])).is_dir() and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    # No --config: the resume reads the run's own run.json.
    resume = [sys.executable, "-m", "training", "train", "--out", str(out), "--quiet", "--resume"]
    done = subprocess.run(resume, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["checkpoint_sha256"] == expected["checkpoint_sha256"]
    assert losses(out) == losses(expected_out)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """(config file, run directory) of a finished 20-step run on the built-in conversations."""
    root = tmp_path_factory.mktemp("finished")
    config = config_file(root, **CONVERSATIONS, steps=20, architecture={**PARENTS["gpt"].to_json(), "vocabulary": 260})
    run(root / "run", config)
    return config, root / "run"


def test_an_extended_run_is_bitwise_the_run_configured_with_that_schedule(tmp_path, finished):
    config, done = finished
    extended = tmp_path / "extended"
    shutil.copytree(done, extended)
    summary = run(extended, config, "--resume", "--steps", "40")
    schedule = summary["provenance"]["learning_rate_schedule"]
    assert (schedule["schedule_steps"], schedule["steps"], schedule["held_after_step"]) == (20, 40, 20)
    at_once = tmp_path / "at_once"
    assert run(at_once, config, "--steps", "40", "--schedule-steps", "20")["checkpoint_sha256"] == \
        summary["checkpoint_sha256"]  # fmt: skip
    assert losses(extended) == losses(at_once) and len(losses(extended)) == 40
    rates = {json.loads(line)["step"]: json.loads(line).get("learning_rate") for line in
             (extended / "metrics.jsonl").read_text().splitlines()}  # fmt: skip
    assert rates[21] == rates[40] == pytest.approx(RECIPE["learning_rate"] * 0.05, rel=1e-6)
    assert json.loads((extended / "run.json").read_text())["schedule_steps"] == 20


def test_a_resume_names_the_field_given_otherwise_and_refuses_fewer_steps(tmp_path, finished, capsys):
    _, done = finished
    out = tmp_path / "run"
    shutil.copytree(done, out)
    suggestion = f"`--out {out} --resume` alone reads the rest"
    cases = {
        ("--learning-rate", "0.01"): (f"learning_rate: {out} was started with learning_rate 0.001, given 0.01.",
                                      suggestion),
        ("--layers", "3"): (f"architecture.layers: {out} was started with architecture.layers 2, given 3.",
                            suggestion),
        ("--steps", "10"): (f"steps: {out} was started for 20 steps and has done 20;", "--steps above 20"),
    }  # fmt: skip
    for flags, (message, fix) in cases.items():
        assert jgpt(["train", "--out", str(out), "--quiet", "--resume", *flags]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"jgpt train: error: {message}") and fix in error and error.count("\n") == 1, error


@pytest.mark.parametrize(("change", "field"), [
    ({"tokenizer": "bpe"}, "tokenizer"), ({"vocab_size": 300}, "vocab_size"),
    ({"architecture": {**PARENTS["gpt"].to_json(), "layers": 3}}, "layers"),
    ({"architecture": {"width": 32, "ffn": 64, "context": 100, "layers": 2, "heads": 2, "position": "rope"}},
     "position"),
])  # fmt: skip
def test_a_fine_tuning_config_refuses_what_would_change_the_parent_naming_it(parents, change, field):
    with pytest.raises(ApiError) as refused:
        TrainingConfig(init_from=str(parents["gpt"]), **change)
    assert refused.value.field == field


def test_a_fine_tuning_config_takes_the_parents_architecture_and_names_it_by_identity(parents, tmp_path):
    config = TrainingConfig(init_from=str(parents["llama"]))
    assert config.architecture == PARENTS["llama"] and (config.tokenizer, config.vocab_size) == ("parent", 260)
    bf16 = config.replace(architecture={**PARENTS["llama"].to_json(), "precision": "bfloat16"})
    assert bf16.architecture.precision == "bfloat16"  # the compute precision is the run's own choice
    # The hash names the parent by its weights, not by where it lies.
    moved = tmp_path / "moved"
    shutil.copytree(parents["llama"], moved)
    assert config.replace(init_from=str(moved)).preparation_run_sha256 == config.preparation_run_sha256
    assert config.preparation_run_sha256 != TrainingConfig(init_from=str(parents["gpt"])).preparation_run_sha256
    with pytest.raises(ApiError) as refused:
        TrainingConfig(init_from=str(tmp_path / "absent"))
    assert refused.value.field == "init_from"
    with pytest.raises(ApiError) as refused:
        TrainingConfig(tokenizer="parent")
    assert refused.value.field == "tokenizer"


def fine_tune(parent: str, out: Path, text_file: Path, capsys) -> dict:
    """The summary of a short fine-tuning run of `parent` on `text_file`, in this process."""
    flags = ["--steps", "3", "--batch-size", "4", "--log-every", "1", "--eval-every", "3", "--checkpoint-every", "3"]
    assert jgpt(["train", "--init-from", parent, "--data", str(text_file), "--out", str(out), "--quiet", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_imported_gpt2_fine_tunes_on_a_text_but_not_on_the_conversations(tmp_path, text_file, capsys):
    """A Hugging Face tokenizer trains on text and goes with the child unchanged; it has no role ids, so the
    built-in conversations are refused naming init_from, before anything is written."""
    from tests.hf_models import save_model

    save_model("gpt2", tmp_path / "hf")
    assert jgpt(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "gpt2")]) == 0
    capsys.readouterr()
    summary = fine_tune(str(tmp_path / "gpt2"), tmp_path / "run", text_file, capsys)
    parent = load_artifact(tmp_path / "gpt2")
    assert summary["provenance"]["init_from"]["checkpoint_sha256"] == parent.checkpoint_sha256
    assert losses(tmp_path / "run")[1] == pytest.approx(parents_loss_on_the_first_batch(tmp_path / "run"), rel=1e-5)
    child = load_artifact(tmp_path / "run" / "model")
    assert child.tokenizer_sha256 == parent.tokenizer_sha256
    assert (tmp_path / "run/model/tokenizer_config.json").read_bytes() == (
        tmp_path / "gpt2/tokenizer_config.json"
    ).read_bytes()
    out = tmp_path / "conversations"
    assert jgpt(["train", "--init-from", str(tmp_path / "gpt2"), "--out", str(out), "--quiet"]) == 2
    assert "init_from: the tokenizer of" in capsys.readouterr().err and not out.exists()


def test_the_shipped_model_fine_tunes_on_a_text_from_its_own_loss(tmp_path, text_file, capsys):
    summary = fine_tune("chat", tmp_path / "run", text_file, capsys)
    assert summary["provenance"]["init_from"]["model"] == "chat"
    assert (
        summary["provenance"]["init_from"]["checkpoint_sha256"]
        == load_artifact(Path(summary["provenance"]["init_from"]["path"])).checkpoint_sha256
    )
    assert losses(tmp_path / "run")[1] == pytest.approx(parents_loss_on_the_first_batch(tmp_path / "run"), rel=1e-5)
