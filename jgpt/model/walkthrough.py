"""ArchitectureWalkthrough: the declared stages of one decoder block, as data.

A walkthrough explains the computation before any run: each ArchitectureStage names
the ontology concept that owns it, the earlier stages it reads (residual branches
stay explicit as two inputs), the operations it performs, related concepts, and
`inspection`, the observation stage of `model.forward(..., observe=True)` that
shows its output in an actual pass. Stages are templates, never captured values.

`jgpt.model.transformer` computes the stages in the same steps: the "input" stages in `embed`,
the "block" stages in `attention_sublayer` (up to the attention residual) and
`feed_forward_sublayer`, the "output" stages in `head`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jgpt.model.architecture import Architecture, LlamaArchitecture, ModelArchitecture


@dataclasses.dataclass(frozen=True)
class ArchitectureStage:
    owner: str  # admitted ontology concept
    label: str
    scope: str  # "input", "block" (repeated per layer) or "output"
    detail: str
    inputs: tuple[int, ...]  # indices of earlier stages
    operations: tuple[str, ...]
    related: tuple[str, ...]
    inspection: str  # observation stage name in model.forward's observations

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "inputs": list(self.inputs),
            "operations": list(self.operations),
            "related": list(self.related),
        }


@dataclasses.dataclass(frozen=True)
class ArchitectureWalkthrough:
    stages: tuple[ArchitectureStage, ...]

    def to_json(self) -> dict[str, Any]:
        return {"stages": [stage.to_json() for stage in self.stages]}


def _stage(owner, label, scope, detail, inputs, operations, related, inspection) -> ArchitectureStage:
    return ArchitectureStage(owner, label, scope, detail, tuple(inputs), tuple(operations), tuple(related), inspection)


ATTENTION_OPERATIONS = (
    "weights = softmax(q k^T / sqrt(head_dim), causal)",
    "mixed = weights v",
    "out = mixed @ attention_output",
)


def walkthrough(architecture: Architecture) -> ArchitectureWalkthrough:
    """The declared single-block schematic of either architecture: its input and attention stages, then the
    residual and feed-forward stages and the output stages both share."""
    a = architecture
    if isinstance(a, ModelArchitecture):  # the alternative whose position is "learned"
        attention = _learned_position_attention(a)
        norm, stream = "layernorm", 1
        feed_forward = ("u = x @ ff_up + ff_up_bias", "g = gelu(u)", "out = g @ ff_down + ff_down_bias")
    else:
        attention = _rotary_attention(a)
        norm, stream = "rmsnorm", 0
        feed_forward = ("u = x @ ff_up", "g = silu(x @ ff_gate)", "out = (g * u) @ ff_down")
    block = _feed_forward_block(a, stream, len(attention), norm, feed_forward)
    return ArchitectureWalkthrough((*attention, *block, *_output(a, len(attention) + len(block) - 1, norm)))


def _attention_detail(a: Architecture) -> str:
    window = a.attention_window if isinstance(a, LlamaArchitecture) else None
    earlier = "earlier positions" if window is None else f"the {window - 1} positions before it (sliding window)"
    return (
        f"{a.heads} heads of width {a.head_dim}"
        + (f" sharing {a.kv_heads} key/value heads" if a.kv_heads != a.heads else "")
        + f"; each position attends causally to itself and {earlier}; keys and values are kept per layer."
    )


def _rotary_detail(a: LlamaArchitecture) -> str:
    scaled = a.rope_scaling
    frequencies = (
        ""
        if scaled is None
        else f", the frequencies scaled as Llama 3.1's (factor {scaled.factor:g}, low and high frequency factors "
        f"{scaled.low_freq_factor:g} and {scaled.high_freq_factor:g}, original context {scaled.original_context})"
    )
    return (
        f"Rotates query and key channel pairs by angle position * {a.rope_theta:g}^(-2i/head_dim){frequencies}; "
        "attention scores then depend on relative position."
    )


def _learned_position_attention(a: ModelArchitecture) -> list[ArchitectureStage]:
    """The GPT baseline's stages up to attention: learned position vectors added to the token embedding."""
    return [
        _stage(
            "PositionEncoding",
            "position vectors",
            "input",
            f"Learned absolute vectors, one per position up to context {a.context}.",
            (),
            ("position_embedding[positions]",),
            ("ModelWeights",),
            "position_embedding",
        ),
        _stage(
            "Embedding",
            "token embedding",
            "input",
            "Looks up each token id's vector and adds its position vector: the residual stream.",
            (0,),
            ("token_embedding[token_ids] + position vectors",),
            ("Tokenizer",),
            "embedding",
        ),
        _stage(
            "Normalization",
            "pre-attention norm",
            "block",
            "LayerNorm (mean, variance, scale, bias) of the residual stream.",
            (1,),
            ("layernorm(x; ln1_scale, ln1_bias)",),
            ("Attention",),
            "ln1",
        ),
        _stage(
            "Attention",
            "causal self-attention",
            "block",
            _attention_detail(a),
            (2,),
            ("q, k, v = x @ query, key, value (+ biases)", *ATTENTION_OPERATIONS, "+ attention_output_bias"),
            ("KVState", "PositionEncoding"),
            "attention",
        ),
    ]


def _rotary_attention(a: LlamaArchitecture) -> list[ArchitectureStage]:
    """The Llama alternative's stages up to attention: positions enter as rotations of queries and keys."""
    return [
        _stage(
            "Embedding",
            "token embedding",
            "input",
            "Looks up each token id's vector; positions enter later as rotations of queries and keys.",
            (),
            ("token_embedding[token_ids]",),
            ("Tokenizer",),
            "embedding",
        ),
        _stage(
            "Normalization",
            "pre-attention norm",
            "block",
            "RMSNorm (root mean square, scale, no bias) of the residual stream.",
            (0,),
            ("rmsnorm(x; ln1_scale)",),
            ("Attention",),
            "ln1",
        ),
        _stage(
            "PositionEncoding",
            "rotary positions",
            "block",
            _rotary_detail(a),
            (1,),
            (
                "q, k = x @ query + query_bias, key + key_bias" if a.attention_bias else "q, k = x @ query, key",
                "q, k = rotate(q, k; positions)",
            ),  # fmt: skip
            ("Attention",),
            "key",
        ),
        _stage(
            "Attention",
            "causal self-attention",
            "block",
            _attention_detail(a),
            (1, 2),
            ("v = x @ value + value_bias" if a.attention_bias else "v = x @ value", *ATTENTION_OPERATIONS),
            ("KVState", "PositionEncoding"),
            "attention",
        ),
    ]


def _feed_forward_block(
    a: Architecture, stream: int, first: int, norm: str, feed_forward: tuple[str, ...]
) -> list[ArchitectureStage]:
    """The block's stages from the attention residual to the feed-forward residual.

    `stream` is the index of the embedding stage (the residual input), `first` the
    index the attention residual gets (attention is the stage just before it).
    """
    attention_in, residual = first - 1, first
    return [
        _stage(
            "ResidualAddition",
            "attention residual",
            "block",
            "Adds the attention branch to the preserved residual stream.",
            (stream, attention_in),
            ("h = x + attention",),
            ("Attention",),
            "residual1",
        ),
        _stage(
            "Normalization",
            "pre-feed-forward norm",
            "block",
            f"{norm} of the residual stream before the feed-forward branch.",
            (residual,),
            (f"{norm}(h; ln2_scale)",),
            ("FeedForward",),
            "ln2",
        ),
        _stage(
            "FeedForward",
            "feed-forward",
            "block",
            f"Per-position {a.activation} MLP: width {a.width} -> ffn {a.ffn} -> width {a.width}; no mixing across positions.",
            (residual + 1,),
            feed_forward,
            ("ModelWeights",),
            "feed_forward",
        ),
        _stage(
            "ResidualAddition",
            "feed-forward residual",
            "block",
            "Adds the feed-forward branch; the sum is the next block's input.",
            (residual, residual + 2),
            ("out = h + feed_forward",),
            ("FeedForward",),
            "residual2",
        ),
    ]


def _output(a: Architecture, block_out: int, norm: str) -> list[ArchitectureStage]:
    """The stages after the last block; `block_out` is the index of the feed-forward residual."""
    return [
        _stage(
            "Normalization",
            "final norm",
            "output",
            f"{norm} after the last of {a.layers} blocks.",
            (block_out,),
            (f"{norm}(out; ln_final_scale)",),
            ("OutputProjection",),
            "ln_final",
        ),
        _stage(
            "OutputProjection",
            "logits",
            "output",
            f"Projects each final hidden vector to {a.vocabulary} vocabulary scores, accumulated in float32.",
            (block_out + 1,),
            ("logits = h @ lm_head" + (" + lm_bias" if a.has_biases else ""),),
            ("Decoding",),
            "logits",
        ),
    ]
