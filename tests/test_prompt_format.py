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


def generated(capsys, *argv: str) -> dict:
    assert jgpt(["generate", "--json", "--max-new-tokens", "3", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def refusal(capsys, *argv: str) -> str:
    """The one line a refused command prints."""
    assert jgpt(list(argv)) == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line


def test_a_plain_model_continues_exactly_the_texts_ids(plain_model, capsys):
    assert load_artifact(plain_model).prompt_format == PLAIN
    response = generated(capsys, "--model", str(plain_model), "Return the")
    assert response["prompt_ids"] == list(b"Return the")
    assert len(response["output_ids"]) == 3
    chat = generated(capsys, "--model", str(plain_model), "--chat", "Return the")
    tokenizer = Tokenizer.bytes_only()
    assert chat["prompt_ids"] == list(tokenizer.encode_turns([Turn("user", "Return the")], open_turn="assistant").ids)
    line = refusal(capsys, "generate", "--model", str(plain_model), "--system", "Be brief.", "Return the")
    assert line.startswith("jgpt generate: error: system: a plain-text model") and "--chat" in line


def test_eval_on_a_plain_model_reports_its_own_held_out_text_and_no_skills(plain_model, capsys):
    assert jgpt(["eval", "--model", str(plain_model), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    provenance = load_artifact(plain_model).provenance
    assert report["prompt_format"] == PLAIN and "skills" not in report
    assert report["data_sha256"] == provenance["data_sha256"]
    assert report["development_loss"] == pytest.approx(provenance["development_loss"], rel=1e-6)
    assert report["development_bits_per_byte"] > 0
    assert jgpt(["eval", "--model", str(plain_model)]) == 0
    assert "no chat skills" in capsys.readouterr().out


def test_eval_of_a_text_trained_model_without_its_run_asks_for_the_text(plain_model, tmp_path, capsys):
    moved = Path(shutil.copytree(plain_model, tmp_path / "model"))
    line = refusal(capsys, "eval", "--model", str(moved))
    assert line.startswith("jgpt eval: error: data: ") and "--data FILE.txt" in line


def test_system_and_turns_frame_as_encode_turns_and_raw_frames_nothing(initialized, tmp_path, capsys):
    tokenizer = Tokenizer.bytes_only()
    conversation = [Turn("user", "store red abc"), Turn("assistant", "ok"), Turn("user", "get red")]
    (tmp_path / "turns.json").write_text(json.dumps([{"role": t.role, "text": t.text} for t in conversation]))
    model = ["--model", str(initialized)]
    with_system = generated(capsys, *model, "--system", "Be brief.", "--turns", str(tmp_path / "turns.json"))
    expected = tokenizer.encode_turns([Turn("system", "Be brief."), *conversation], open_turn="assistant")
    assert with_system["prompt_ids"] == list(expected.ids)
    single = generated(capsys, *model, "--system", "Be brief.", "héllo")
    expected = tokenizer.encode_turns([Turn("system", "Be brief."), Turn("user", "héllo")], open_turn="assistant")
    assert single["prompt_ids"] == list(expected.ids)
    assert generated(capsys, *model, "--raw", "héllo")["prompt_ids"] == list("héllo".encode())
    line = refusal(capsys, "generate", *model, "--raw", "--ids", "72,105")
    assert line == "jgpt generate: error: raw: frames text; --ids are the prompt's ids as they stand"


def test_a_sampling_setting_implies_sampling_and_temperature_zero_is_greedy(initialized, capsys):
    model = ["--model", str(initialized), "--ids", "257,72,105,259,258"]
    greedy = generated(capsys, *model)
    assert generated(capsys, *model, "--temperature", "0")["selections"] == greedy["selections"]
    drawn = generated(capsys, *model, "--temperature", "0.5", "--seed", "3")
    asked = generated(capsys, *model, "--sample", "--temperature", "0.5", "--seed", "3")
    assert (drawn["selections"], drawn["output_ids"]) == (asked["selections"], asked["output_ids"])
    assert drawn["selections"] != greedy["selections"]


def test_a_workload_is_framed_by_the_format():
    from inference.recorded_computations import read_workload

    tokenizer = Tokenizer.bytes_only()
    document = {"kind": "requests", "requests": [{"request_id": "a", "arrival_us": 0, "request": {"text": "hi"}}]}
    (plain,) = read_workload(document, tokenizer, prompt_format=PLAIN)
    (chat,) = read_workload(document, tokenizer)
    assert plain.prompt_ids == (104, 105)
    assert chat.prompt_ids == tuple(tokenizer.encode_turns([Turn("user", "hi")], open_turn="assistant").ids)
    document["requests"][0]["request"] = {"turns": [{"role": "system", "text": "x"}, {"role": "user", "text": "hi"}]}
    with pytest.raises(ApiError, match="frames no roles") as refused:
        read_workload(document, tokenizer, prompt_format=PLAIN)
    assert refused.value.field == "workload.requests[0].request.turns"


def test_the_chat_endpoint_refuses_a_plain_model_naming_its_format():
    from inference.request_endpoint import CHAT as CHAT_COMPLETION
    from inference.request_endpoint import COMPLETION, ServedModel, read_request

    model = ServedModel("notes", Tokenizer.bytes_only(), 260, 32, 259, 8, 0, PLAIN)
    body = {"messages": [{"role": "user", "content": "Return the"}]}
    with pytest.raises(ApiError, match="plain-text model \\(prompt_format 'plain'\\)") as refused:
        read_request(CHAT_COMPLETION, body, model, "r", 0)
    assert refused.value.field == "messages"
    completion = read_request(COMPLETION, {"prompt": "Return the"}, model, "r", 0)
    assert completion.request.prompt_ids == tuple(b"Return the")


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    """A random Llama imported with its own tokenizer (whose post-processor adds BOS) and no chat template."""
    from tests.hf_models import save_model

    root = tmp_path_factory.mktemp("imported")
    save_model("llama", root / "hf")
    config = json.loads((root / "hf" / "tokenizer_config.json").read_text())
    (root / "hf" / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": None}))
    assert jgpt(["import-hf", str(root / "hf"), "--out", str(root / "model")]) == 0
    return root


def test_an_imported_model_without_a_template_is_plain_and_frames_as_its_tokenizer(imported, capsys):
    from transformers import AutoTokenizer

    model = imported / "model"
    assert load_artifact(model).prompt_format == PLAIN
    reference = AutoTokenizer.from_pretrained(imported / "hf")
    assert generated(capsys, "--model", str(model), "some text")["prompt_ids"] == reference("some text").input_ids
    line = refusal(capsys, "generate", "--model", str(model), "--chat", "some text")
    assert line == "jgpt generate: error: chat: this model's tokenizer has no chat template: it frames no conversation"


def test_eval_on_an_imported_model_measures_a_given_text_and_asks_for_one(imported, capsys):
    model = imported / "model"
    line = refusal(capsys, "eval", "--model", str(model))
    assert line.startswith("jgpt eval: error: data: ") and "imported model (prompt_format 'plain')" in line
    (imported / "notes.txt").write_text(TEXT)
    assert jgpt(["eval", "--model", str(model), "--data", str(imported / "notes.txt"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prompt_format"] == PLAIN and "skills" not in report
    assert report["development_loss"] > 0 and report["development_bits_per_byte"] > 0


def test_an_imported_model_with_a_chat_template_declares_it(imported, tmp_path, capsys):
    source = Path(shutil.copytree(imported / "hf", tmp_path / "hf"))
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    assert jgpt(["import-hf", str(source), "--out", str(tmp_path / "model")]) == 0
    capsys.readouterr()  # import-hf's summary
    artifact = load_artifact(tmp_path / "model")
    assert artifact.prompt_format == "chat-template"
    prompt = generated(capsys, "--model", str(tmp_path / "model"), "--system", "Be brief.", "hi")["prompt_ids"]
    turns = [Turn("system", "Be brief."), Turn("user", "hi")]
    assert prompt == list(artifact.tokenizer().encode_turns(turns, open_turn="assistant").ids)
