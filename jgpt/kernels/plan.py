"""Kernels: which steps of the forward pass a run computes by jgpt's own kernels, as one frozen, static value.

A plan is chosen once, where an execution or a training run is configured, and recorded in what
the run writes (`to_json`: a `generate --json` response's and a recorded document's
`execution.kernels`, a training run's `run.json` as its `products` and `attention`). Nothing below it
decides again: `calls()` maps the plan to the callables `jgpt.model.transformer.forward` receives as a
jit-static argument (`jgpt.model.operations.KernelCalls`), and a step whose callable is None runs the
reference computation of `jgpt.model.operations`.

    products   "xla" | "blas"       dense products of many rows (stored [I, O] weights): XLA's dot, or
                                    `blas_matmul` (forward and both backward products by OpenBLAS sgemm)
    attention  "full" | "causal_blocks" | "causal_blas"
                                    over a pass's own tokens (no cache): every score masked (the reference),
                                    the key blocks wholly after each block of CAUSAL_BLOCK_ROWS queries
                                    skipped (in XLA), or those blocks by `blas_attention`
    decode     "xla" | "fused"      a batch-1 decode step's blocks: XLA's, or one `fused_decode` call where its
                                    rule admits the pass (`fused_decode.admits`: one token of one row, float32
                                    throughout, no sliding window hiding cached positions, per-layer
                                    output-major weights of at least 1 MiB)
    one_row    "xla" | "kernel"     one float32 row times an output-major matrix: XLA's dot, or `blas_matvec`

`Kernels.xla()` is the pure-JAX reference. `Kernels.auto()` is what a run on this machine uses by
default: the decode and one-row kernels on a CPU where each builds and the CPU has AVX-512F (each
resolved here, once: where one cannot run, the plan says "xla" for it, and that is what runs); products
and attention stay XLA's full ones, which the shipped models were trained with. The training plan is
the run's own recipe (`--products`, `--attention`; both round differently from the reference, so they
are part of what the run prepares), refused where its kernel cannot run rather than replaced; the
`causal_blas` kernel attends to every earlier key, so a model with a sliding window is refused it
(`jgpt.model.operations.attention`, naming the window) while `causal_blocks` masks the window in XLA.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax

from jgpt.foundation.errors import ApiError
from jgpt.kernels import blas_attention, blas_matmul, blas_matvec, fused_decode
from jgpt.model.architecture import Architecture
from jgpt.model.operations import KernelCalls

PRODUCTS = ("xla", "blas")
ATTENTIONS = ("full", "causal_blocks", "causal_blas")
DECODES = ("xla", "fused")
ONE_ROWS = ("xla", "kernel")
# The command-line spellings of a plan (`--kernels`).
NAMES = ("auto", "xla")
# Query rows per block of the causal block attentions: 64 was the fastest of 32, 64 and 128 on the large
# train-step bench config (`bench/train_step.py`).
CAUSAL_BLOCK_ROWS = 64


@dataclasses.dataclass(frozen=True)
class Kernels:
    products: str = "xla"
    attention: str = "full"
    decode: str = "xla"
    one_row: str = "xla"

    def __post_init__(self) -> None:
        for name, choices in (("products", PRODUCTS), ("attention", ATTENTIONS), ("decode", DECODES),
                              ("one_row", ONE_ROWS)):  # fmt: skip
            if getattr(self, name) not in choices:
                raise ApiError(f"kernels.{name}", f"must be one of {', '.join(choices)}, got {getattr(self, name)!r}")

    @classmethod
    def xla(cls) -> Kernels:
        """The pure-JAX reference: every step as `jgpt.model.operations` writes it."""
        return cls()

    @classmethod
    def auto(cls, backend: str | None = None) -> Kernels:
        """The decode and one-row kernels where each runs on `backend` (default: JAX's default backend): a CPU
        with AVX-512F where it builds and loads. Builds the kernels (cached per user) on first use."""
        backend = backend or jax.default_backend()
        return cls(
            decode="fused" if fused_decode.available(backend) else "xla",
            one_row="kernel" if blas_matvec.available(backend) else "xla",
        )

    @classmethod
    def named(cls, name: str, backend: str | None = None) -> Kernels:
        """The plan a command line names (`--kernels auto|xla`)."""
        if name not in NAMES:
            raise ApiError("kernels", f"must be one of {', '.join(NAMES)}, got {name!r}")
        return cls.auto(backend) if name == "auto" else cls.xla()

    def for_execution(self, architecture: Architecture, output_major: bool) -> Kernels:
        """This plan as an execution of `architecture` can run it, whose weights are (or are not) held output-major:
        the decode and one-row kernels read output-major matrices only, and the decode kernel float32 blocks of at
        least `fused_decode.SMALLEST_BYTES` of a model without a binding sliding window (it attends to every cached
        position); where they cannot run, the plan says "xla" for them. What is left to
        each pass is its rows and operands (one token of one row; one float32 row, which bfloat16 operands are on
        a CPU: `jgpt.model.operations.dense`)."""
        fused = self.decode == "fused" and output_major and fused_decode.takes_model(architecture)
        return dataclasses.replace(
            self, decode="fused" if fused else "xla", one_row=self.one_row if output_major else "xla"
        )

    def calls(self) -> KernelCalls:
        """The callables this plan plugs into the forward pass (None: the reference step)."""
        return _calls(self)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return ", ".join(f"{name} {value}" for name, value in self.to_json().items())


@functools.cache
def _calls(plan: Kernels) -> KernelCalls:
    return KernelCalls(
        product=blas_matmul.float32_matmul if plan.products == "blas" else None,
        one_row=blas_matvec.matvec if plan.one_row == "kernel" else None,
        causal_rows=None if plan.attention == "full" else CAUSAL_BLOCK_ROWS,
        causal_attention=blas_attention.causal_attention if plan.attention == "causal_blas" else None,
        decode_blocks=fused_decode.blocks_where_admitted if plan.decode == "fused" else None,
    )


# The pure-JAX reference plan, the default of every function that takes one.
XLA = Kernels.xla()
