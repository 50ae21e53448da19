"""The evaluation report of a stored model: what `jgpt eval` prints.

What applies to the model is measured:

    --data FILE.txt                  development loss and bits per byte on that text's development part
    a model trained on a text file   the same on its own held-out text: the file and split its run used (its
                                     run.json beside the model, checked against the provenance's identities)
    a chat model (prompt_format      development loss and bits per byte on held-out built-in conversations,
    chat) otherwise                  and held-out exact match per skill
    an imported model                needs --data: jgpt holds no text of its own for it

The chat skills are jgpt's framing and answers: only a chat model is scored on them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from jgpt.artifacts.artifact import ModelArtifact
from jgpt.artifacts.catalog import load_model, read_catalog
from jgpt.foundation import progress
from jgpt.foundation.errors import ApiError
from jgpt.foundation.json_input import read_json
from jgpt.foundation.limits import CONVERSATION_LIMIT, bounded
from jgpt.tokenizers.prompt_format import CHAT, TEXT_TRAINING
from training import conversation_corpus, sharding
from training import corpus as corpora
from training.config import TrainingConfig, from_json
from training.evaluation import DEVELOPMENT_BATCH, development_loss, exact_match
from training.step import make_development_step

DEFAULT_DEVELOPMENT_FRACTION = 0.1  # TrainingConfig's: how `jgpt train` splits a text unless told otherwise


@dataclasses.dataclass(frozen=True)
class HeldOutText:
    """The text a model is evaluated on, and how it is split and windowed."""

    path: str
    raw: bytes
    content: str
    development_fraction: float
    window: int


def evaluate_model(
    model: str | None,
    *,
    data: str | None,
    development_fraction: float | None,
    conversations: int,
    seed: int | None,
    kernels: str = "auto",
) -> dict:
    """Development loss and bits per byte (the pure-JAX forward) on what applies to the model (the module's
    table); for a chat model on the conversations also exact match per skill, generated under the kernel plan
    `kernels` names (`--kernels`), which the report records."""
    if development_fraction is not None and not 0 < development_fraction < 1:  # NaN fails this too
        raise ApiError("development_fraction", f"must be in (0, 1), got {development_fraction}")
    bounded(conversations, "conversations", 1, CONVERSATION_LIMIT)
    if seed is not None and seed < 0:
        raise ApiError("seed", f"must be a non-negative integer, got {seed}")  # as `jgpt train` says
    data_file = corpora.read_text(data) if data is not None else None  # refused before the model loads
    if model is None:
        model = read_catalog().default_id()
    with progress.stage(f"loading model {model}"):
        artifact = load_model(model)
    if artifact.tokenizer_path is None:
        raise ApiError("model", f"{model} has no tokenizer to encode evaluation data with")
    tokenizer = artifact.tokenizer()
    architecture = artifact.architecture
    run = _training_run(artifact)
    held_out = None
    if data_file is not None and data is not None:
        fraction = development_fraction or (run.development_fraction if run else DEFAULT_DEVELOPMENT_FRACTION)
        held_out = HeldOutText(data, *data_file, fraction, run.window if run else architecture.context)
    elif artifact.provenance.get("kind") == TEXT_TRAINING:
        held_out = _own_text(artifact, model, run, development_fraction)
    elif artifact.prompt_format != CHAT:
        raise ApiError(
            "data",
            f"{model} is an imported model (prompt_format {artifact.prompt_format!r}): jgpt holds no held-out "
            "text of its own for it; give one with --data FILE.txt for its development loss and bits per byte",
        )
    if held_out is None:
        if seed is None:  # the training run's conversations held out; an imported model has no seed of its own
            seed = artifact.provenance.get("seed") or 0
        split = conversation_corpus.split_conversations(seed, "development", conversations, architecture.context + 1)
        corpus = corpora.held_out_conversations(tokenizer, split, architecture.context + 1)
    else:
        _, development_text = corpora.split_text(held_out.content, held_out.development_fraction)
        corpus = corpora.held_out_text(
            tokenizer, development_text, held_out.window, held_out.path, hashlib.sha256(held_out.raw).hexdigest()
        )
    mesh = sharding.data_mesh()
    step = make_development_step(architecture, sharding.batch_sharding(mesh), unroll=True)
    with progress.stage("development loss"):
        loss, bits = development_loss(
            step, artifact.weights, corpus.development, corpus.development_bytes, DEVELOPMENT_BATCH - DEVELOPMENT_BATCH % mesh.size
        )  # fmt: skip
    report = {
        "model": str(model),
        "checkpoint_sha256": artifact.checkpoint_sha256,
        "prompt_format": artifact.prompt_format,
        "data": "conversations" if held_out is None else held_out.path,
        "data_sha256": corpus.data_sha256,
        **({} if held_out is None else {"development_fraction": held_out.development_fraction,
                                        "window": held_out.window}),
        "development_loss": loss,
        "development_bits_per_byte": bits,
    }  # fmt: skip
    if corpus.exercises:
        from inference.execution import ModelExecution
        from jgpt.kernels.plan import Kernels

        execution = ModelExecution.from_artifact(artifact, tokenizer, kernels=Kernels.named(kernels))
        report["kernels"] = execution.kernels.to_json()
        report["skills"] = exact_match(execution, tokenizer, corpus.exercises)
    return report


def _training_run(artifact: ModelArtifact) -> TrainingConfig | None:
    """The TrainingConfig of the run that made the artifact: run.json in the directory above it (`jgpt train`
    writes the model to RUN/model), when its preparation is the one the provenance names; else None."""
    recorded = artifact.path.parent / "run.json"
    wanted = artifact.provenance.get("preparation_run_sha256")
    if wanted is None or not recorded.is_file():
        return None
    document = read_json(recorded, "run.json")
    if not isinstance(document, dict):
        return None
    known = {field.name for field in dataclasses.fields(TrainingConfig)}  # run.json also records the kernel plan
    try:
        config = from_json({name: value for name, value in document.items() if name in known})
    except ApiError:
        return None
    return config if config.preparation_run_sha256 == wanted else None


def _own_text(artifact: ModelArtifact, model: str, run: TrainingConfig | None, fraction: float | None) -> HeldOutText:
    """The text a model trained on a text file was trained on, found through its run and checked by its sha256."""
    wanted = artifact.provenance.get("data_sha256")
    hint = f"give the text it was trained on (sha256 {wanted}) with --data FILE.txt"
    if run is None or run.data is None:
        raise ApiError("data", f"{model} was trained on a text file, and its run.json is not beside it: {hint}")
    path = Path(run.data)
    if not path.is_file():
        raise ApiError("data", f"{model} was trained on {run.data}, which is not found from here: {hint}")
    raw, content = corpora.read_text(str(path))
    if hashlib.sha256(raw).hexdigest() != wanted:
        raise ApiError("data", f"{run.data} has changed since {model} was trained on it: {hint}")
    return HeldOutText(run.data, raw, content, fraction or run.development_fraction, run.window)
