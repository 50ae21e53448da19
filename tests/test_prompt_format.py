"""PromptFormat: an artifact declares how its prompts are framed, and every face frames by it.

The manifest's prompt_format round-trips, a manifest written before it existed reads the implied format
with its identities unchanged, a bad value is refused naming the field; a tiny model trained with --data is
plain: `generate` sends exactly the text's ids and `eval` reports loss and bits per byte on its own held-out
text and no skills; --system/--turns frame as `encode_turns`; --raw/--chat override; the HTTP chat endpoint
refuses a plain model.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jgpt.artifacts.artifact import load_artifact, save_artifact
from jgpt.cli.main import main as jgpt
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import sha256_json
from jgpt.model.architecture import LlamaArchitecture
from jgpt.model.weights import initialize
from jgpt.tokenizers.framing import Turn
from jgpt.tokenizers.prompt_format import CHAT, PLAIN, framed, implied_prompt_format, plain_ids
from jgpt.tokenizers.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent
TINY = LlamaArchitecture(vocabulary=260, width=32, ffn=48, context=64, layers=2, heads=2, kv_heads=2)
# A plain-text model: a few steps on a small text file, enough to have a model and its held-out split.
PLAIN_RUN = {
    "architecture": {"width": 32, "ffn": 64, "context": 32, "layers": 1, "heads": 2, "position": "rope"},
    "steps": 6,
    "batch_size": 4,
    "warmup_steps": 1,
    "log_every": 1,
    "eval_every": 3,
    "checkpoint_every": 6,
    "selection": "final",
    "seed": 2,
}
TEXT = "".join(f"Return the {word} to the shelf by {n} o'clock.\n" for n in range(40) for word in ("book", "cup"))


@pytest.fixture(scope="module")
def initialized(tmp_path_factory) -> Path:
    weights, provenance = initialize(TINY, seed=1)
    path = tmp_path_factory.mktemp("artifacts") / "chat"
    save_artifact(path, TINY, weights, provenance, Tokenizer.bytes_only())
    return path


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plain")
    (root / "notes.txt").write_text(TEXT)
    (root / "run.json").write_text(json.dumps(PLAIN_RUN))
    command = [sys.executable, "-m", "training", "train", "--config", str(root / "run.json"), "--quiet",
               "--data", str(root / "notes.txt"), "--out", str(root / "run")]  # fmt: skip
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return root / "run" / "model"


def reseal(path: Path, change) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.pop("manifest_sha256")
    change(manifest)
    manifest["manifest_sha256"] = sha256_json(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_the_declared_format_round_trips_and_an_undeclared_one_is_the_saved_default(initialized, tmp_path):
    assert load_artifact(initialized).prompt_format == CHAT
    assert json.loads((initialized / "manifest.json").read_text())["prompt_format"] == CHAT
    weights, provenance = initialize(TINY, seed=1)
    plain = save_artifact(tmp_path / "plain", TINY, weights, provenance, Tokenizer.bytes_only(), prompt_format=PLAIN)
    assert load_artifact(plain.path).prompt_format == PLAIN
    assert plain.checkpoint_sha256 == load_artifact(initialized).checkpoint_sha256


def test_a_manifest_without_the_field_reads_the_implied_format_and_keeps_its_identity(initialized, tmp_path):
    copy = Path(shutil.copytree(initialized, tmp_path / "old"))
    reseal(copy, lambda manifest: manifest.pop("prompt_format"))
    old = load_artifact(copy)
    assert old.prompt_format == CHAT
    assert old.manifest_sha256 == json.loads((copy / "manifest.json").read_text())["manifest_sha256"]
    reseal(copy, lambda manifest: manifest["provenance"].update(kind="text"))
    assert load_artifact(copy).prompt_format == PLAIN


def test_the_shipped_models_are_chat_models_with_unchanged_manifests():
    for name in ("chat", "chat-draft"):
        manifest = json.loads((REPO / "checkpoints" / name / "manifest.json").read_text())
        assert "prompt_format" not in manifest
        assert load_artifact(REPO / "checkpoints" / name).prompt_format == CHAT


@pytest.mark.parametrize(
    "provenance, template, expected",
    [({"kind": "conversations"}, False, "chat"), ({"kind": "text"}, False, "plain"),
     ({"kind": "random"}, False, "chat"), ({"kind": "import"}, True, "chat-template"),
     ({"kind": "import"}, False, "plain")],
)  # fmt: skip
def test_the_implied_format_follows_what_the_artifact_is(provenance, template, expected):
    assert implied_prompt_format(provenance, template) == expected


@pytest.mark.parametrize("value", ["chatty", None, 3, ""])
def test_a_bad_declared_format_is_refused_naming_the_field(initialized, tmp_path, value):
    copy = Path(shutil.copytree(initialized, tmp_path / "bad"))
    reseal(copy, lambda manifest: manifest.update(prompt_format=value))
    with pytest.raises(ApiError) as refused:
        load_artifact(copy)
    assert refused.value.field == "prompt_format" and repr(value) in refused.value.reason
    weights, provenance = initialize(TINY, seed=1)
    with pytest.raises(ApiError, match="prompt_format"):
        save_artifact(tmp_path / "never", TINY, weights, provenance, Tokenizer.bytes_only(), prompt_format=value or "x")
    assert not (tmp_path / "never").exists()


def test_a_chat_template_format_does_not_fit_jgpts_tokenizer(tmp_path):
    weights, provenance = initialize(TINY, seed=1)
    with pytest.raises(ApiError, match="does not fit"):
        save_artifact(tmp_path / "m", TINY, weights, provenance, Tokenizer.bytes_only(), prompt_format="chat-template")


def test_framing_by_format():
    tokenizer = Tokenizer.bytes_only()
    turns = [Turn("system", "Be brief."), Turn("user", "héllo")]
    assert framed(tokenizer, CHAT, turns) == list(tokenizer.encode_turns(turns, open_turn="assistant").ids)
    assert framed(tokenizer, PLAIN, [Turn("user", "héllo")]) == list("héllo".encode()) == plain_ids(tokenizer, "héllo")
    with pytest.raises(ApiError, match="frames no roles") as refused:
        framed(tokenizer, PLAIN, turns)
    assert refused.value.field == "turns"
