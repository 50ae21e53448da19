"""Workloads from public serving traces, with synthetic token ids that keep declared shared prefixes.

Accepted inputs (documented in docs/kvsim.md):

* Mooncake trace JSONL, one object per line with `timestamp` (milliseconds),
  `input_length`, `output_length` and `hash_ids` (one id per block of
  `block_tokens` prompt tokens; equal ids mean equal blocks). Other keys are ignored.
* Azure LLM inference trace CSV with header `TIMESTAMP,ContextTokens,GeneratedTokens`
  (TIMESTAMP is `YYYY-MM-DD HH:MM:SS[.fraction]`); it declares no sharing, so
  every prompt is distinct.

Every request must fit the analytic model's context (prompt plus output ids), arrive
within 2^53 us of the first (what kvsim reads), and a trace holds at most TOKEN_LIMIT ids
in all, its Mooncake blocks included: the importer materializes every id.

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
import random
from dataclasses import dataclass
from datetime import datetime, timezone

from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import parse_json
from jgpt.foundation.validation import LIMIT, Integer, Integers, Number, Object
from kvsim.analytic import Conversation, framing_ids

FORMATS = ("mooncake", "azure")
# Ids one import materializes (prompts, outputs, Mooncake blocks). The document written holds up to about
# 100 bytes per id (a decode step's counts), so 2^22 ids stay well within the 1 GiB kvsim reads
# (jgpt.foundation.identity.READ_LIMIT); building it takes about 600 bytes per id, 2.4 GB at the limit.
TOKEN_LIMIT = 1 << 22
# The trace column each member of an imported request comes from, by format: a document kvsim would refuse
# is refused naming the line and column it was converted from.
COLUMNS = {
    "mooncake": {"arrival_us": "timestamp", "prompt_ids": "input_length", "prefill_costs": "input_length",
                 "output_ids": "output_length", "max_new_tokens": "output_length", "outcome": "output_length",
                 "decode_steps": "output_length"},
    "azure": {"arrival_us": "TIMESTAMP", "prompt_ids": "ContextTokens", "prefill_costs": "ContextTokens",
              "output_ids": "GeneratedTokens", "max_new_tokens": "GeneratedTokens", "outcome": "GeneratedTokens",
              "decode_steps": "GeneratedTokens"},
}  # fmt: skip


@dataclass(frozen=True)
class Trace:
    """A trace's requests and, for each, where it was read (`trace line N`)."""

    items: list[Conversation]
    lines: list[str]


def read_trace(form: str, text: str, block_tokens: int, context: int) -> Trace:
    rows = _mooncake(text, block_tokens, context) if form == "mooncake" else _azure(text, context)
    return Trace([item for _, item in rows], [at for at, _ in rows])


@dataclass(frozen=True)
class Lengths:
    """A trace's prompt and output lengths, row by row (what `kvsim synthesize` samples from)."""

    prompts: list[int]
    outputs: list[int]


def lengths(form: str, text: str) -> Lengths:
    """Each request's prompt and output length as the trace gives them, read and checked row by row as an import
    reads them, without making their ids."""
    if form == "mooncake":
        read = [
            MOONCAKE_ROW.read(parse_json(line, f"trace line {number}"), f"trace line {number}")
            for number, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
        return Lengths([row["input_length"] for row in read], [row["output_length"] for row in read])
    reader = csv.DictReader(io.StringIO(text))
    try:
        rows = [_azure_row(row, number, reader) for number, row in enumerate(_azure_reader(reader), 2)]
    except csv.Error as error:
        raise ApiError(f"trace line {reader.line_num + 1}", f"unreadable CSV: {error}") from None
    return Lengths([prompt for _, prompt, _ in rows], [output for _, _, output in rows])


def _block(seed: str, tokens: int) -> tuple[int, ...]:
    return tuple(random.Random(seed).randbytes(tokens))


def _output(request_id: str, length: int, turn_end: int) -> tuple[int, ...]:
    return (*_block(f"output:{request_id}", length - 1), turn_end)


# One Mooncake trace line (other columns are ignored).
MOONCAKE_ROW = Object(
    {"timestamp": Number(), "input_length": Integer(1), "output_length": Integer(1), "hash_ids": Integers()}, open=True
)


def mooncake(text: str, block_tokens: int = 512, context: int = 4096) -> list[Conversation]:
    return [item for _, item in _mooncake(text, block_tokens, context)]


def _mooncake(text: str, block_tokens: int, context: int) -> list[tuple[str, Conversation]]:
    rows, blocks, used = [], {}, 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        at = f"trace line {number}"
        row = MOONCAKE_ROW.read(parse_json(line, at), at)
        timestamp, length, output, hashes = (row[k] for k in ("timestamp", "input_length", "output_length", "hash_ids"))
        _fits(length, output, context, at, ("input_length", "output_length"))
        used = _within_limit(used + length + output, at)
        if not (len(hashes) - 1) * block_tokens < length <= len(hashes) * block_tokens:
            raise ApiError(
                f"{at}.hash_ids", f"{len(hashes)} blocks of {block_tokens} tokens do not cover input_length {length}"
            )
        for h in hashes:
            if h not in blocks:
                used = _within_limit(used + block_tokens, at)
                blocks[h] = _block(f"block:{h}", block_tokens)
        prompt = tuple(token for h in hashes for token in blocks[h])[:length]
        rows.append((_arrival(int(timestamp * 1000), f"{at}.timestamp"), prompt, output, hashes, at))
    items, turn_end = [], framing_ids()["turn_end"]
    continuations = _continuations(rows)
    for index, (arrival, prompt, output, _, at) in enumerate(rows):
        request_id = f"r{index}"
        if index in continuations:
            follower = rows[continuations[index]][1]
            ids = (*follower[len(prompt) : len(prompt) + output - 1], turn_end)
        else:
            ids = _output(request_id, output, turn_end)
        items.append((at, Conversation(request_id, arrival, prompt, ids, output, complete=True)))
    return items


def _continuations(rows: list[tuple]) -> dict[int, int]:
    """Request i -> the first later request whose blocks start with all of i's and whose prompt is
    longer than i's whole sequence: i's output is then the ids that follow i's prompt there (a
    conversation's next turn repeats the previous turn's answer), so its retained state is reusable."""
    earliest: dict[int, int] = {}  # chained hash of a block prefix -> first request (seen so far) with it
    found = {}
    for index in range(len(rows) - 1, -1, -1):
        _, prompt, output, hashes, _ = rows[index]
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


def azure(text: str, context: int = 4096) -> list[Conversation]:
    return [item for _, item in _azure(text, context)]


def _azure(text: str, context: int) -> list[tuple[str, Conversation]]:
    reader = csv.DictReader(io.StringIO(text))
    try:
        return _azure_rows(reader, context)
    except csv.Error as error:  # e.g. a bare carriage return inside a field
        raise ApiError(f"trace line {reader.line_num + 1}", f"unreadable CSV: {error}") from None


def _azure_rows(reader: csv.DictReader, context: int) -> list[tuple[str, Conversation]]:
    items: list[tuple[str, Conversation]] = []
    start, used, turn_end = None, 0, framing_ids()["turn_end"]
    for number, row in enumerate(_azure_reader(reader), 2):
        at = f"trace line {number}"
        moment, prompt_tokens, generated = _azure_row(row, number, reader)
        _fits(prompt_tokens, generated, context, at, ("ContextTokens", "GeneratedTokens"))
        used = _within_limit(used + prompt_tokens + generated, at)
        start = moment if start is None else start
        arrival = _arrival((moment - start) // _MICROSECOND, f"{at}.TIMESTAMP")
        request_id = f"r{len(items)}"
        conversation = Conversation(
            request_id,
            arrival,
            _block(f"prompt:{request_id}", prompt_tokens),
            _output(request_id, generated, turn_end),
            generated,
            complete=True,
        )
        items.append((at, conversation))
    return items


def _azure_reader(reader: csv.DictReader) -> csv.DictReader:
    """The reader, its header checked for the columns an import reads."""
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
    if missing:
        raise ApiError("trace header", f"missing column {sorted(missing)[0]}")
    return reader


def _azure_row(row: dict, number: int, reader: csv.DictReader) -> tuple[datetime, int, int]:
    """A row's time (UTC), ContextTokens and GeneratedTokens, each positive; the row as wide as the header."""
    at = f"trace line {number}"
    if None in row or None in row.values():
        raise ApiError(at, f"expected {len(reader.fieldnames or ())} columns as in the header")
    try:
        moment = _utc(datetime.fromisoformat(row["TIMESTAMP"].strip()[:26]))
        prompt_tokens, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
    except ValueError as error:
        raise ApiError(at, f"unreadable row: {error}") from None
    if prompt_tokens < 1 or generated < 1:
        raise ApiError(at, "ContextTokens and GeneratedTokens must be positive")
    return moment, prompt_tokens, generated


_MICROSECOND = datetime(2000, 1, 1, 0, 0, 0, 1) - datetime(2000, 1, 1)


def _utc(moment: datetime) -> datetime:
    """Naive times are UTC already; an offset is applied, so rows with and without one compare."""
    return moment if moment.tzinfo is None else moment.astimezone(timezone.utc).replace(tzinfo=None)


def _fits(prompt: int, output: int, context: int, at: str, names: tuple[str, str]) -> None:
    if prompt + output > context:
        name = names[0] if prompt >= context else names[1]  # the prompt alone, or the output past it
        raise ApiError(
            f"{at}.{name}",
            f"{prompt} prompt and {output} output tokens exceed the model's context {context} (see --context)",
        )


def _arrival(arrival_us: int, field: str) -> int:
    """An arrival kvsim reads: 0 (the first row's, for Azure) to 2^53 us (285 years)."""
    if arrival_us < 0:
        raise ApiError(field, "timestamps must not go back before the first row")
    if arrival_us > LIMIT:
        raise ApiError(field, f"gives an arrival of {arrival_us} us, past the 2^53 us (285 years) kvsim reads")
    return arrival_us


def _within_limit(used: int, at: str) -> int:
    """The ids materialized so far, refused past TOKEN_LIMIT before allocating this row's."""
    if used > TOKEN_LIMIT:
        raise ApiError(at, f"the trace holds more than {TOKEN_LIMIT} token ids in all (the import limit)")
    return used
