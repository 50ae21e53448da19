"""Recorded computation documents from analytic GPT counts (no model code, only arithmetic).

Until `inference` records real counts, synthetic workloads, trace imports and the
benchmark need costs. These are the dense and attention matmul FLOPs of the GPT
baseline (two per multiply-add) and the logical bytes a step reads or writes:

    per prompt position p:  layers * (8 w^2 + 4 w f + 4 w (p + 1)) FLOPs, and
                            kv_bytes_per_position bytes (its K and V are written)
    prefill fixed:          2 w V FLOPs (one row of logits), weight_bytes (weights read once)
    decode at position p:   the position FLOPs + 2 w V, and weight_bytes + (p + 1) kv bytes
    kv_bytes_per_position = 2 * layers * w * precision_bytes
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from jgpt.tokenizers.framing import ROLE_IDS, TURN_END_ID  # pure Python: no numpy, no HF tokenizers
from kvsim.recorded import RecordedComputations, RecordedRequest, StreamedComputations

PRECISIONS = {1: "int8", 2: "bfloat16", 4: "float32"}


@dataclass(frozen=True)
class AnalyticModel:
    layers: int
    width: int
    ffn: int
    vocabulary: int
    precision_bytes: int
    context: int = 4096

    @property
    def kv_bytes_per_position(self) -> int:
        return 2 * self.layers * self.width * self.precision_bytes

    @property
    def weight_bytes(self) -> int:
        w, f, v = self.width, self.ffn, self.vocabulary
        block = 4 * w * w + 4 * w + 2 * w * f + f + w + 4 * w  # attention, feed-forward, two norms
        parameters = v * w + self.context * w + self.layers * block + 2 * w + w * v + v
        return parameters * self.precision_bytes

    def position_flops(self, p: int) -> int:
        w = self.width
        return self.layers * (8 * w * w + 4 * w * self.ffn + 4 * w * (p + 1))

    @property
    def logits_flops(self) -> int:
        return 2 * self.width * self.vocabulary

    def architecture(self) -> dict:
        return {
            "vocabulary": self.vocabulary,
            "width": self.width,
            "ffn": self.ffn,
            "context": self.context,
            "layers": self.layers,
            "precision": PRECISIONS.get(self.precision_bytes, f"{8 * self.precision_bytes}-bit"),
        }


class _CumulativeFlops:
    """cum[i] = sum of position_flops(p) for p < i, in closed form (no table per request)."""

    def __init__(self, model: AnalyticModel):
        w = model.width
        self.layers, self.linear, self.quadratic = model.layers, 8 * w * w + 4 * w * model.ffn, 4 * w

    def __getitem__(self, i: int) -> int:
        return self.layers * (self.linear * i + self.quadratic * i * (i + 1) // 2)

    def increments(self, n: int) -> list[int]:
        """position_flops(p) for p < n: linear in p, so a range (summed per position, these were a sixth of a
        streamed run's time)."""
        step = self.layers * self.quadratic
        first = self.layers * self.linear + step
        return list(range(first, first + n * step, step))


class _CumulativeBytes:
    def __init__(self, per_position: int):
        self.per_position = per_position

    def __getitem__(self, i: int) -> int:
        return self.per_position * i

    def increments(self, n: int) -> list[int]:
        return [self.per_position] * n


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
    times). A decode step's FLOPs and bytes are linear in its position, so each request's are a range."""
    cum_flops, cum_bytes = _CumulativeFlops(model), _CumulativeBytes(model.kv_bytes_per_position)
    weights, kv_bytes, logits = model.weight_bytes, model.kv_bytes_per_position, model.logits_flops
    flops_step = model.position_flops(1) - model.position_flops(0)

    def request(item: Conversation) -> RecordedRequest:
        n, output, complete = len(item.prompt_ids), item.output_ids, item.complete
        steps = len(output) - 1  # at positions n .. n + steps - 1
        first_flops, first_bytes = model.position_flops(n) + logits, weights + (n + 1) * kv_bytes
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
            fixed_matmul_flops=logits,
            fixed_memory_bytes=weights,
            cum_flops=cum_flops,
            cum_bytes=cum_bytes,
            decode_positions=tuple(range(n, n + steps)),
            decode_flops=tuple(range(first_flops, first_flops + steps * flops_step, flops_step)),
            decode_bytes=tuple(range(first_bytes, first_bytes + steps * kv_bytes, kv_bytes)),
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
