"""ModelArchitecture: the dimensions and numerical conventions of a supported GPT computation.

Two declared alternatives share the spec's fields:

- `ModelArchitecture`, the GPT-2 baseline: learned absolute positions, LayerNorm with
  bias, GELU, a bias on every projection, and an untied `lm_head` with `lm_bias`;
- `LlamaArchitecture`: rotary positions (RoPE), RMSNorm, SwiGLU, no biases, and
  optionally fewer key/value heads than query heads (grouped-query attention). Three
  optional fields cover the Llama-family variants people have: `attention_bias` (biases on
  the query, key and value projections: Qwen2), `sliding_window` (each query sees the
  keys of its last `sliding_window` positions only: Mistral) and `rope_scaling` (Llama 3.1's
  scaled rotary frequencies, a `RopeScaling`).

Both are frozen and hashable, so a forward pass can take one as a static `jax.jit`
argument, and both round-trip through JSON with the ontology's field names. The
`position` field tells the alternatives apart when reading JSON back. A Llama-family
field at its default is left out of the JSON, so that an architecture without the
variants writes (and identifies, and records) exactly what it did before they existed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Union

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import Number, boolean, integer, mapping, string

PRECISIONS = ("float32", "bfloat16")
# The short names `--precision` takes on the command line.
PRECISION_NAMES = {"f32": "float32", "bf16": "bfloat16"}


_POSITIVE = Number(minimum=None, exact=False, positive=True)


@dataclasses.dataclass(frozen=True)
class _Dimensions:
    """Fields and checks common to both alternatives."""

    vocabulary: int
    width: int
    ffn: int
    context: int
    layers: int
    heads: int

    if TYPE_CHECKING:
        # Declared by each alternative, with its defaults, after the fields above (so in the same order
        # for the checker as at run time); the checks below read them.
        epsilon: float
        position: str
        normalization: str
        activation: str
        precision: str

        # A field of LlamaArchitecture (None until __post_init__ sets it), a property of ModelArchitecture.
        @property
        def kv_heads(self) -> int | None: ...

    POSITIONS: ClassVar[tuple[str, ...]] = ()
    NORMALIZATIONS: ClassVar[tuple[str, ...]] = ()
    ACTIVATIONS: ClassVar[tuple[str, ...]] = ()
    # Whether every projection and normalization carries a bias.
    has_biases: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for name in ("vocabulary", "width", "ffn", "context", "layers", "heads"):
            integer(getattr(self, name), name, minimum=1)
        _POSITIVE.read(self.epsilon, "epsilon")
        string(self.position, "position", self.POSITIONS)
        string(self.normalization, "normalization", self.NORMALIZATIONS)
        string(self.activation, "activation", self.ACTIVATIONS)
        string(self.precision, "precision", PRECISIONS)
        if self.width % self.heads:
            raise ApiError("width", f"{self.width} is not divisible by heads={self.heads}")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def kv_width(self) -> int:
        """Channels of one position's keys (and of its values) in one layer."""
        kv_heads = self.kv_heads
        assert kv_heads is not None, "LlamaArchitecture.__post_init__ sets kv_heads"
        return kv_heads * self.head_dim

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ModelArchitecture(_Dimensions):
    """The GPT-2 baseline. `gelu` is the exact (erf) GELU; `gelu_tanh` is GPT-2's approximation."""

    epsilon: float = 1e-5
    position: str = "learned"
    normalization: str = "layernorm"
    activation: str = "gelu"
    precision: str = "float32"

    POSITIONS: ClassVar[tuple[str, ...]] = ("learned",)
    NORMALIZATIONS: ClassVar[tuple[str, ...]] = ("layernorm",)
    ACTIVATIONS: ClassVar[tuple[str, ...]] = ("gelu", "gelu_tanh")

    @property
    def kv_heads(self) -> int:
        return self.heads


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's rotary frequency scaling (Hugging Face's `rope_type: "llama3"`).

    A rotary frequency whose wavelength is longer than `original_context / low_freq_factor`
    is divided by `factor`; one shorter than `original_context / high_freq_factor` is kept;
    those between are interpolated smoothly (`jgpt.model.operations.rotary_inverse_frequencies`).
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_context: int

    def __post_init__(self) -> None:
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            _POSITIVE.read(getattr(self, name), f"rope_scaling.{name}")
        integer(self.original_context, "rope_scaling.original_context", minimum=1)
        if not self.high_freq_factor > self.low_freq_factor:
            raise ApiError(
                "rope_scaling.high_freq_factor",
                f"must exceed low_freq_factor={self.low_freq_factor}, got {self.high_freq_factor}",
            )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, document: Any) -> RopeScaling:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**mapping(document, "rope_scaling", names))


@dataclasses.dataclass(frozen=True)
class LlamaArchitecture(_Dimensions):
    """The Llama alternative; `kv_heads` defaults to `heads` (no grouping).

    `attention_bias`: the query, key and value projections carry biases (`query_bias`, `key_bias`,
    `value_bias`; the output projection none). `sliding_window`: None, or W, the number of latest
    positions a query attends to (its own included: keys at positions p - W + 1 .. p). `rope_scaling`:
    None, or a `RopeScaling` of the rotary frequencies.
    """

    epsilon: float = 1e-6
    position: str = "rope"
    normalization: str = "rmsnorm"
    activation: str = "swiglu"
    precision: str = "float32"
    kv_heads: int | None = None
    rope_theta: float = 10000.0
    attention_bias: bool = False
    sliding_window: int | None = None
    rope_scaling: RopeScaling | None = None

    POSITIONS: ClassVar[tuple[str, ...]] = ("rope",)
    NORMALIZATIONS: ClassVar[tuple[str, ...]] = ("rmsnorm",)
    ACTIVATIONS: ClassVar[tuple[str, ...]] = ("swiglu",)
    has_biases: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        super().__post_init__()
        kv_heads = integer(self.kv_heads, "kv_heads", minimum=1)
        if self.heads % kv_heads:
            raise ApiError("kv_heads", f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.head_dim % 2:
            raise ApiError("heads", f"rotary positions need an even head width, got {self.head_dim}")
        _POSITIVE.read(self.rope_theta, "rope_theta")
        boolean(self.attention_bias, "attention_bias")
        if self.sliding_window is not None:
            integer(self.sliding_window, "sliding_window", minimum=1)
        if isinstance(self.rope_scaling, Mapping):  # as read from JSON
            object.__setattr__(self, "rope_scaling", RopeScaling.from_json(self.rope_scaling))
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ApiError("rope_scaling", f"must be null or an object, got {type(self.rope_scaling).__name__}")

    @property
    def attention_window(self) -> int | None:
        """The sliding window where it masks anything: None when every query sees every earlier key, as it
        does when the window holds the whole context."""
        window = self.sliding_window
        return window if window is not None and window < self.context else None

    def to_json(self) -> dict[str, Any]:
        document = super().to_json()
        for name in _VARIANTS:
            if document[name] is None or document[name] is False:
                del document[name]
        return document


# LlamaArchitecture's optional fields, written to JSON only where they differ from their defaults.
_VARIANTS = ("attention_bias", "sliding_window", "rope_scaling")

Architecture = Union[ModelArchitecture, LlamaArchitecture]

_BY_POSITION: dict[str, type[ModelArchitecture] | type[LlamaArchitecture]] = {
    "learned": ModelArchitecture,
    "rope": LlamaArchitecture,
}


def architecture_from_json(document: Mapping[str, Any]) -> Architecture:
    """Read either alternative back from `to_json()` output, rejecting unknown or missing fields."""
    if not isinstance(document, Mapping):
        raise ApiError("architecture", f"must be a JSON object, got {type(document).__name__}")
    position = document.get("position", "learned")
    if not isinstance(position, str) or position not in _BY_POSITION:
        raise ApiError("position", f"unknown value {position!r}; supported: {', '.join(_BY_POSITION)}")
    cls = _BY_POSITION[position]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(document) - set(fields))
    if unknown:
        name = unknown[0]
        raise ApiError(name if name.strip() else repr(name), f"is not a field of {cls.__name__}")  # a blank key, quoted
    missing = [name for name, f in fields.items() if f.default is dataclasses.MISSING and name not in document]
    if missing:
        raise ApiError(missing[0], f"is required by {cls.__name__}")
    return cls(**document)
