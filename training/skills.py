"""The learnable skills of the built-in conversation corpus.

Each skill draws one exchange (a user request and the exact assistant answer)
from an explicit `random.Random`. The exercises are small enough that a model
of a few hundred thousand parameters masters them on a CPU in minutes, and
varied enough that memorising the training set does not pass held-out
evaluation: the development split holds requests never seen in training.

Every request of a conversation belongs to one split, decided by a hash of the
request itself, so no development request can occur in the training data.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Split = Literal["train", "development"]

LETTERS = string.ascii_lowercase
# Counting over a narrow alphabet makes counts above one common.
COUNT_LETTERS = "abc"
STORE_NAMES = ("red", "blue", "gold", "jade")
DEVELOPMENT_PERCENT = 10


@dataclass(frozen=True)
class Exchange:
    """One user request and its exact expected answer; `skill` is None for set-up turns."""

    skill: str | None
    request: str
    answer: str


def split_of(request: str) -> Split:
    """The split a request belongs to: a stable hash, so train and development never share one."""
    bucket = hashlib.sha256(request.encode()).digest()[0] * 100 // 256
    return "development" if bucket < DEVELOPMENT_PERCENT else "train"


def _word(rng: random.Random, alphabet: str, low: int, high: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def reverse(rng: random.Random) -> Exchange:
    word = _word(rng, LETTERS, 3, 4)
    return Exchange("reverse", f"reverse {word}", word[::-1])


def sort(rng: random.Random) -> Exchange:
    word = _word(rng, LETTERS, 3, 4)
    return Exchange("sort", f"sort {word}", "".join(sorted(word)))


def add(rng: random.Random) -> Exchange:
    a, b = rng.randrange(10, 100), rng.randrange(10)
    return Exchange("add", f"add {a}+{b}", str(a + b))


def count(rng: random.Random) -> Exchange:
    word = _word(rng, COUNT_LETTERS, 3, 5)
    letter = rng.choice(COUNT_LETTERS)
    return Exchange("count", f"count {letter} in {word}", str(word.count(letter)))


TASKS: dict[str, Callable[[random.Random], Exchange]] = {
    "reverse": reverse,
    "sort": sort,
    "add": add,
    "count": count,
}
SKILLS = (*TASKS, "recall")


def store_and_recall(rng: random.Random) -> tuple[Exchange, Exchange]:
    """A value stored in an early turn and asked for in the last one: recall across turns."""
    name = rng.choice(STORE_NAMES)
    value = _word(rng, LETTERS, 3, 4)
    return Exchange(None, f"store {name} {value}", "ok"), Exchange("recall", f"get {name}", value)


def drawn_in(split: Split, draw: Callable[[random.Random], Exchange], rng: random.Random) -> Exchange:
    """Draw from a skill until the request falls in `split` (rejection keeps the skill's distribution)."""
    while True:
        exchange = draw(rng)
        if split_of(exchange.request) == split:
            return exchange


def store_and_recall_in(split: Split, rng: random.Random) -> tuple[Exchange, Exchange]:
    while True:
        store, recall = store_and_recall(rng)
        if split_of(store.request) == split:
            return store, recall
