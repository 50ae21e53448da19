"""TrainingConfig: everything a training run depends on, as one frozen, validated value.

A config is read from JSON (unknown keys are an error, never ignored) and then
overridden field by field from the command line. Its `architecture` is read from
the settings a file gives (without the vocabulary, which the tokenizer decides)
into a frozen Architecture. `preparation_run_sha256` is the SHA-256 of its
canonical JSON without the output location, so two runs with the same hash
prepare the same checkpoint; the architecture is written there as its settings
(`architecture_settings`), one spelling per architecture.

A fine-tuning run names its parent in `init_from` (a catalog id or an artifact directory,
`training.parent`): its architecture and tokenizer are the parent's, so a field that would
change them is refused naming it (only the compute precision is the run's choice), and the
hash names the parent by its weights and tokenizer identities, not by where it lay.

`schedule_steps` is the span of the learning-rate schedule, `steps` by default; a run
extended past it (`--resume --steps N`) holds the schedule's final rate after it. The
fields added since the shipped model was trained (`init_from`, `schedule_steps`) are
written only when they say something, so every earlier run keeps its hash.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import sha256_json
from jgpt.foundation.json_input import read_json
from jgpt.foundation.limits import CONVERSATION_LIMIT, PARAMETER_LIMIT, VOCABULARY_LIMIT, bounded
from jgpt.foundation.validation import Number, integer, is_integer, number, string
from jgpt.model.architecture import Architecture, LlamaArchitecture, ModelArchitecture, architecture_from_json
from training.parent import ParentModel, declared_parent

SELECTIONS = ("best_development_loss", "final")
# parent: the tokenizer of the --init-from model, the only one a fine-tuning run takes.
TOKENIZERS = ("bytes", "bpe", "parent")
DEFAULT_TOKENIZER = "bytes"
DEFAULT_VOCAB_SIZE = 512
# The train step's kernel plan is spelled by these two fields (jgpt.kernels.plan.Kernels holds the same choices;
# read here without importing jax). Dense products: XLA's dot (the pure-JAX reference) or numpy's OpenBLAS
# (jgpt.kernels.blas_matmul).
PRODUCTS = ("xla", "blas")
# The train step's attention: every score computed and the later keys masked (the reference, what the shipped
# models were trained with), the key blocks wholly after each block of queries skipped, or those blocks by the
# BLAS kernel, which keeps each block's scores in cache (jgpt.kernels.blas_attention; CPU only).
ATTENTIONS = ("full", "causal_blocks", "causal_blas")
BYTE_VOCABULARY = 260
# Sequences per step: each is a window of ids and its activations (the shipped model uses 32).
BATCH_LIMIT = 1 << 16
# Where the run writes; not part of what the run prepares.
LOCATION_FIELDS = ("out",)
# Linear warm-up steps when none are given: this many, but at most a tenth of the run's steps.
WARMUP_STEPS = 100
# A finite number: NaN or Infinity here once crashed the run while writing run.json.
_POSITIVE = Number(minimum=None, exact=False, positive=True)


def default_architecture() -> dict[str, Any]:
    """Architecture fields; `vocabulary` comes from the tokenizer.

    Rotary positions: on the built-in skills the same model with learned absolute
    positions needed about twice the steps to reach the same development loss.
    """
    return {"width": 128, "ffn": 512, "context": 128, "layers": 4, "heads": 4, "position": "rope"}


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    out: str = "runs/default"
    # Data: None trains on the built-in conversations; otherwise a UTF-8 text file.
    data: str | None = None
    # None trains from initialized weights; otherwise the catalog id or artifact directory to start from.
    init_from: str | None = None
    # None: "parent" with init_from, else DEFAULT_TOKENIZER; the vocabulary likewise (the parent's or
    # DEFAULT_VOCAB_SIZE). Both are stored resolved.
    tokenizer: str | None = None
    vocab_size: int | None = None
    train_conversations: int = 40000
    development_conversations: int = 500
    development_fraction: float = 0.1
    # Settings (a mapping without the vocabulary) are read into the Architecture at construction; None is
    # the parent's with init_from, else default_architecture().
    architecture: Architecture = None  # type: ignore[assignment]
    # Training window in tokens; at most architecture.context. None means architecture.context.
    context: int | None = None
    seed: int = 0
    steps: int = 3000
    batch_size: int = 32
    learning_rate: float = 3e-3
    # None: min(WARMUP_STEPS, steps // 10), so a short run needs no warm-up of its own; the number is stored.
    warmup_steps: int | None = None
    # Steps the warm-up + cosine schedule spans; None means steps. Later steps hold its final rate.
    schedule_steps: int | None = None
    final_learning_rate_fraction: float = 0.05
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    clip_norm: float = 1.0
    log_every: int = 50
    eval_every: int = 250
    checkpoint_every: int = 250
    selection: str = "best_development_loss"
    # Scan unroll over the layer axis: True unrolls fully (faster on XLA CPU).
    unroll: bool | int = True
    # Part of the recipe, not only of its speed: the two round differently, and this recipe's late drop in
    # development loss lands at a different step (or not by the last) when the rounding moves.
    products: str = "xla"
    # Likewise: causal_blocks sums each softmax over fewer terms, so it rounds differently from full.
    attention: str = "full"
    # The init_from model as its manifest declares it (read at construction; never written).
    parent: ParentModel | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.out, str) or not self.out:
            raise ApiError("out", f"must be a directory path (a non-empty string), got {self.out!r}")
        if self.data is not None and (not isinstance(self.data, str) or not self.data):
            raise ApiError("data", f"must be a text file path or null, got {self.data!r}")
        tokenizer, vocab_size = self._tokenizer_and_vocabulary()
        object.__setattr__(self, "tokenizer", tokenizer)
        object.__setattr__(self, "vocab_size", vocab_size)
        if self.tokenizer == "bpe" and self.data is None:
            raise ApiError("tokenizer", "bpe needs --data: the built-in conversations use byte tokens")
        ints = ("vocab_size", "train_conversations", "development_conversations", "steps", "batch_size",
                "log_every", "eval_every", "checkpoint_every")  # fmt: skip
        for name in ints:
            integer(getattr(self, name), name, minimum=1)
        integer(self.seed, "seed")
        bounded(vocab_size, "vocab_size", 1, VOCABULARY_LIMIT)
        for name in ("train_conversations", "development_conversations"):
            bounded(getattr(self, name), name, 1, CONVERSATION_LIMIT)
        bounded(self.batch_size, "batch_size", 1, BATCH_LIMIT)
        schedule_steps = integer(self.steps if self.schedule_steps is None else self.schedule_steps,
                                 "schedule_steps", minimum=1)  # fmt: skip
        object.__setattr__(self, "schedule_steps", schedule_steps)
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", default_warmup_steps(schedule_steps))
        integer(self.warmup_steps, "warmup_steps", 0, schedule_steps - 1)
        for name in ("learning_rate", "clip_norm"):
            _POSITIVE.read(getattr(self, name), name)
        for name in ("final_learning_rate_fraction", "weight_decay", "beta1", "beta2"):
            value = getattr(self, name)
            if number(value, name) > (1 if name != "weight_decay" else 10):  # NaN or Infinity once crashed a run
                raise ApiError(name, f"is out of range: {value!r}")
        if not 0 < _POSITIVE.read(self.development_fraction, "development_fraction") < 1:
            raise ApiError("development_fraction", f"must be in (0, 1), got {self.development_fraction!r}")
        string(self.tokenizer, "tokenizer", TOKENIZERS)
        string(self.selection, "selection", SELECTIONS)
        string(self.products, "products", PRODUCTS)
        string(self.attention, "attention", ATTENTIONS)
        if not (isinstance(self.unroll, bool) or is_integer(self.unroll) and self.unroll > 0):  # True: fully
            raise ApiError("unroll", f"must be true, false or a positive integer, got {self.unroll!r}")
        from jgpt.model.weights import parameter_count  # jax: `jgpt train --help` reads this module's defaults

        architecture = self._read_architecture()
        object.__setattr__(self, "architecture", architecture)
        if parameter_count(architecture) > PARAMETER_LIMIT:
            raise ApiError(
                "architecture",
                f"{parameter_count(architecture):,} parameters exceed the limit of {PARAMETER_LIMIT:,} (jgpt.foundation.limits)",
            )
        if self.context is not None:
            integer(self.context, "context", minimum=2)
            if self.context > architecture.context:
                raise ApiError(
                    "context", f"{self.context} is longer than the architecture allows ({architecture.context})"
                )

    @property
    def vocabulary(self) -> int:
        assert self.vocab_size is not None, "TrainingConfig.__post_init__ sets vocab_size"
        return BYTE_VOCABULARY if self.tokenizer == "bytes" else self.vocab_size

    def _tokenizer_and_vocabulary(self) -> tuple[Any, Any]:
        """The tokenizer and vocabulary size (checked later): the parent's with init_from, whose manifest this
        reads (setting `parent`), refusing others; otherwise the defaults where none is given."""
        if self.init_from is None:
            if self.tokenizer == "parent":
                raise ApiError("tokenizer", "parent is the tokenizer of --init-from MODEL, and none is given")
            return (DEFAULT_TOKENIZER if self.tokenizer is None else self.tokenizer,
                    DEFAULT_VOCAB_SIZE if self.vocab_size is None else self.vocab_size)  # fmt: skip
        parent = declared_parent(string(self.init_from, "init_from"))
        object.__setattr__(self, "parent", parent)
        if self.tokenizer not in (None, "parent"):
            raise ApiError(
                "tokenizer",
                f"a run --init-from {self.init_from} keeps its parent's tokenizer; leave out --tokenizer "
                f"(given {self.tokenizer!r})",
            )
        vocabulary = parent.architecture.vocabulary
        if self.vocab_size not in (None, vocabulary):
            raise ApiError(
                "vocab_size",
                f"{self.vocab_size} differs from the vocabulary of {self.init_from} ({vocabulary}), which a run "
                "--init-from keeps; leave out --vocab-size",
            )
        return "parent", vocabulary

    def _read_architecture(self) -> Architecture:
        """The Architecture of the settings given (or the one given), its vocabulary the tokenizer's; with
        init_from, the parent's, of which only the precision may be given otherwise."""
        given = self.architecture
        if given is None:
            if self.parent is not None:
                return self.parent.architecture
            given = default_architecture()  # type: ignore[assignment]
        settings: object = given.to_json() if isinstance(given, (ModelArchitecture, LlamaArchitecture)) else given
        if not isinstance(settings, Mapping):
            raise ApiError("architecture", f"must be a JSON object, got {type(settings).__name__}")
        vocabulary = settings.get("vocabulary", self.vocabulary)
        if vocabulary != self.vocabulary:
            raise ApiError("vocabulary", f"{vocabulary} differs from the tokenizer's vocabulary ({self.vocabulary})")
        architecture = architecture_from_json({**settings, "vocabulary": vocabulary})
        if self.parent is not None:
            _require_parents(architecture, self.parent)
        return architecture

    @property
    def window(self) -> int:
        """Tokens per training example (inputs; targets are the same window shifted by one)."""
        return self.context or self.architecture.context

    def to_json(self) -> dict[str, Any]:
        document = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        unsaid = {"init_from"} if self.init_from is None else set()
        unsaid |= {"schedule_steps"} if self.schedule_steps == self.steps else set()
        return {k: v for k, v in document.items() if k not in unsaid} | {
            "architecture": architecture_settings(self.architecture)
        }

    @property
    def preparation_run_sha256(self) -> str:
        preparation = {k: v for k, v in self.to_json().items() if k not in LOCATION_FIELDS}
        if self.parent is not None:
            preparation["init_from"] = self.parent.weights_identity()
        return sha256_json(preparation)

    def replace(self, **changes: Any) -> TrainingConfig:
        return from_json({**self.to_json(), **changes})


def default_warmup_steps(steps: int) -> int:
    return min(WARMUP_STEPS, steps // 10)


def _require_parents(architecture: Architecture, parent: ParentModel) -> None:
    """Refuse an architecture other than the parent's, naming the first field that differs (the compute
    precision aside: the weights and their Adam moments stay float32 either way)."""
    theirs, ours = parent.architecture.to_json(), architecture.to_json()
    for name in ("position", *theirs, *ours):  # the family first: it decides the other fields' defaults
        if name != "precision" and theirs.get(name) != ours.get(name):
            raise ApiError(
                name,
                f"{ours.get(name)!r} differs from {theirs.get(name)!r} of {parent.given}: a run --init-from keeps "
                f"its parent's architecture, so leave {name} out",
            )


def architecture_settings(architecture: Architecture) -> dict[str, Any]:
    """The architecture as a config states it: its required fields, its position unless the default learned
    one, and every other field whose value differs from what those alone give; never the vocabulary (the
    tokenizer's). Two spellings of one architecture (a default written out or left out) have one."""
    written = architecture.to_json()
    required = [f.name for f in dataclasses.fields(architecture) if f.default is dataclasses.MISSING]
    minimal = {name: written[name] for name in required} | {"position": written["position"]}
    base = architecture_from_json(minimal).to_json()
    stated = set(required) | ({"position"} if written["position"] != "learned" else set())
    return {k: v for k, v in written.items() if k != "vocabulary" and (k in stated or v != base.get(k))}


def from_json(document: Any) -> TrainingConfig:
    """A TrainingConfig from a JSON object; unknown keys are rejected by name."""
    if not isinstance(document, Mapping):
        raise ApiError("config", f"must be a JSON object, got {type(document).__name__}")
    known = {f.name for f in dataclasses.fields(TrainingConfig) if f.init}
    unknown = sorted(set(document) - known)
    if unknown:
        raise ApiError("config", f"unknown keys: {', '.join(unknown)}")
    return TrainingConfig(**document)


def load(path: str | Path) -> TrainingConfig:
    return from_json(read_json(path, "config"))
