"""Device check: on whatever backend JAX has, what jgpt does there, against what the device could do.

Prints, in one run:

1. the device (`jgpt devices`);
2. parity: max abs logit error of a GPT-2-small-sized model (L12 C768 V50257,
   random weights) against Hugging Face transformers (torch, CPU, float32) on
   the same weights and ids;
3. decode tokens/s at batch 1 and 32 in f32 and bf16 against the memory
   roofline: a decode step must read every weight matrix once and each row's
   keys and values, so tokens/s <= rows x bandwidth / bytes per step (bytes
   from the model's WorkCosts at the precision);
4. train-step model-FLOPs utilisation of a ~100M-parameter GPT (L12 C768
   V8192) in f32 and bf16: model FLOPs (6 x parameters per token plus the
   attention products) per second over the device's peak.

Bandwidth and peak: for a GPU or TPU in `PEAKS` (by its device kind) the
datasheet figures; otherwise (the CPU, an unlisted device) measured here: the
bandwidth of a jitted matrix-vector product over a 256 MiB matrix (best of 5,
as bench/decode.py measures it) and the fastest jitted square matmul (f32, bf16). On an accelerator the
measured figures are printed next to the datasheet's.

    python bench/accelerator.py [--steps N] [--new-tokens N]

On CPU the sizes shrink (train batch 1 x 128 tokens, 2 timed steps; 8 new
tokens) so the run stays within about 3 minutes on a quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from result import BenchRun, add_results_argument

from inference.execution import ModelExecution
from inference.generation import generate
from inference.policy import GenerationPolicy, InferenceRequest
from inference.precision import at_precision
from jgpt.artifacts.hf_import import convert
from jgpt.model.architecture import ModelArchitecture
from jgpt.model.kv_state import StateIdentity
from jgpt.model.transformer import forward
from jgpt.model.weights import initialize, parameter_count
from jgpt.runtime.devices import describe
from training.batches import TokenStream
from training.config import TrainingConfig
from training.optimizer import adamw
from training.sharding import batch_sharding, data_mesh, replicated
from training.step import make_train_step, start


@dataclasses.dataclass(frozen=True)
class Peak:
    bandwidth: float  # bytes/s of device memory
    float32: float | None  # FLOP/s of full-f32 matmuls (jgpt's f32 asks for HIGHEST precision: no TF32)
    bfloat16: float  # dense bf16 FLOP/s


# Datasheet peaks (dense, no sparsity) by a substring of `device.device_kind`; the first match wins.
PEAKS = {
    "H200": Peak(4.8e12, 67e12, 989e12),
    "H100 NVL": Peak(3.9e12, 60e12, 835e12),
    "H100 PCIe": Peak(2.0e12, 51e12, 756e12),
    "H100": Peak(3.35e12, 67e12, 989e12),  # SXM
    "A100-SXM4-80GB": Peak(2.039e12, 19.5e12, 312e12),
    "A100-SXM4-40GB": Peak(1.555e12, 19.5e12, 312e12),
    "A100-PCIE-40GB": Peak(1.555e12, 19.5e12, 312e12),
    "A100 80GB PCIe": Peak(1.935e12, 19.5e12, 312e12),
    "L40S": Peak(864e9, 91.6e12, 362e12),
    "L4": Peak(300e9, 30.3e12, 121e12),
    "A10G": Peak(600e9, 31.2e12, 125e12),
    "TPU v6 lite": Peak(1.64e12, None, 918e12),
    "TPU v5 lite": Peak(819e9, None, 197e12),
    "TPU v5": Peak(2.765e12, None, 459e12),  # v5p
    "TPU v4": Peak(1.2e12, None, 275e12),
}
GPT2_SMALL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
TRAIN_ARCHITECTURE = {
    "vocabulary": 8192,
    "width": 768,
    "ffn": 3072,
    "context": 1024,
    "layers": 12,
    "heads": 12,
    "activation": "gelu_tanh",
}
NO_END = -1  # no id ends a bench run early: every row decodes exactly N tokens
PRECISIONS = ("float32", "bfloat16")


def timed(fn) -> float:
    started = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - started


def measured_bandwidth() -> float:
    """Bytes/s of a jitted matrix-vector product over a 256 MiB matrix, best of 5: what a decode step is.

    (A copy also times the allocation of its 256 MiB output, page faults included; a sum runs on one
    thread on XLA CPU: both read as less bandwidth than decode reaches.)
    """
    w, x = jnp.ones((8192, 8192), jnp.float32), jnp.ones((8192,), jnp.float32)
    matvec = jax.jit(lambda w, x: w @ x)
    matvec(w, x).block_until_ready()
    return w.nbytes / min(timed(lambda: matvec(w, x)) for _ in range(5))


def measured_peak(dtype, n: int) -> float:
    """FLOP/s of the fastest of 5 jitted n x n matmuls in `dtype` (f32 at HIGHEST precision, as jgpt's f32 runs)."""
    a = jnp.ones((n, n), dtype)
    precision = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
    product = jax.jit(lambda a: jnp.dot(a, a, precision=precision, preferred_element_type=jnp.float32))
    product(a).block_until_ready()
    return 2 * n**3 / min(timed(lambda: product(a)) for _ in range(5))


def device_peak(on_cpu: bool) -> tuple[Peak, str, Peak]:
    """The peak the tables are judged against, where it came from, and the measured one."""
    kind = jax.devices()[0].device_kind
    n = 1024 if on_cpu else 8192
    measured = Peak(measured_bandwidth(), measured_peak(jnp.float32, n), measured_peak(jnp.bfloat16, n))
    print(f"  measured: matvec {measured.bandwidth / 1e9:.1f} GB/s; matmul {n}^3 f32 {measured.float32 / 1e12:.3f} TFLOP/s, "
          f"bf16 {measured.bfloat16 / 1e12:.3f} TFLOP/s")  # fmt: skip
    for name, peak in PEAKS.items():
        if name in kind:
            f32 = "n/a" if peak.float32 is None else f"{peak.float32 / 1e12:.1f}"
            print(
                f"  datasheet ({name}): {peak.bandwidth / 1e9:.0f} GB/s; f32 {f32} TFLOP/s, bf16 {peak.bfloat16 / 1e12:.0f} TFLOP/s"
            )
            return peak, f"datasheet {name}", measured
    return measured, "measured here", measured


def gpt2_small(directory: str):
    """A random-weight GPT2LMHeadModel of GPT-2 small's size, and the same weights imported into jgpt."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(**GPT2_SMALL, activation_function="gelu_new", attn_pdrop=0, resid_pdrop=0, embd_pdrop=0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory)
    architecture, weights, _ = convert(directory)
    return model, architecture, jax.tree.map(jnp.asarray, weights)


def parity(model, architecture, weights, tokens: int) -> float:
    import torch

    ids = np.random.default_rng(0).integers(0, architecture.vocabulary, (1, tokens)).astype(np.int32)
    with torch.inference_mode():
        expected = model(torch.from_numpy(ids).long()).logits.numpy()
    got = jax.jit(forward, static_argnames="architecture")(weights, architecture, jnp.asarray(ids)).logits
    return float(np.max(np.abs(np.asarray(got) - expected)))


def decode_seconds(execution: ModelExecution, batch: int, new_tokens: int) -> float:
    """Seconds per decode step of the jitted loop (compiled beforehand), batch rows with 16-id prompts."""
    rng = np.random.default_rng(1)
    requests = [
        InferenceRequest(f"r{b}", rng.integers(0, 1000, 16).tolist(), GenerationPolicy(new_tokens))
        for b in range(batch)
    ]
    first = generate(execution, requests).responses[0]
    return first.computations[1].wall_time_us * 1e-6


def decode_table(architecture, weights, peak: Peak, new_tokens: int) -> dict:
    f32 = ModelExecution(weights, architecture, StateIdentity("bench", "bench", "float32"), turn_end_id=NO_END)
    print(f"  {'precision':<9} {'batch':>5} {'tok/s':>9} {'roofline tok/s':>15} {'of roofline':>11}")
    rows = {}
    for precision in PRECISIONS:
        execution = at_precision(f32, precision)
        costs, position = execution.costs, 16 + new_tokens // 2
        for batch in (1, 32):
            step = decode_seconds(execution, batch, new_tokens)
            step_bytes = costs.fixed_memory_bytes + batch * (
                costs.memory_bytes(position, position + 1) - costs.fixed_memory_bytes
            )
            roofline = batch * peak.bandwidth / step_bytes
            print(
                f"  {precision:<9} {batch:>5} {batch / step:>9.1f} {roofline:>15.1f} {batch / step / roofline:>11.0%}"
            )
            rows[f"{precision}, batch {batch}"] = {"tok_per_s": batch / step, "roofline_tok_per_s": roofline,
                                                   "of_roofline_fraction": batch / step / roofline}  # fmt: skip
    return rows


def train_flops_per_token(architecture: ModelArchitecture, context: int) -> float:
    """Model FLOPs of one trained token: 6 per parameter outside the embeddings, plus the attention products
    (QK^T and weights@V, forward and backward, over a causal window's mean of all `context` keys as computed)."""
    a = architecture
    embeddings = a.vocabulary * a.width + a.context * a.width
    return 6 * (parameter_count(a) - embeddings) + 12 * a.layers * a.width * context


def train_table(peak: Peak, batch: int, context: int, steps: int) -> dict:
    mesh = data_mesh()
    config = TrainingConfig(steps=1000, warmup_steps=10)
    tokens = np.random.default_rng(0).integers(0, TRAIN_ARCHITECTURE["vocabulary"], 1 << 20, dtype=np.int32)
    print(f"  {'precision':<9} {'ms/step':>9} {'tokens/s':>10} {'TFLOP/s':>9} {'MFU':>6}")
    rows = {}
    for precision in PRECISIONS:
        architecture = ModelArchitecture(**TRAIN_ARCHITECTURE, precision=precision)
        optimizer = adamw(config)
        state = jax.device_put(start(initialize(architecture, 0)[0], optimizer), replicated(mesh))
        data = jax.device_put(TokenStream(jnp.asarray(tokens), context), replicated(mesh))
        step = make_train_step(architecture, optimizer, jax.random.key(1), batch, batch_sharding(mesh), 1)
        state, metrics = step(state, data)  # compile
        jax.block_until_ready(metrics)
        started = time.perf_counter()
        for _ in range(steps):
            state, metrics = step(state, data)
        jax.block_until_ready(metrics)
        seconds = (time.perf_counter() - started) / steps
        achieved = train_flops_per_token(architecture, context) * batch * context / seconds
        device_peak_ = peak.float32 if precision == "float32" else peak.bfloat16
        mfu = "n/a" if device_peak_ is None else f"{achieved / device_peak_:.1%}"
        print(
            f"  {precision:<9} {seconds * 1e3:>9.1f} {batch * context / seconds:>10,.0f} {achieved / 1e12:>9.3f} {mfu:>6}"
        )
        rows[precision] = {
            "step_ms": seconds * 1e3, "tokens_per_s": batch * context / seconds, "model_gflop_per_s": achieved / 1e9,
            "mfu_fraction": None if device_peak_ is None else achieved / device_peak_,
        }  # fmt: skip
    return rows


def main() -> None:
    on_cpu = jax.default_backend() == "cpu"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2 if on_cpu else 10, help="timed train steps per precision")
    parser.add_argument("--new-tokens", type=int, default=8 if on_cpu else 64, help="decode steps per run")
    add_results_argument(parser)
    args = parser.parse_args()
    run = BenchRun.start("accelerator", __doc__)
    batch, context = (1, 128) if on_cpu else (8, 1024)

    print(describe().table())
    peak, source, measured = device_peak(on_cpu)
    with tempfile.TemporaryDirectory() as directory:
        model, architecture, weights = gpt2_small(directory)
    error = parity(model, architecture, weights, 128)
    print(f"\nHF parity, GPT-2-small size ({parameter_count(architecture) / 1e6:.0f}M parameters, random weights, f32): "
          f"max abs logit error {error:.2e} over 128 positions")  # fmt: skip
    print(f"\ndecode, GPT-2-small size, {args.new_tokens} new tokens after 16-id prompts; roofline at "
          f"{peak.bandwidth / 1e9:.1f} GB/s ({source})")  # fmt: skip
    decode = decode_table(architecture, weights, peak, args.new_tokens)
    train_architecture = ModelArchitecture(**TRAIN_ARCHITECTURE)
    print(f"\ntrain step, GPT L12 C768 V8192 ({parameter_count(train_architecture) / 1e6:.0f}M parameters), "
          f"batch {batch} x {context} tokens, AdamW, {args.steps} timed steps; peak {source}")  # fmt: skip
    train = train_table(peak, batch, context, args.steps)
    kind = jax.devices()[0].device_kind
    run.write({
        f"the device: {kind}": {
            "measured": {"bandwidth_gb_per_s": measured.bandwidth / 1e9, "f32_gflop_per_s": measured.float32 / 1e9,
                         "bf16_gflop_per_s": measured.bfloat16 / 1e9},
            "judged against": {"bandwidth_gb_per_s": peak.bandwidth / 1e9, "source": source,
                               "f32_gflop_per_s": None if peak.float32 is None else peak.float32 / 1e9,
                               "bf16_gflop_per_s": peak.bfloat16 / 1e9},
        },
        "HF parity, GPT-2-small size, random weights, f32": {"128 positions": {"max_abs_logit_error_nats": error}},
        f"decode, GPT-2-small size, {args.new_tokens} new tokens after 16-id prompts": decode,
        f"train step, GPT L12 C768 V8192, batch {batch} x {context} tokens, {args.steps} timed steps": train,
    }, args.results)  # fmt: skip


if __name__ == "__main__":
    main()
