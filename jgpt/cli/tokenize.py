"""`jgpt tokenize`: encode text or conversation turns and print the Encoding; or train a tokenizer."""

from __future__ import annotations

import argparse
import json

from jgpt.foundation.command_line import ArgumentParser
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes
from jgpt.foundation.json_input import read_json
from jgpt.foundation.limits import VOCABULARY_LIMIT, bounded
from jgpt.foundation.output_paths import output_file
from jgpt.foundation.validation import LIMIT
from jgpt.tokenizers.encoding import Encoding
from jgpt.tokenizers.framing import FIRST_MERGE_ID, ROLES, Turn, turns_from_json
from jgpt.tokenizers.span_table import render
from jgpt.tokenizers.tokenizer import Tokenizer
from jgpt.tokenizers.tokenizer_file import load_tokenizer

EXAMPLES = """\
examples:
  jgpt tokenize "héllo 👋"                      one user turn, spans as a table
  jgpt tokenize --json "héllo 👋"               the Encoding as JSON
  jgpt tokenize --turns chat.json --open-turn assistant
                                               turns from [{"role": "user", "text": "hi"}, ...],
                                               ending in the prompt for the assistant's reply
  jgpt tokenize --train corpus.txt --vocab-size 512 --out tokenizer.json
                                               learn byte-level BPE merges from a UTF-8 text file
  jgpt tokenize --tokenizer tokenizer.json "héllo 👋"
"""


def parser(prog: str) -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        epilog=EXAMPLES,
        description="Encode text (one user turn) or conversation turns with the byte-level tokenizer and "
        "print the Encoding: token ids and the spans explaining them. Or train a tokenizer.",
    )
    p.add_argument("text", nargs="?", metavar="TEXT", help="text to encode as one user turn")
    p.add_argument("--turns", metavar="FILE.json", help='a JSON list of {"role", "text"} turns to encode')
    p.add_argument(
        "--open-turn", choices=ROLES, help="end with this role's marker and no TURN_END (a generation prompt)"
    )
    p.add_argument("--json", action="store_true", help="print the Encoding as JSON")
    p.add_argument("--tokenizer", metavar="FILE", help="a tokenizer.json to use (default: pure bytes, vocabulary 260)")
    p.add_argument("--context-limit", type=int, metavar="N", help="reject inputs that encode to more than N ids")
    training = p.add_argument_group("training a tokenizer")
    training.add_argument("--train", metavar="CORPUS.txt", help="learn BPE merges from this UTF-8 text file")
    training.add_argument("--vocab-size", type=int, metavar="N", help="target vocabulary size (>= 260) for --train")
    training.add_argument(
        "--min-frequency", type=int, default=2, metavar="N", help="merge only pairs seen at least N times"
    )
    training.add_argument("--out", metavar="FILE", help="where --train writes the tokenizer.json")
    return p


def main(command: str, argv: list[str]) -> int:
    args = parser(f"jgpt {command}").parse_args(argv)
    if args.train is not None:
        return train(args)
    if (args.text is None) == (args.turns is None):
        raise ApiError("input", "give exactly one of TEXT or --turns FILE.json (or --train CORPUS.txt)")
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else Tokenizer.bytes_only()
    tokenizer = tokenizer.with_context_limit(args.context_limit)
    if args.turns is not None:
        turns = turns_from_json(read_json(args.turns, "turns"))
    else:
        turns = (Turn("user", args.text),)
    encoding = tokenizer.encode_turns(turns, open_turn=args.open_turn)
    print(encoding_json(encoding) if args.json else render(encoding, tokenizer))
    return 0


def train(args: argparse.Namespace) -> int:
    misplaced = [
        flag
        for flag, value in (
            ("TEXT", args.text),
            ("--turns", args.turns),
            ("--json", args.json),
            ("--open-turn", args.open_turn),
            ("--tokenizer", args.tokenizer),
            ("--context-limit", args.context_limit),
        )
        if value
    ]
    if misplaced:
        raise ApiError("train", f"{', '.join(misplaced)} cannot be combined with --train")
    if args.vocab_size is None or args.out is None:
        raise ApiError("train", "--train needs --vocab-size N and --out FILE")
    bounded(args.vocab_size, "--vocab-size", FIRST_MERGE_ID, VOCABULARY_LIMIT)
    bounded(args.min_frequency, "--min-frequency", 1, LIMIT)  # the trainer's count is an unsigned 64-bit integer
    output_file(args.out, "--out", [args.train])
    corpus = read_text(args.train, "train")
    tokenizer = Tokenizer.train(corpus.splitlines(keepends=True), args.vocab_size, min_frequency=args.min_frequency)
    tokenizer.save(args.out)
    print(
        f"wrote {args.out}: vocabulary {tokenizer.vocab_size} ({tokenizer.merge_count} merges), "
        f"tokenizer_sha256 {tokenizer.tokenizer_sha256}"
    )
    return 0


def read_text(path: str, field: str) -> str:
    """A UTF-8 text file; anything else is an ApiError naming the file and the byte."""
    data = read_bytes(path, field)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = " ".join(f"0x{b:02X}" for b in data[error.start : error.end])
        raise ApiError(field, f"{path} is not valid UTF-8: {error.reason} ({bad}) at byte {error.start}") from None


def encoding_json(encoding: Encoding) -> str:
    """The Encoding as indented JSON with one span per line."""
    document = encoding.to_json()

    def member(key, value):
        if key != "spans":
            return f'  "{key}": {json.dumps(value, ensure_ascii=False)}'
        lines = ",\n".join(f"    {json.dumps(span, ensure_ascii=False)}" for span in value)
        return f'  "spans": [\n{lines}\n  ]'

    return "{\n" + ",\n".join(member(key, value) for key, value in document.items()) + "\n}"
