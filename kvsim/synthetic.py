"""Synthetic multi-turn conversations with shared prefixes (`kvsim synthesize`, examples, tests, the bench).

Every conversation opens with one of a few shared system prompts (or none); each turn's prompt is
the whole conversation so far plus a new user turn, framed with the team's token contract ([role]
text [TURN_END]), so the state a finished turn leaves behind is an exact prefix of the next turn's
prompt. A ConversationMix shapes it: how often conversations start (a Poisson process or fixed
spacing), how many turns each has, the ids a turn adds and a reply selects (`kvsim.distributions`),
and the think time between a conversation's turns, which arrive on that schedule whether or not the
previous reply is done (an open loop). All randomness comes from one explicit seed.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from itertools import chain, islice

from jgpt.foundation.errors import ApiError
from jgpt.foundation.units import duration_us
from kvsim.analytic import Conversation, framing_ids
from kvsim.distributions import Distribution, Uniform

# A request holds up to a few hundred ids and its costs per position: 2,000 requests make a
# 5.7 MB document, so the limit stays under 300 MB and a minute of work.
REQUEST_LIMIT = 100_000
# The ids that frame a user's message in a turn's prompt: the user marker, the turn end, the assistant marker.
FRAMING = 3


class Arrivals(StrEnum):
    POISSON = "poisson"  # exponential gaps between conversation starts
    FIXED = "fixed"  # conversation n starts at n times the mean gap


@dataclass(frozen=True)
class ConversationMix:
    system_prompts: int = 4  # 0: conversations open with no system prompt
    system_tokens: int = 32
    turns: tuple[int, int] = (1, 6)  # a conversation's turns, each count from the first to the second alike
    prompt_tokens: Distribution = Uniform(8 + FRAMING, 40 + FRAMING)  # ids a turn adds: a message and FRAMING
    output_tokens: Distribution = Uniform(3, 13)  # ids a reply selects, its turn end included, before the budget
    max_new_tokens: int = 12  # each request's budget: a longer reply stops there, incomplete
    mean_gap_us: float = 2_000  # between conversation starts
    arrivals: Arrivals = Arrivals.POISSON
    think_us: tuple[int, int] = (20_000, 80_000)  # between a conversation's turns, each from first to second alike
    context: int = 4096  # a turn's prompt plus max_new_tokens fits in it

    @property
    def mean_turns(self) -> float:
        return sum(self.turns) / 2

    def with_rate(self, requests_per_s: float) -> ConversationMix:
        """This mix with conversations starting often enough for `requests_per_s` requests a second on average."""
        return replace(self, mean_gap_us=self.mean_turns * 1e6 / requests_per_s)


@dataclass(frozen=True)
class Synthesized:
    """`synthesize`'s requests in arrival order, and what fitting the context changed."""

    items: list[Conversation]
    conversations: int
    cut: int  # user messages cut short so that their turn fits the context
    ended: int  # conversations ended before their drawn turns, no room being left for another


@dataclass(frozen=True)
class _Made:
    turns: list[Conversation]
    cut: frozenset[str]  # the turns whose user message was cut to fit the context
    ended: bool


def check_fits(mix: ConversationMix, option: str) -> None:
    """Refuse a mix whose first turn cannot fit the context even at its shortest."""
    first = (mix.system_tokens + 2 if mix.system_prompts else 0) + mix.prompt_tokens.least + mix.max_new_tokens
    if first > mix.context:
        raise ApiError(
            option,
            f"a first turn takes at least {first} positions (system prompt, prompt ids, --max-new-tokens), "
            f"past the model's context {mix.context}",
        )


def conversations(requests: int, seed: int, mix: ConversationMix = ConversationMix()) -> list[Conversation]:
    """`requests` turns in arrival order of their conversations' starts (ties keep generation order)."""
    return list(islice(chain.from_iterable(made.turns for made in _conversations(seed, mix)), requests))


def arriving(requests: int, seed: int, mix: ConversationMix = ConversationMix()) -> Iterator[Conversation]:
    """The turns `conversations` gives, in arrival order (ties in its order), made as they are needed."""
    return _arriving(_conversations(seed, mix), requests)


def synthesize(requests: int, seed: int, mix: ConversationMix) -> Synthesized:
    """The turns `arriving` gives, with how many conversations they come from and what the context changed."""
    made: list[_Made] = []

    def counted() -> Iterator[_Made]:
        for conversation in _conversations(seed, mix):
            made.append(conversation)
            yield conversation

    items = list(_arriving(counted(), requests))
    written = {item.request_id for item in items}
    taken = [m for m in made if m.turns[0].request_id in written]
    cut = sum(len(m.cut & written) for m in taken)
    return Synthesized(items, len(taken), cut, sum(m.ended for m in taken))


def shape_summary(made: Synthesized, mix: ConversationMix, rate: float) -> str:
    """What `kvsim synthesize` made, against what was asked: the rate, the lengths, what the context changed."""
    items = made.items
    span = items[-1].arrival_us - items[0].arrival_us
    measured = f"{(len(items) - 1) * 1e6 / span:.4g} requests/s over {duration_us(span)}" if span else "all at once"
    lines = [
        f"arrivals: {mix.arrivals}, {rate:g} requests/s asked, {measured} made; {made.conversations} conversations",
        f"prompt ids (a turn adds {mix.prompt_tokens.spec()}) {_spread([len(i.prompt_ids) for i in items])}",
        f"output ids ({mix.output_tokens.spec()}, at most {mix.max_new_tokens}) "
        f"{_spread([len(i.output_ids) for i in items])}",
    ]
    if made.cut or made.ended:
        lines.append(
            f"to fit the model's context {mix.context}: {made.cut} user messages cut, "
            f"{made.ended} conversations ended before their drawn turns"
        )
    return "\n".join(lines)


def _spread(values: list[int]) -> str:
    values = sorted(values)
    return f"median {values[len(values) // 2]}, p90 {values[len(values) * 9 // 10]}, max {values[-1]}"


def _arriving(conversations_made: Iterator[_Made], requests: int) -> Iterator[Conversation]:
    """A turn is let out once a conversation starts after it arrives, since conversations start in order and
    no turn arrives before its conversation starts. Only the conversations under way are held."""
    pending: list[tuple[int, int, Conversation]] = []  # a heap by (arrival, position in `conversations`)
    index = 0
    for made in conversations_made:
        if index == requests:
            break
        while pending and pending[0][0] <= made.turns[0].arrival_us:
            yield heapq.heappop(pending)[2]
        for turn in made.turns[: requests - index]:
            heapq.heappush(pending, (turn.arrival_us, index, turn))
            index += 1
    while pending:
        yield heapq.heappop(pending)[2]


def _conversations(seed: int, mix: ConversationMix) -> Iterator[_Made]:
    """Each conversation's turns, without end; all randomness from `seed`."""
    check_fits(mix, "mix")
    ids, rng = framing_ids(), random.Random(seed)
    turn_end = ids["turn_end"]
    systems = [(ids["system"], *rng.randbytes(mix.system_tokens), turn_end) for _ in range(mix.system_prompts)]
    start, index = 0, 0
    while True:
        if mix.arrivals == Arrivals.POISSON:
            start += round(rng.expovariate(1 / mix.mean_gap_us))
        else:
            start = round(index * mix.mean_gap_us)
        history, arrival, turns, cut = systems[rng.randrange(len(systems))] if systems else (), start, [], set()
        drawn = rng.randint(*mix.turns)
        for turn in range(drawn):
            room = mix.context - mix.max_new_tokens - len(history) - FRAMING
            if room < 1:
                break
            request_id, message = f"c{index}t{turn}", mix.prompt_tokens.draw(rng) - FRAMING
            if message > room:
                cut.add(request_id)
            prompt = (*history, ids["user"], *rng.randbytes(min(message, room)), turn_end, ids["assistant"])
            text = rng.randbytes(mix.output_tokens.draw(rng) - 1)
            output = (*text, turn_end)[: mix.max_new_tokens]
            complete = output[-1] == turn_end
            turns.append(Conversation(request_id, arrival, prompt, output, mix.max_new_tokens, complete))
            history = (*prompt, *output)
            arrival += rng.randint(*mix.think_us)
        yield _Made(turns, frozenset(cut), len(turns) < drawn)
        index += 1
