"""Recorded computation documents from analytic counts (no model code, only arithmetic).

Synthetic workloads, trace imports and the benchmark need costs before a model is recorded. These
are the counts `jgpt record` writes for the same architecture (inference/costs.py; a test holds
them equal), for the GPT and Llama families: grouped key/value heads, a head width of its own, a
gated (SwiGLU) feed-forward, rotary or learned positions, and where the biases are. With
q = heads * head_dim query channels, k = kv_heads * head_dim key (and value) channels, and g = 3
feed-forward matrices when gated (else 2):

    dense FLOPs of one position:  layers * (2 w (2 q + 2 k) + 2 g w f) + 2 w V   (logits at every position,
                                  as jgpt's forward pass computes them)
    attention FLOPs per key:      layers * 4 q   (scores and the weighted values)
    keys position p sees:         keys(p) = p + 1, or min(p + 1, W) under a sliding window of W positions
    FLOPs of position p:          dense + attention * keys(p)
    kv_bytes_per_position:        2 * layers * k * precision_bytes
    bytes of position p:          its embedding rows and float32 logits, and keys(p) positions of K and V
    fixed bytes of a work:        every weight but the embedding tables, read once

A prefill has no fixed FLOPs; a decode step at position p is one position's FLOPs and bytes plus the
fixed bytes. Projection matrices and KV are held at the model's precision (precision_bytes); the
embedding tables, norms, biases and logits stay float32 (inference/precision.py says why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from jgpt.foundation.errors import ApiError
from jgpt.tokenizers.framing import ROLE_IDS, TURN_END_ID  # pure Python: no numpy, no HF tokenizers
from kvsim.recorded import RecordedComputations, RecordedRequest, StreamedComputations

PRECISIONS = {1: "int8", 2: "bfloat16", 4: "float32"}
FLOAT32_BYTES = 4  # an embedding table's, norm's, bias's and logit's element at every precision
POSITIONS = ("learned", "rotary")
# Which weights carry a bias: GPT-2 every projection, norm and the logits; Qwen2 the query, key and value
# projections; Llama none.
BIASES = ("every", "query_key_value", "none")


@dataclass(frozen=True)
class AnalyticModel:
    """An architecture's sizes and conventions; the defaults are GPT-2's (one head: a GPT's counts do not
    depend on how its width is split into heads)."""

    layers: int
    width: int
    ffn: int
    vocabulary: int
    precision_bytes: int  # of a projection matrix element and of a KV element
    context: int = 4096
    heads: int = 1
    kv_heads: int | None = None  # None: one per query head
    head_dim: int | None = None  # None: width / heads
    gated: bool = False  # SwiGLU: a gate matrix beside the up projection
    positions: str = "learned"  # learned positions are a table read a row per position; rotary ones are weightless
    biases: str = "every"
    tied_embeddings: bool = False  # the published head is the token table (jgpt's import holds a copy)
    sliding_window: int | None = None  # a query sees the keys of its last `sliding_window` positions only

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ApiError("positions", f"{self.positions!r} is not one of {', '.join(POSITIONS)}")
        if self.biases not in BIASES:
            raise ApiError("biases", f"{self.biases!r} is not one of {', '.join(BIASES)}")

    @property
    def attention_window(self) -> int | None:
        """The sliding window where it bounds anything (not when it holds the whole context)."""
        window = self.sliding_window
        return window if window is not None and window < self.context else None

    def keys(self, p: int) -> int:
        """The keys position p attends to: itself and those before it, within the window."""
        window = self.attention_window
        return p + 1 if window is None else min(p + 1, window)

    def keys_before(self, n: int) -> int:
        """keys(p) summed over positions p < n, in closed form."""
        window = self.attention_window
        if window is None or n <= window:
            return n * (n + 1) // 2
        return window * (window + 1) // 2 + (n - window) * window

    @property
    def head_width(self) -> int:
        return self.width // self.heads if self.head_dim is None else self.head_dim

    @property
    def query_width(self) -> int:
        return self.heads * self.head_width

    @property
    def kv_width(self) -> int:
        """Channels of one position's keys (and of its values) in one layer."""
        return (self.heads if self.kv_heads is None else self.kv_heads) * self.head_width

    def tensors(self) -> tuple[tuple[str, int, str], ...]:
        """Every weight tensor jgpt holds: its name (jgpt.model.weights'), elements, and kind: a "matrix"
        (at the precision, read whole by every work), a "vector" (float32, read whole) or a "table" (float32,
        read a row per position)."""
        L, w, f, q, k, V = self.layers, self.width, self.ffn, self.query_width, self.kv_width, self.vocabulary
        tensors = [
            ("token_embedding", V * w, "table"),
            ("query", L * w * q, "matrix"),
            ("key", L * w * k, "matrix"),
            ("value", L * w * k, "matrix"),
            ("attention_output", L * q * w, "matrix"),
            ("ff_up", L * w * f, "matrix"),
            ("ff_down", L * f * w, "matrix"),
            ("lm_head", w * V, "matrix"),
            ("norm_scales", (2 * L + 1) * w, "vector"),
        ]
        if self.positions == "learned":
            tensors.append(("position_embedding", self.context * w, "table"))
        if self.gated:
            tensors.append(("ff_gate", L * w * f, "matrix"))
        if self.biases != "none":
            tensors += [("query_bias", L * q, "vector"), ("key_bias", L * k, "vector"), ("value_bias", L * k, "vector")]
        if self.biases == "every":
            tensors += [
                ("attention_output_bias", L * w, "vector"),
                ("ff_up_bias", L * f, "vector"),
                ("ff_down_bias", L * w, "vector"),
                ("norm_biases", (2 * L + 1) * w, "vector"),
                ("lm_bias", V, "vector"),
            ]
        return tuple(tensors)

    def _element_bytes(self, kind: str) -> int:
        return self.precision_bytes if kind == "matrix" else FLOAT32_BYTES

    @property
    def parameters(self) -> int:
        """The published model's parameters: a tied head is its token table, counted once."""
        return sum(n for name, n, _ in self.tensors() if not (self.tied_embeddings and name == "lm_head"))

    @property
    def weight_bytes(self) -> int:
        """The bytes of every weight jgpt holds serving the model (a tied head copied, as its import does)."""
        return sum(n * self._element_bytes(kind) for _, n, kind in self.tensors())

    @property
    def fixed_memory_bytes(self) -> int:
        """What every work reads once: every weight but the embedding tables."""
        return sum(n * self._element_bytes(kind) for _, n, kind in self.tensors() if kind != "table")

    @property
    def row_bytes_per_position(self) -> int:
        """A position's embedding rows read and its float32 logits written."""
        tables = sum(kind == "table" for _, _, kind in self.tensors())
        return (tables * self.width + self.vocabulary) * FLOAT32_BYTES

    @property
    def kv_bytes_per_position(self) -> int:
        return 2 * self.layers * self.kv_width * self.precision_bytes

    @property
    def dense_flops_per_position(self) -> int:
        """Every projection of one position, its logits included."""
        w, q, k = self.width, self.query_width, self.kv_width
        feed_forward = (3 if self.gated else 2) * 2 * w * self.ffn
        return self.layers * (2 * w * (2 * q + 2 * k) + feed_forward) + 2 * w * self.vocabulary

    @property
    def attention_flops_per_key(self) -> int:
        """The scores and the weighted values of one query position against one key, over all layers."""
        return self.layers * 2 * 2 * self.query_width

    def position_flops(self, p: int) -> int:
        return self.dense_flops_per_position + self.attention_flops_per_key * self.keys(p)

    def position_bytes(self, p: int) -> int:
        """Its rows and logits, the K and V of the positions before it that it sees read, and its own written."""
        return self.row_bytes_per_position + self.kv_bytes_per_position * self.keys(p)

    def prefill(self, n: int) -> tuple[int, int]:
        """The FLOPs and bytes of a prefill of positions 0 .. n - 1, nothing reused."""
        keys = self.keys_before(n)
        return (
            self.dense_flops_per_position * n + self.attention_flops_per_key * keys,
            self.fixed_memory_bytes + self.row_bytes_per_position * n + self.kv_bytes_per_position * keys,
        )

    def decode_flops(self, p: int) -> int:
        return self.position_flops(p)

    def decode_bytes(self, p: int) -> int:
        return self.fixed_memory_bytes + self.position_bytes(p)

    def architecture(self) -> dict:
        return {
            "vocabulary": self.vocabulary,
            "width": self.width,
            "ffn": self.ffn,
            "context": self.context,
            "layers": self.layers,
            "heads": self.heads,
            "kv_heads": self.kv_width // self.head_width,
            "head_dim": self.head_width,
            "gated_feed_forward": self.gated,
            "position": self.positions,
            "biases": self.biases,
            "tied_embeddings": self.tied_embeddings,
            "sliding_window": self.sliding_window,
            "precision": PRECISIONS.get(self.precision_bytes, f"{8 * self.precision_bytes}-bit"),
        }


class _Cumulative:
    """cum[i] = the sum over positions p < i of `per_position + per_key * keys(p)`, in closed form (no table
    per request): what a prefix of a prompt costs, in FLOPs or in bytes."""

    def __init__(self, model: AnalyticModel, per_position: int, per_key: int):
        self.model, self.per_position, self.per_key = model, per_position, per_key

    def __getitem__(self, i: int) -> int:
        return self.per_position * i + self.per_key * self.model.keys_before(i)

    def increments(self, n: int) -> list[int]:
        """Each position's cost for p < n (summed per position, these were a sixth of a streamed run's time)."""
        return list(_linear_counts(self.model, 0, n, self.per_position, self.per_key))


def _linear_counts(model: AnalyticModel, first: int, n: int, fixed: int, per_key: int) -> tuple[int, ...]:
    """`fixed + per_key * keys(p)` for positions first .. first + n - 1: a range while the keys grow with p,
    then constant once the window is full."""
    window = model.attention_window
    growing = n if window is None else max(0, min(n, window - first))
    start = fixed + per_key * (first + 1)
    flat = () if window is None else (fixed + per_key * window,) * (n - growing)
    return tuple(range(start, start + growing * per_key, per_key)) + flat


@dataclass(frozen=True)
class Conversation:
    """One request's declared ids: what a workload generator or trace importer produces."""

    request_id: str
    arrival_us: int
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    max_new_tokens: int
    complete: bool  # the output ends with the turn end that closes the reply


def framing_ids() -> dict[str, int]:
    """The ids that frame a generated conversation: jgpt's byte-level tokenizer's role markers (by role)
    and its turn end ("turn_end"), read from the tokenizer rather than copied, so a model with that
    tokenizer reads the turns as it was trained to. Nothing reads a document by them: its turn end
    is the id its complete requests end with."""
    return {**ROLE_IDS, "turn_end": TURN_END_ID}


def _requests(model: AnalyticModel) -> Callable[[Conversation], RecordedRequest]:
    """Makes the model's requests; what they share is worked out once (a streamed run makes each request three
    times). A decode step's FLOPs and bytes are linear in its position until a sliding window fills, so each
    request's are a range (and then a constant)."""
    per_key, kv_bytes = model.attention_flops_per_key, model.kv_bytes_per_position
    dense, rows, fixed_bytes = model.dense_flops_per_position, model.row_bytes_per_position, model.fixed_memory_bytes
    cum_flops, cum_bytes = _Cumulative(model, dense, per_key), _Cumulative(model, rows, kv_bytes)

    def request(item: Conversation) -> RecordedRequest:
        n, output, complete = len(item.prompt_ids), item.output_ids, item.complete
        steps = len(output) - 1  # at positions n .. n + steps - 1
        return RecordedRequest(
            request_id=item.request_id,
            arrival_us=item.arrival_us,
            prompt_ids=item.prompt_ids,
            max_new_tokens=item.max_new_tokens,
            output_ids=output,
            outcome={
                "selected_tokens": len(output),
                "published_tokens": len(output) - complete,
                "unused_budget": item.max_new_tokens - len(output),
                "stop_reason": "turn_end" if complete else "max_new_tokens",
                "complete": complete,
            },
            fixed_matmul_flops=0,
            fixed_memory_bytes=fixed_bytes,
            cum_flops=cum_flops,
            cum_bytes=cum_bytes,
            decode_positions=tuple(range(n, n + steps)),
            decode_flops=_linear_counts(model, n, steps, dense, per_key),
            decode_bytes=_linear_counts(model, n, steps, fixed_bytes + rows, kv_bytes),
        )

    return request


def analytic_computations(model: AnalyticModel, items: list[Conversation], source: str) -> RecordedComputations:
    """A recorded computation document whose counts are the analytic ones above."""
    return RecordedComputations(**_document(model, source), requests=tuple(map(_requests(model), items)))


def analytic_stream(
    model: AnalyticModel, items: Callable[[], Iterable[Conversation]], source: str
) -> StreamedComputations:
    """The same document made one request at a time (`items` makes them anew each call, in arrival order)."""
    return StreamedComputations(**_document(model, source), requests=lambda: map(_requests(model), items()))


def _document(model: AnalyticModel, source: str) -> dict:
    return dict(
        model={
            "checkpoint_sha256": "analytic",
            "tokenizer_sha256": "byte-level",
            "architecture": model.architecture(),
        },
        kv_bytes_per_position=model.kv_bytes_per_position,
        execution={
            "backend": {
                "compute_device": "none",
                "library": "kvsim.analytic",
                "precision": model.architecture()["precision"],
            },
            "provenance": {"sources": {"generator": source}},
        },
    )
