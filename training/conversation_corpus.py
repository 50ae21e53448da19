"""The built-in corpus: deterministic multi-turn conversations over learnable skills.

A conversation asks as many skill exercises as fit its token budget. Most open
with the same system turn and store a named value that a later turn asks for, so
many conversations share a prefix and each assistant turn extends the prefix of
the one before: the reuse pattern a KV cache exploits. Which framing a
conversation gets, and after how many exercises the stored value is asked for,
are drawn, so a model meets a bare request and an early recall as well as the
full pattern.

The corpus is a function of (seed, sizes, token budget); `data_sha256` is the
SHA-256 of its canonical JSON-lines document, the exact text trained on.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

from training.skills import TASKS, Exchange, Split, drawn_in, store_and_recall_in

SYSTEM_TEXT = "you are jgpt."
# Enough for any window a CPU run trains on; the token budget usually ends a conversation first.
MAX_TASKS = 8
# Shares of conversations with the system turn and with a stored value.
WITH_SYSTEM, WITH_STORE = 0.5, 0.75
# Framing adds a role marker and TURN_END to every turn.
FRAMING_TOKENS_PER_TURN = 2


@dataclass(frozen=True)
class Conversation:
    """An optional system text then user/assistant exchanges; each exchange names the skill it exercises."""

    system: str | None
    exchanges: tuple[Exchange, ...]

    def turns(self) -> tuple[tuple[str, str], ...]:
        """(role, text) pairs in order, the system turn (if any) first."""
        pairs = [] if self.system is None else [("system", self.system)]
        for exchange in self.exchanges:
            pairs += [("user", exchange.request), ("assistant", exchange.answer)]
        return tuple(pairs)

    def byte_length(self) -> int:
        """Framed length in byte tokens, an upper bound for any tokenizer with byte fallback."""
        return sum(len(text.encode()) + FRAMING_TOKENS_PER_TURN for _, text in self.turns())

    def to_json(self) -> dict:
        return {
            "turns": [{"role": role, "text": text} for role, text in self.turns()],
            "skills": [exchange.skill for exchange in self.exchanges],
        }


@dataclass(frozen=True)
class ConversationCorpus:
    seed: int
    train: tuple[Conversation, ...]
    development: tuple[Conversation, ...]

    def document(self) -> bytes:
        """The canonical JSON-lines text of both splits: the exact data the hash covers."""
        return jsonl_document({"train": self.train, "development": self.development})

    @property
    def data_sha256(self) -> str:
        return hashlib.sha256(self.document()).hexdigest()


def jsonl_document(splits: dict[str, tuple[Conversation, ...]]) -> bytes:
    lines = [
        json.dumps({"split": split, **conversation.to_json()}, sort_keys=True, separators=(",", ":"))
        for split, conversations in splits.items()
        for conversation in conversations
    ]
    return ("\n".join(lines) + "\n").encode()


def conversation(rng: random.Random, split: Split, max_tokens: int) -> Conversation:
    """One conversation that fills up to `max_tokens`: exercises are added while the next one fits.

    Filling the window puts as many scored answers in a training row as it can hold,
    instead of padding. A stored value is asked for after a drawn number of them.
    """
    system = SYSTEM_TEXT if rng.random() < WITH_SYSTEM else None
    stored = store_and_recall_in(split, rng) if rng.random() < WITH_STORE else None
    recall_after = rng.randint(0, MAX_TASKS)

    def framed(tasks: list[Exchange]) -> Conversation:
        if stored is None:
            return Conversation(system, tuple(tasks))
        store, recall = stored
        at = min(recall_after, len(tasks))
        return Conversation(system, (store, *tasks[:at], recall, *tasks[at:]))

    names = sorted(TASKS)
    tasks: list[Exchange] = []
    while len(tasks) < MAX_TASKS:
        task = drawn_in(split, TASKS[rng.choice(names)], rng)
        # Every conversation scores at least one answer, even past the budget (the corpus then refuses it).
        if framed([*tasks, task]).byte_length() > max_tokens and (tasks or stored):
            break
        tasks.append(task)
    return framed(tasks)


def split_conversations(seed: int, split: Split, count: int, max_tokens: int) -> tuple[Conversation, ...]:
    """`count` conversations of one split; each split draws from its own stream of the seed."""
    rng = random.Random(f"jgpt-conversations/{seed}/{split}")
    return tuple(conversation(rng, split, max_tokens) for _ in range(count))


def generate(seed: int, train_size: int, development_size: int, max_tokens: int) -> ConversationCorpus:
    """Both splits from one seed; their requests are disjoint by construction (see `skills.split_of`)."""
    return ConversationCorpus(
        seed,
        split_conversations(seed, "train", train_size, max_tokens),
        split_conversations(seed, "development", development_size, max_tokens),
    )
