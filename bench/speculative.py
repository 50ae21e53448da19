"""Speculative decoding against plain greedy: acceptance rate and tokens/s for K = 1..8, same ids, one run.

Two pairs:

* the shipped chat model (catalog `chat`) with its draft (catalog `chat-draft`) and
  with the draft-free PromptLookup, on held-out exercises of the built-in skills
  (development conversations, seed 0), each generating its reply up to TURN_END
  (budget 16): one request at a time (batch 1), and with `--batched` all of them as
  one batch too;
* a GPT-2-small-sized random target (L12 C768 V50257) with a 2-layer random draft of
  the same width, on a random prompt, 16 ids (no end id): random weights agree on
  little, so this shows what a round costs when almost nothing is accepted.

"decode tok/s" counts the ids the decode loop selects (every id but the first, which the
target's prefill selects) over the loop's wall time, plus, for speculative decoding, the
draft's own prefill (extra work greedy does not do): bench/decode.py's measure. "with
prefill" counts every id over the target's prefill plus that. Every program is compiled
beforehand; times are summed over the batches run, the median of `--repeats` runs of
the whole set. Every speculative run's ids are checked equal to greedy's. The machine
may be shared: expect +-15% run to run, more under load.

"Bound" prices the best any draft could do on the chat workload: the target's forward
over a window of W = K + 1 ids (a verify) against one over 1 id (a greedy step), and
the draft's forward over 1 id, timed alternately; an oracle draft that is always right
and costs nothing needs ceil(n / (K + 1)) verifies for a reply that decodes n ids where
greedy needs n steps, and one that costs what chat-draft's K steps cost adds them to
each verify.

    .venv/bin/python bench/speculative.py [--quick] [--batched] [--requests N] [--repeats N]

The default (24 exercises, 3 repeats, both pairs) is meant to take a few minutes on
a quiet 2-core machine; --quick (10 exercises, 1 repeat, no GPT-2-small-sized pair)
is a smoke run.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from result import BenchRun, add_results_argument
from transformers import GPT2Config, GPT2LMHeadModel

from inference.execution import ModelExecution
from inference.generation import generate
from inference.policy import GenerationPolicy, InferenceRequest
from inference.speculative import PromptLookup, generate_speculative, verify_window
from jgpt.artifacts.catalog import load_model
from jgpt.artifacts.hf_import import convert
from jgpt.model.kv_state import StateIdentity
from training.conversation_corpus import split_conversations
from training.corpus import exercises_of

KS = range(1, 9)
CHAT_BUDGET = 16
RANDOM_BUDGET = 16
NO_END = -1


def catalog_execution(model_id: str) -> ModelExecution:
    artifact = load_model(model_id)
    return ModelExecution.from_artifact(artifact, artifact.tokenizer())


def skill_prompts(execution: ModelExecution, count: int) -> list[tuple[int, ...]]:
    """Prompts of held-out exercises (development split), cycling through the skills."""
    from jgpt.tokenizers.tokenizer import Tokenizer

    tokenizer = Tokenizer.bytes_only()
    conversations = split_conversations(0, "development", count, execution.architecture.context + 1)
    exercises = [e for c in conversations for e in exercises_of(tokenizer, c)]
    by_skill: dict[str, list] = {}
    for e in exercises:
        by_skill.setdefault(e.skill, []).append(e.prompt)
    ordered = [p for group in zip(*by_skill.values()) for p in group]
    return ordered[:count]


def random_pair(width: int = 768) -> tuple[ModelExecution, ModelExecution]:
    """A GPT-2-small-sized random target and a 2-layer random draft, imported from Hugging Face GPT-2 models."""
    executions = []
    for layers, seed in ((12, 0), (2, 1)):
        torch.manual_seed(seed)
        config = GPT2Config(n_layer=layers, n_embd=width, n_head=12, vocab_size=50257, n_positions=1024)
        with tempfile.TemporaryDirectory() as directory:
            GPT2LMHeadModel(config).save_pretrained(directory)
            architecture, weights, _ = convert(directory)
        weights = jax.tree.map(jnp.asarray, weights)
        executions.append(
            ModelExecution(weights, architecture, StateIdentity(f"random-{layers}", "gpt2", "float32"), NO_END)
        )
    return executions[0], executions[1]


def seconds(responses) -> tuple[float, float]:
    """(prefill, decode) wall seconds of one batch: the target's prefill, then the loop (the longest row's
    share of it) plus, for speculative decoding, the draft's prefill."""
    loop = max(sum(c.wall_time_us for c in r.computations[1:]) for r in responses)
    draft = responses[0].speculation.draft_prefill_wall_time_us if responses[0].speculation else 0.0
    return responses[0].computations[0].wall_time_us * 1e-6, (loop + draft) * 1e-6


def measured(run, groups, repeats: int):
    """(decode tok/s, end-to-end tok/s, responses per group): medians over repeats of the whole set."""
    decode_rates, total_rates = [], []
    for _ in range(repeats):
        results = [run(g).responses for g in groups]
        ids = sum(len(r.output_ids) for responses in results for r in responses)
        decode_ids = ids - sum(len(responses) for responses in results)  # each first id comes from the prefill
        times = [seconds(responses) for responses in results]
        decode_rates.append(decode_ids / sum(t[1] for t in times))
        total_rates.append(ids / sum(t[0] + t[1] for t in times))
    return statistics.median(decode_rates), statistics.median(total_rates), results


def table(title: str, target, drafts, requests, repeats: int, batched: bool) -> tuple[list, dict]:
    """Greedy, then every (name, draft) at K = 1..8: greedy's responses per group, and the figures."""
    groups = [requests] if batched else [[r] for r in requests]
    greedy_decode, greedy_total, greedy = measured(functools.partial(generate, target), groups, repeats)
    greedy_ids = [[r.output_ids for r in responses] for responses in greedy]
    ids = sum(len(i) for group in greedy_ids for i in group)
    print(f"\n{title}: {len(requests)} requests, {'one batch' if batched else 'one at a time'}, {ids} output ids")
    print(f"  {'decoding':<16} {'accept':>7} {'ids/round':>9} {'decode tok/s':>12} {'vs greedy':>9} "
          f"{'with prefill':>12} {'vs greedy':>9}  ids")  # fmt: skip
    print(f"  {'greedy':<16} {'':>7} {'':>9} {greedy_decode:12.1f} {1.0:8.2f}x {greedy_total:12.1f} {1.0:8.2f}x")
    rows = {"greedy": {"decode_tok_per_s": greedy_decode, "with_prefill_tok_per_s": greedy_total}}
    for (name, draft), k in itertools.product(drafts, KS):
        decode, total, runs = measured(functools.partial(generate_speculative, target, draft, k=k), groups, repeats)
        same = [[r.output_ids for r in responses] for responses in runs] == greedy_ids
        evidence = [r.speculation for responses in runs for r in responses]
        drafted, accepted = sum(e.drafted for e in evidence), sum(e.accepted for e in evidence)
        rounds = sum(len(e.rounds) for e in evidence)
        acceptance = accepted / drafted if drafted else float("nan")
        per_round = (ids - len(requests)) / rounds if rounds else float("nan")
        print(f"  {f'{name} K={k}':<16} {acceptance:7.1%} {per_round:9.2f} {decode:12.1f} {decode / greedy_decode:8.2f}x "
              f"{total:12.1f} {total / greedy_total:8.2f}x  {'same as greedy' if same else 'DIFFER FROM GREEDY'}")  # fmt: skip
        rows[f"{name} K={k}"] = {
            "accepted_fraction": acceptance, "ids_per_round_count": per_round, "decode_tok_per_s": decode,
            "decode_against_greedy_x": decode / greedy_decode, "with_prefill_tok_per_s": total,
            "with_prefill_against_greedy_x": total / greedy_total, "same_ids_as_greedy": same,
        }  # fmt: skip
    shape = "one batch" if batched else "one at a time"
    return greedy, {f"{title}: {len(requests)} requests, {shape}, {ids} output ids": rows}


def bound(target: ModelExecution, draft: ModelExecution, prompt, greedy, repeats: int) -> dict:
    """The oracle's speed-up at each K: verify(K + 1) against step(1) times, priced over the replies' decode ids,
    free and at the draft's cost (K draft steps a round)."""
    verify = jax.jit(verify_window, static_argnames=("architecture", "unroll"))

    def forward(model: ModelExecution, width: int):
        start = model.prefill([prompt], capacity=target.architecture.context)[1]
        return functools.partial(
            verify,
            model.weights,
            model.layer_weights,
            model.architecture,
            start,
            jnp.ones((1, width), jnp.int32),
            model.scan_unroll,
        )

    calls = {w: forward(target, w) for w in (1, *(k + 1 for k in KS))} | {"draft": forward(draft, 1)}
    for call in calls.values():
        jax.block_until_ready(call())
    times: dict[int | str, list[float]] = {w: [] for w in calls}
    for _ in range(20 * repeats):  # alternating, so load changes hit every window alike
        for w, call in calls.items():
            started = time.perf_counter()
            jax.block_until_ready(call())
            times[w].append(time.perf_counter() - started)
    step = statistics.median(times[1])
    drafting = statistics.median(times["draft"]) / step
    decoded = [len(r.output_ids) - 1 for responses in greedy for r in responses]
    print(
        f"\nBound: {len(decoded)} replies decoding {sum(decoded)} ids; one target forward over 1 id {step * 1e6:.0f} us, "
        f"the draft's {drafting:.2f}x that"
    )
    print(
        f"  {'K':>2} {'verify us':>9} {'vs step':>7} {'oracle rounds':>13} {'oracle speed-up':>15} {'at the draft cost':>17}"
    )
    rows = {}
    for k in KS:
        ratio = statistics.median(times[k + 1]) / step
        rounds = sum(-(-n // (k + 1)) for n in decoded)
        free, priced = sum(decoded) / (rounds * ratio), sum(decoded) / (rounds * (ratio + k * drafting))
        print(f"  {k:>2} {ratio * step * 1e6:9.0f} {ratio:6.2f}x {rounds:13d} {free:14.2f}x {priced:16.2f}x")
        rows[f"K={k}"] = {"verify_us": ratio * step * 1e6, "verify_against_step_x": ratio, "oracle_rounds_count": rounds,
                          "oracle_free_speed_up_x": free, "oracle_at_draft_cost_speed_up_x": priced}  # fmt: skip
    title = (f"Bound: {len(decoded)} replies decoding {sum(decoded)} ids; a target step over 1 id {step * 1e6:.0f} us, "
             f"the draft's {drafting:.2f}x that")  # fmt: skip
    return {title: rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 requests, and no GPT-2-small-sized pair (a smoke run)")
    parser.add_argument("--batched", action="store_true", help="also every chat request as one batch")
    parser.add_argument("--requests", type=int, default=24, help="held-out exercises of the chat workload")
    parser.add_argument("--repeats", type=int, default=3)
    add_results_argument(parser)
    args = parser.parse_args()
    run = BenchRun.start("speculative", __doc__)
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    target, draft = catalog_execution("chat"), catalog_execution("chat-draft")
    count = 10 if args.quick else args.requests
    requests = [
        InferenceRequest(f"skill-{i}", p, GenerationPolicy(CHAT_BUDGET))
        for i, p in enumerate(skill_prompts(target, count))
    ]
    a, d = target.architecture, draft.architecture
    pair = f"chat (L{a.layers} C{a.width}) with chat-draft (L{d.layers} C{d.width})"
    drafts = [("draft", draft), ("lookup", PromptLookup())]
    greedy, figures = table(pair + " and prompt lookup", target, drafts, requests, args.repeats, batched=False)
    if args.batched:
        figures |= table(pair + " and prompt lookup", target, drafts, requests, args.repeats, batched=True)[1]
    figures |= bound(target, draft, requests[0].prompt_ids, greedy, args.repeats)
    if args.quick:
        run.write(figures, args.results)
        return
    target, draft = random_pair()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 50257, size=16).tolist()]
    requests = [InferenceRequest(f"random-{i}", p, GenerationPolicy(RANDOM_BUDGET)) for i, p in enumerate(prompts)]
    figures |= table("GPT-2-small-sized random target (L12 C768) with a 2-layer random draft", target,
                     [("draft", draft)], requests, args.repeats, batched=False)[1]  # fmt: skip
    run.write(figures, args.results)


if __name__ == "__main__":
    main()
