"""Workloads from public serving traces, with synthetic token ids that keep declared shared prefixes.

Accepted inputs (documented in docs/kvsim.md):

* Mooncake trace JSONL, one object per line with `timestamp` (milliseconds),
  `input_length`, `output_length` and `hash_ids` (one id per block of
  `block_tokens` prompt tokens; equal ids mean equal blocks). Other keys are ignored.
* Azure LLM inference trace CSV with header `TIMESTAMP,ContextTokens,GeneratedTokens`
  (TIMESTAMP is `YYYY-MM-DD HH:MM:SS[.fraction]`); it declares no sharing, so
  every prompt is distinct.

Block h's ids are the bytes of a generator seeded by h, so two requests share
exactly the leading blocks their traces say they share. Outputs are
`output_length - 1` byte ids followed by TURN_END: the ids that follow in the
first later request extending all of this request's blocks (its next turn), so
that the whole-sequence state this request leaves is a prefix there; otherwise
synthetic ones.
"""

from __future__ import annotations

import csv
import io
import json
import random
from datetime import datetime

from jgpt.errors import ApiError
from kvsim import fields
from kvsim.analytic import Conversation
from kvsim.recorded import TURN_END

FORMATS = ("mooncake", "azure")


def _block(seed: str, tokens: int) -> tuple[int, ...]:
    return tuple(random.Random(seed).randbytes(tokens))


def _output(request_id: str, length: int) -> tuple[int, ...]:
    return (*_block(f"output:{request_id}", length - 1), TURN_END)


def mooncake(text: str, block_tokens: int = 512) -> list[Conversation]:
    rows, blocks = [], {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        at = f"trace line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ApiError(at, f"malformed JSON: {error}") from None
        row = fields.loose_mapping(row, at, {"timestamp", "input_length", "output_length", "hash_ids"})
        timestamp = fields.number(row["timestamp"], f"{at}.timestamp")
        length = fields.integer(row["input_length"], f"{at}.input_length", 1)
        output = fields.integer(row["output_length"], f"{at}.output_length", 1)
        hashes = fields.integers(row["hash_ids"], f"{at}.hash_ids")
        if not (len(hashes) - 1) * block_tokens < length <= len(hashes) * block_tokens:
            raise ApiError(
                f"{at}.hash_ids", f"{len(hashes)} blocks of {block_tokens} tokens do not cover input_length {length}"
            )
        for h in hashes:
            if h not in blocks:
                blocks[h] = _block(f"block:{h}", block_tokens)
        prompt = tuple(token for h in hashes for token in blocks[h])[:length]
        rows.append((int(timestamp * 1000), prompt, output, hashes))
    items = []
    continuations = _continuations(rows)
    for index, (arrival, prompt, output, _) in enumerate(rows):
        request_id = f"r{index}"
        if index in continuations:
            follower = rows[continuations[index]][1]
            ids = (*follower[len(prompt) : len(prompt) + output - 1], TURN_END)
        else:
            ids = _output(request_id, output)
        items.append(Conversation(request_id, arrival, prompt, ids, output))
    return items


def _continuations(rows: list[tuple]) -> dict[int, int]:
    """Request i -> the first later request whose blocks start with all of i's and whose prompt is
    longer than i's whole sequence: i's output is then the ids that follow i's prompt there (a
    conversation's next turn repeats the previous turn's answer), so its retained state is reusable."""
    earliest: dict[int, int] = {}  # chained hash of a block prefix -> first request (seen so far) with it
    found = {}
    for index in range(len(rows) - 1, -1, -1):
        _, prompt, output, hashes = rows[index]
        keys, key = [], 0
        for h in hashes:
            key = hash((key, h))
            keys.append(key)
        follower = earliest.get(keys[-1]) if keys else None
        if follower is not None and len(rows[follower][1]) >= len(prompt) + output:
            found[index] = follower
        for key in keys:
            earliest[key] = index
    return found


def azure(text: str) -> list[Conversation]:
    reader = csv.DictReader(io.StringIO(text))
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
    if missing:
        raise ApiError("trace header", f"missing column {sorted(missing)[0]}")
    items, start = [], None
    for number, row in enumerate(reader, 2):
        at = f"trace line {number}"
        try:
            moment = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26])
            context, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
        except ValueError as error:
            raise ApiError(at, f"unreadable row: {error}") from None
        if context < 1 or generated < 1:
            raise ApiError(at, "ContextTokens and GeneratedTokens must be positive")
        start = moment if start is None else start
        arrival = (moment - start) // _MICROSECOND
        if arrival < 0:
            raise ApiError(f"{at}.TIMESTAMP", "timestamps must not go back before the first row")
        request_id = f"r{len(items)}"
        items.append(
            Conversation(
                request_id, arrival, _block(f"prompt:{request_id}", context), _output(request_id, generated), generated
            )
        )
    return items


_MICROSECOND = datetime(2000, 1, 1, 0, 0, 0, 1) - datetime(2000, 1, 1)
