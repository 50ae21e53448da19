"""Workload documents for serving benches (multi-turn chats spread over time, and bursts) and the system
they are served under.

The prompts are the built-in skill conversations (`training.conversation_corpus`,
development split), which the shipped chat model answers, so a later turn's
prompt begins with an earlier turn's prompt and answer: whole-prefix reuse hits
when the model answered as the conversation did. The documents are the Workload
form `jgpt record` and `jgpt serve` read (turns, framed by the tokenizer), and
import no jax.
"""

from __future__ import annotations

import random

from training.conversation_corpus import split_conversations

# kvsim's hypothetical rates (docs/experiments.md defaults): what an uncalibrated prediction assumes. The
# engine validates and ignores them.
HYPOTHETICAL = {
    "transfer": {"link_bytes_per_us": 1000, "link_latency_us": 5},
    "compute_service": {"compute_flops_per_us": 100000, "memory_bytes_per_us": 10000},
}

# Framed byte length of every prompt (an upper bound on its tokens), so prompt + answer fit the context.
MAX_PROMPT_BYTES = 96


def system(policy: str, max_active: int, device_kv_bytes: int, host_kv_bytes: int, retention: str = "lru") -> dict:
    """A KVResidencySystemConfig (JSON) that rejects nothing these benches send."""
    return {
        "max_requests": 1024,
        "max_new_tokens_cap": 128,
        "scheduling": {"max_active_requests": max_active, "policy": policy},
        "kv_cache": {"device_kv_bytes": device_kv_bytes, "host_kv_bytes": host_kv_bytes, "retention_policy": retention},
        **HYPOTHETICAL,
    }


def chat_workload(conversations: int = 16, turns: int = 4, spread_us: int = 5_000_000, max_new_tokens: int = 24,
                  seed: int = 0) -> dict:  # fmt: skip
    """`conversations` chats of up to `turns` user turns each; chats start uniformly over the first half of
    `spread_us` and each later turn follows the one before by a drawn gap of at most half the spread over the
    turns, so arrivals span about `spread_us`."""
    rng = random.Random(f"jgpt-bench-chat/{seed}")
    arrivals = []
    for c, chat in enumerate(_chats(conversations, turns, seed)):
        at = rng.randrange(spread_us // 2)
        gap = spread_us // (2 * max(1, len(chat) - 1))
        for t, prompt_turns in enumerate(chat):
            arrivals.append((at, f"c{c}t{t}", prompt_turns))
            at += rng.randrange(gap * 3 // 4, gap + 1)
    arrivals.sort(key=lambda a: a[0])
    return _document("multi_turn_chat", arrivals, max_new_tokens)


def burst_workload(requests: int = 32, max_new_tokens: int = 24, seed: int = 1, bursts: int = 1,
                   every_us: int = 0) -> dict:  # fmt: skip
    """`requests` single-turn prompts (each chat's first turn), all arriving at once; with `bursts`, that many
    such bursts of other prompts, `every_us` apart."""
    first_turns = [chat[0] for chat in _chats(requests * bursts, 1, seed)]
    arrivals = [(i // requests * every_us, f"b{i}", turns) for i, turns in enumerate(first_turns)]
    return _document("burst", arrivals, max_new_tokens)


def sweep_workload(groups: tuple[int, ...] = (1, 2, 4, 8), turns: int = 4, max_new_tokens: int = 24, seed: int = 11,
                   idle_us: int = 30_000, per_request_us: int = 15_000) -> dict:  # fmt: skip
    """A profiling sweep (as Vidur profiles an engine before simulating it): chats whose requests arrive in
    groups of each size in `groups` at once, round after round, round t bringing every chat's turn t (so a
    round's prompts are longer and reuse the previous round's states). Each group's decode steps batch its
    rows at every context position its turns reach, its requests end together, and the engine idles for
    about `idle_us` before the next group (a group gets `idle_us + per_request_us * size`)."""
    chats = _chats(sum(groups), turns, seed)
    arrivals, at = [], 0
    for t in range(turns):
        first = 0
        for size in groups:
            for c in range(first, first + size):
                if t < len(chats[c]):
                    arrivals.append((at, f"s{c}t{t}", chats[c][t]))
            first += size
            at += idle_us + per_request_us * size
    return _document("profiling_sweep", arrivals, max_new_tokens)


def _chats(count: int, turns: int, seed: int) -> list[list[list[dict]]]:
    """Per chat, the turns of each of its requests: everything before a user turn, and that turn."""
    chats = []
    for conversation in split_conversations(seed, "development", count, MAX_PROMPT_BYTES):
        pairs = conversation.turns()
        prompts = []
        for end, (role, _) in enumerate(pairs):
            prefix = pairs[: end + 1]
            if role != "user" or sum(len(text.encode()) + 2 for _, text in prefix) > MAX_PROMPT_BYTES:
                continue
            prompts.append([{"role": r, "text": text} for r, text in prefix])
        chats.append(prompts[:turns])
    return chats


def _document(kind: str, arrivals: list, max_new_tokens: int) -> dict:
    return {
        "kind": kind,
        "requests": [
            {
                "request_id": rid,
                "arrival_us": at,
                "request": {"turns": turns, "generation": {"max_new_tokens": max_new_tokens}},
            }
            for at, rid, turns in arrivals
        ],
    }
