"""Synthetic multi-turn conversations with shared prefixes (for examples, tests and the bench).

Every conversation opens with one of a few shared system prompts; each turn's
prompt is the whole conversation so far plus a new user turn, framed with the
team's token contract ([role] text [TURN_END]), so the state a finished turn
leaves behind is an exact prefix of the next turn's prompt. All randomness
comes from one explicit seed.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, islice

from kvsim.analytic import Conversation, framing_ids

# A request holds up to a few hundred ids and its costs per position: 2,000 requests make a
# 5.7 MB document, so the limit stays under 300 MB and a minute of work.
REQUEST_LIMIT = 100_000


@dataclass(frozen=True)
class ConversationMix:
    system_prompts: int = 4
    system_tokens: int = 32
    turns: tuple[int, int] = (1, 6)
    user_tokens: tuple[int, int] = (8, 40)
    reply_tokens: tuple[int, int] = (2, 12)  # text ids before TURN_END
    max_new_tokens: int = 12
    mean_gap_us: int = 2_000  # between conversation starts
    think_us: tuple[int, int] = (20_000, 80_000)  # between a conversation's turns


def conversations(requests: int, seed: int, mix: ConversationMix = ConversationMix()) -> list[Conversation]:
    """`requests` turns in arrival order of their conversations' starts (ties keep generation order)."""
    return list(islice(chain.from_iterable(_conversations(seed, mix)), requests))


def arriving(requests: int, seed: int, mix: ConversationMix = ConversationMix()) -> Iterator[Conversation]:
    """The turns `conversations` gives, in arrival order (ties in its order), made as they are needed: a turn
    is let out once a conversation starts after it arrives, since conversations start in order and no turn
    arrives before its conversation starts. Only the conversations under way are held."""
    pending: list[tuple[int, int, Conversation]] = []  # a heap by (arrival, position in `conversations`)
    index = 0
    for turns in _conversations(seed, mix):
        if index == requests:
            break
        while pending and pending[0][0] <= turns[0].arrival_us:
            yield heapq.heappop(pending)[2]
        for turn in turns[: requests - index]:
            heapq.heappush(pending, (turn.arrival_us, index, turn))
            index += 1
    while pending:
        yield heapq.heappop(pending)[2]


def _conversations(seed: int, mix: ConversationMix) -> Iterator[list[Conversation]]:
    """Each conversation's turns, without end; all randomness from `seed`."""
    ids, rng = framing_ids(), random.Random(seed)
    turn_end = ids["turn_end"]
    systems = [(ids["system"], *rng.randbytes(mix.system_tokens), turn_end) for _ in range(mix.system_prompts)]
    start, index = 0, 0
    while True:
        start += round(rng.expovariate(1 / mix.mean_gap_us))
        history, arrival, turns = systems[rng.randrange(len(systems))], start, []
        for turn in range(rng.randint(*mix.turns)):
            question = rng.randbytes(rng.randint(*mix.user_tokens))
            prompt = (*history, ids["user"], *question, turn_end, ids["assistant"])
            text = rng.randbytes(rng.randint(*mix.reply_tokens))
            output = (*text, turn_end)[: mix.max_new_tokens]
            complete = output[-1] == turn_end
            turns.append(Conversation(f"c{index}t{turn}", arrival, prompt, output, mix.max_new_tokens, complete))
            history = (*prompt, *output)
            arrival += rng.randint(*mix.think_us)
        if turns:
            yield turns
        index += 1
