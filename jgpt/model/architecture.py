"""ModelArchitecture: the dimensions and numerical conventions of a supported GPT computation.

Two declared alternatives share the spec's fields:

- `ModelArchitecture`, the GPT-2 baseline: learned absolute positions, LayerNorm with
  bias, GELU, a bias on every projection, and an untied `lm_head` with `lm_bias`;
- `LlamaArchitecture`: rotary positions (RoPE), RMSNorm, SwiGLU, no biases, and
  optionally fewer key/value heads than query heads (grouped-query attention).

Both are frozen and hashable, so a forward pass can take one as a static `jax.jit`
argument, and both round-trip through JSON with the ontology's field names. The
`position` field tells the alternatives apart when reading JSON back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Union

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import Number, integer, string

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
class LlamaArchitecture(_Dimensions):
    """The Llama alternative; `kv_heads` defaults to `heads` (no grouping)."""

    epsilon: float = 1e-6
    position: str = "rope"
    normalization: str = "rmsnorm"
    activation: str = "swiglu"
    precision: str = "float32"
    kv_heads: int | None = None
    rope_theta: float = 10000.0

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
