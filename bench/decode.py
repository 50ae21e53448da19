"""Decode speed: jgpt's jitted loop against Hugging Face transformers `generate`, same weights, same work.

For a tiny GPT (layers 4, width 128) and a GPT-2-small-sized one (layers 12, width
768, vocabulary 50257), both built as random GPT2LMHeadModels and imported into
jgpt, this prints greedy decode tokens/s with the KV cache on for jgpt and for HF
(batch 1, same prompt, same number of new tokens), their ratio, jgpt's layers
layer strategies (unrolled layers, the scan unrolled, the rolled scan), batched throughput at batch 16 with ragged prompts, and the
GPT-2-small memory roofline (weight + KV bytes per token over measured bandwidth).

Decode time excludes the prompt: jgpt reports its loop's wall time (dispatch to
ready, compiled beforehand) per decode step; HF's is generate(N) - generate(1)
over N - 1 tokens. Figures are medians of several runs; the machine is shared, so
expect +-15% run to run.

    .venv/bin/python bench/decode.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from inference.execution import ModelExecution
from inference.generation import generate
from inference.policy import GenerationPolicy, InferenceRequest
from jgpt.hf_import import convert
from jgpt.kv_state import StateIdentity
from jgpt.layer_strategy import LayerStrategy

SIZES = {
    "tiny (L4 C128 V512)": dict(n_layer=4, n_embd=128, n_head=4, vocab_size=512, n_positions=256),
    "GPT-2-small size (L12 C768 V50257)": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
}
NO_END = -1  # no id ends a bench run early: both sides decode exactly N tokens
BATCH = 16
STRATEGIES = (
    (LayerStrategy.unrolled_layers(), "unrolled layers"),
    (LayerStrategy.scan(unroll=True), "scan, unrolled"),
    (LayerStrategy.scan(), "scan"),
)


def hf_model(config: dict, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**config, activation_function="gelu_new", attn_pdrop=0, resid_pdrop=0, embd_pdrop=0))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def jgpt_execution(model: GPT2LMHeadModel, strategy: LayerStrategy) -> ModelExecution:
    """The same weights in jgpt, through its own Hugging Face import."""
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        architecture, weights, _ = convert(directory)
    weights = jax.tree.map(jnp.asarray, weights)
    return ModelExecution(weights, architecture, StateIdentity("bench", "bench", "float32"), NO_END, strategy)


def prompts(batch: int, vocabulary: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocabulary, size=8 + 3 * b).tolist() for b in range(batch)]


def jgpt_decode_seconds(execution: ModelExecution, batch_prompts, new_tokens: int, repeats: int) -> tuple[float, tuple]:
    """Median seconds per decode step of the jitted loop over the batch, and the first row's ids."""
    requests = [InferenceRequest(f"r{b}", p, GenerationPolicy(new_tokens)) for b, p in enumerate(batch_prompts)]
    runs = []
    for _ in range(repeats):
        (first, *_) = responses = generate(execution, requests).responses
        runs.append(first.computations[1].wall_time_us * 1e-6)
        assert all(r.outcome.selected_tokens == new_tokens for r in responses)
    return statistics.median(runs), first.output_ids


def hf_decode_seconds(model, batch_prompts, new_tokens: int, repeats: int) -> tuple[float, tuple, int]:
    """Median seconds per decode step, (generate(N) - generate(1)) / (N - 1), prompts left-padded;
    with HF's better torch thread count (1 or all cores: a busy machine can punish either)."""
    width = max(map(len, batch_prompts))
    ids = torch.zeros((len(batch_prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(batch_prompts):
        ids[b, width - len(p) :], mask[b, width - len(p) :] = torch.tensor(p), 1

    def run(n: int) -> tuple[float, torch.Tensor]:
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, use_cache=True)
        return time.perf_counter() - started, out

    results = []
    for threads in sorted({1, os.cpu_count()}):
        torch.set_num_threads(threads)
        run(2)  # warm-up
        runs = []
        for _ in range(repeats):
            full, out = run(new_tokens)
            first, _ = run(1)
            runs.append((full - first) / (new_tokens - 1))
        results.append((statistics.median(runs), tuple(out[0, width:].tolist()), threads))
    return min(results)


def memory_bandwidth() -> float:
    """Bytes/s of a jitted matrix-vector product over a 256 MB matrix (best of 5): what decode is bound by."""
    w = jnp.ones((8192, 8192), jnp.float32)
    x = jnp.ones((8192,), jnp.float32)
    matvec = jax.jit(lambda w, x: w @ x)
    matvec(w, x).block_until_ready()
    best = min(_timed(lambda: matvec(w, x).block_until_ready()) for _ in range(5))
    return w.nbytes / best


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats (a smoke run)")
    args = parser.parse_args()
    repeats = 2 if args.quick else 5
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, torch {torch.__version__}, {os.cpu_count()} cores")
    for name, config in SIZES.items():
        small = config["n_layer"] == 4
        new_tokens = (32 if args.quick else 128) if small else (8 if args.quick else 32)
        model = hf_model(config)
        print(f"\n{name}: {new_tokens} new tokens, greedy, KV cache on")
        single = prompts(1, config["vocab_size"])
        hf_step, hf_ids, threads = hf_decode_seconds(model, single, new_tokens, repeats)
        print(f"  HF transformers generate   {1 / hf_step:9.1f} tok/s  ({hf_step * 1e3:.2f} ms/token, {threads} torch threads)")
        for strategy, label in STRATEGIES:
            execution = jgpt_execution(model, strategy)
            step, ids = jgpt_decode_seconds(execution, single, new_tokens, repeats)
            same = "same ids as HF" if ids == hf_ids else "ids differ from HF"
            print(f"  jgpt, {label:<19} {1 / step:9.1f} tok/s  ({step * 1e3:.2f} ms/token)  "
                  f"ratio {hf_step / step:5.2f}x  [{same}]")  # fmt: skip
            if strategy == LayerStrategy.for_backend():
                best, best_step = execution, step
        batch = prompts(BATCH, config["vocab_size"])
        hf_batch, _, _ = hf_decode_seconds(model, batch, new_tokens, max(2, repeats // 2))
        jgpt_batch, _ = jgpt_decode_seconds(best, batch, new_tokens, max(2, repeats // 2))
        print(f"  batch {BATCH} (prompts {len(batch[0])}..{len(batch[-1])} ids): HF {BATCH / hf_batch:9.1f} tok/s, "
              f"jgpt {BATCH / jgpt_batch:9.1f} tok/s, ratio {hf_batch / jgpt_batch:5.2f}x")  # fmt: skip
        if not small:
            bandwidth = memory_bandwidth()
            position = len(single[0]) + new_tokens // 2
            per_token = best.costs.memory_bytes(position, position + 1)
            print(f"  memory roofline: {per_token / 1e6:.1f} MB per token (weights + KV) at {bandwidth / 1e9:.1f} GB/s "
                  f"measured = {bandwidth / per_token:.1f} tok/s; jgpt reaches {per_token / best_step / bandwidth:.0%} of it")  # fmt: skip


if __name__ == "__main__":
    main()
