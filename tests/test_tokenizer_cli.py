"""`jgpt tokenize` as a user runs it: output, training, and bad input (exit code, one line, no traceback)."""

import json
import subprocess
import sys

import pytest

from jgpt.cli.main import main
from jgpt.tokenizers.tokenizer_file import load_tokenizer


def jgpt(*args, cwd=None):
    """Run the real console entry in a fresh interpreter, as a user would."""
    return subprocess.run([sys.executable, "-m", "jgpt", *args], capture_output=True, cwd=cwd)


def assert_rejected(result, *phrases):
    stderr = result.stderr.decode()
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    for phrase in phrases:
        assert phrase in stderr, stderr


def test_json_output_is_the_encoding():
    result = jgpt("tokenize", "--json", "héllo 👋")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["ids"] == [257, *"héllo 👋".encode(), 259]
    assert [span["reason"] for span in document["spans"]] == [
        "turn framing",
        "byte",
        "utf-8 sequence",
        "byte",
        "byte",
        "byte",
        "byte",
        "utf-8 sequence",
        "turn framing",
    ]
    assert document["spans"][7] == {
        "kind": "text",
        "reason": "utf-8 sequence",
        "byte_start": 7,
        "byte_end": 11,
        "token_start": 8,
        "token_end": 12,
        "raw_bytes": list("👋".encode()),
        "ids": list("👋".encode()),
        "turn": 0,
    }


def test_turns_file_with_open_turn(tmp_path, capsys):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "system", "text": "Be brief."}, {"role": "user", "text": "hi"}]))
    assert main(["tokenize", "--json", "--turns", str(chat), "--open-turn", "assistant"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ids"][-1] == 258 and document["input_kind"] == "generation prompt"
    assert main(["tokenize", "--turns", str(chat)]) == 0
    table = capsys.readouterr().out
    assert "<|system|>" in table and '"Be brief."' not in table and "decoded: <|system|>Be brief.<|turn_end|>" in table


def test_train_then_tokenize_with_the_trained_file(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat with the hat\n" * 30 + "naïve café\n" * 10, encoding="utf-8")
    out = tmp_path / "tokenizer.json"
    assert main(["tokenize", "--train", str(corpus), "--vocab-size", "300", "--out", str(out)]) == 0
    trained = load_tokenizer(out)
    assert trained.merge_count > 0 and trained.tokenizer_sha256 in capsys.readouterr().out
    assert main(["tokenize", "--json", "--tokenizer", str(out), "the cat"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ids"] == [257, *trained.encode_text("the cat"), 259]
    assert any(span["reason"] == "bpe merge" for span in document["spans"])


def test_help_lists_training():
    result = jgpt("tokenize", "--help")
    assert result.returncode == 0 and b"--train CORPUS.txt" in result.stdout and b"--vocab-size" in result.stdout


# ---- bad input: a clear error naming the problem, non-zero exit, no traceback -------


def test_unknown_role(tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "bot", "text": "hi"}]))
    assert_rejected(jgpt("tokenize", "--turns", str(chat)), "turns[0].role", "unknown role 'bot'")


def test_turns_file_that_is_not_a_list(tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps({"role": "user", "text": "hi"}))
    assert_rejected(jgpt("tokenize", "--turns", str(chat)), "turns:", "must be a JSON list", "got an object")


def test_text_exceeding_the_context_limit():
    assert_rejected(
        jgpt("tokenize", "--context-limit", "8", "héllo 👋"), "context_limit", "13 token ids", "context_limit of 8"
    )


def test_invalid_utf8_bytes_from_a_file(tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_bytes(b'[{"role": "user", "text": "caf\xe9"}]')  # Latin-1, not UTF-8
    assert_rejected(jgpt("tokenize", "--turns", str(chat)), "not valid UTF-8", "0xE9", "at byte 30")
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"fine\n\xff\xfe")
    assert_rejected(
        jgpt("tokenize", "--train", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "t.json")),
        "train:",
        "not valid UTF-8",
        "0xFF",
    )
    assert not (tmp_path / "t.json").exists()


def test_invalid_utf8_bytes_on_the_command_line():
    assert_rejected(jgpt("tokenize", b"caf\xe9"), "lone surrogate U+DCE9")


@pytest.mark.parametrize(
    "content, phrases",
    [
        ('[{"role": "user"}]', ["turns[0].text", "missing"]),
        ('[{"role": "user", "text": 3}]', ["turns[0].text", "must be a string"]),
        ('["hi"]', ["turns[0]", "must be an object"]),
        ('[{"role": "user", "text": "hi", "name": "x"}]', ["turns[0]", "unknown fields ['name']"]),
        ('[{"role": "user", "text": "hi"},', ["not JSON", "line 1"]),
    ],
)
def test_malformed_turns_files(tmp_path, capsys, content, phrases):
    chat = tmp_path / "chat.json"
    chat.write_text(content)
    assert main(["tokenize", "--turns", str(chat)]) == 2
    stderr = capsys.readouterr().err
    assert all(phrase in stderr for phrase in phrases), stderr


@pytest.mark.parametrize(
    "args, phrase",
    [
        ([], "exactly one of TEXT or --turns"),
        (["hi", "--turns", "chat.json"], "exactly one of TEXT or --turns"),
        (["--train", "corpus.txt"], "--train needs --vocab-size N and --out FILE"),
        (["--train", "corpus.txt", "--json"], "--json cannot be combined with --train"),
        (["--tokenizer", "missing.json", "hi"], "tokenizer: cannot read missing.json"),
        (["--context-limit", "0", "hi"], "context_limit: must be a positive integer"),
    ],
)
def test_misused_options(tmp_path, capsys, args, phrase):
    assert main(["tokenize", *args]) == 2
    assert phrase in capsys.readouterr().err
