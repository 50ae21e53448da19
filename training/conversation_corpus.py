"""The built-in corpus: deterministic multi-turn conversations over learnable skills.

A conversation opens with the same system turn, stores a named value, asks as many
skill exercises as fit its token budget and ends by recalling the stored value, so every
conversation shares a prefix with every other and each assistant turn extends
the prefix of the one before: the reuse pattern a KV cache exploits.

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
# Framing adds a role marker and TURN_END to every turn.
FRAMING_TOKENS_PER_TURN = 2


@dataclass(frozen=True)
class Conversation:
    """System text then user/assistant exchanges; each exchange names the skill it exercises."""

    system: str
    exchanges: tuple[Exchange, ...]

    def turns(self) -> tuple[tuple[str, str], ...]:
        """(role, text) pairs in order, the system turn first."""
        pairs = [("system", self.system)]
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
    instead of padding; the stored value is asked for after all of them.
    """
    store, recall = store_and_recall_in(split, rng)
    names = sorted(TASKS)
    tasks: list[Exchange] = []
    while len(tasks) < MAX_TASKS:
        task = drawn_in(split, TASKS[rng.choice(names)], rng)
        if Conversation(SYSTEM_TEXT, (store, *tasks, task, recall)).byte_length() > max_tokens:
            break
        tasks.append(task)
    return Conversation(SYSTEM_TEXT, (store, *tasks, recall))


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
