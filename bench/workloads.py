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


# bench/fidelity.py: workloads whose names start with CALIBRATION are fitted, the others predicted; the predicted
# ones last SCALE times as long as their first versions (12 chats over 2 s, one burst of 32, 16 chats' later turns
# over 1.5 s), because the machine's speed drifts from one second to the next (bench/speed_drift.py) and a run of
# a tenth of a second to two seconds meets too few of its seconds.
CALIBRATION = "calibration"
SCALE = 4


def fidelity_workloads(kv_bytes: int, scale: int = SCALE) -> dict[str, tuple[dict, object]]:
    """bench/fidelity.py's workloads: name -> (Workload document, system for a policy). Those whose names start
    with CALIBRATION are fitted, the others predicted. The predicted workloads last `scale` times as long at the
    same rate (more chats; more bursts, 1.5 s apart), so a run meets more of the machine's seconds."""
    ample = 1 << 40  # bytes: nothing is ever evicted
    calibration = chat_workload(conversations=12, turns=4, spread_us=600_000, seed=11)
    return {
        # The profiling sweep: groups of 1, 2, 4 and 8 chats' turns at once, round after round (batch sizes
        # at every context position, reuse, requests ending together, idle stretches between groups), at the
        # 4 slots the chat and long-prompt workloads run (the other calibration workloads run 8).
        "calibration, sweep": (sweep_workload(), lambda p: system(p, 4, ample, 0)),
        # The calibration chats served whole with a host tier under a tight device budget (every kind of work,
        # offloads and reloads), as their first turns only arriving fifty times as fast (a queue, half the
        # slot capacity), and four times slower (idle stretches of tens of milliseconds).
        "calibration": (calibration, lambda p: system(p, 8, 512 * kv_bytes, 4096 * kv_bytes)),
        # The same at 4 slots: the engine the chat and long-prompt workloads run on, with a host tier.
        "calibration, 4 slots": (calibration, lambda p: system(p, 4, 512 * kv_bytes, 4096 * kv_bytes)),
        "calibration, first turns": (_first_turns(calibration, 50), lambda p: system(p, 8, ample, 0)),
        "calibration, spread out": (_stretched(calibration, 4), lambda p: system(p, 8, ample, 0)),
        "multi-turn chat": (
            chat_workload(conversations=12 * scale, turns=4, spread_us=2_000_000 * scale, seed=0),
            lambda p: system(p, 4, ample, 0),
        ),
        "burst": (
            burst_workload(requests=32, seed=1, bursts=scale, every_us=1_500_000),
            lambda p: system(p, 8, ample, 0),
        ),
        "long prompts, host tier": (
            _longest_turns(chat_workload(conversations=16 * scale, turns=4, spread_us=1_500_000 * scale, seed=5)),
            lambda p: system(p, 4, 512 * kv_bytes, 4096 * kv_bytes),
        ),
    }


def _first_turns(document: dict, faster: int) -> dict:
    first = [
        r | {"arrival_us": r["arrival_us"] // faster} for r in document["requests"] if r["request_id"].endswith("t0")
    ]
    return document | {"requests": first}


def _stretched(document: dict, slower: int) -> dict:
    return document | {"requests": [r | {"arrival_us": r["arrival_us"] * slower} for r in document["requests"]]}


def _longest_turns(document: dict) -> dict:
    """Only the later turns of each chat, the longest prompts (a chat's first one served finds nothing to reuse)."""
    requests = [r for r in document["requests"] if not r["request_id"].endswith("t0")]
    return document | {"kind": "long_prompts", "requests": requests}


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
