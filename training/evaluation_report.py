"""The evaluation report of a stored model: what `jgpt eval` prints."""

from __future__ import annotations

import hashlib

from jgpt.artifacts.catalog import load_model, read_catalog
from jgpt.foundation import progress
from jgpt.foundation.errors import ApiError
from jgpt.foundation.limits import CONVERSATION_LIMIT, bounded
from jgpt.tokenizers.tokenizer_file import load_tokenizer
from training import conversation_corpus, sharding
from training import corpus as corpora
from training.evaluation import DEVELOPMENT_BATCH, development_loss, exact_match
from training.step import make_development_step


def evaluate_model(
    model: str | None,
    *,
    data: str | None,
    development_fraction: float,
    conversations: int,
    seed: int | None,
    kernels: str = "auto",
) -> dict:
    """Development loss and bits per byte (the pure-JAX forward); for conversations also exact match per skill,
    generated under the kernel plan `kernels` names (`--kernels`), which the report records."""
    if not 0 < development_fraction < 1:  # NaN fails this too
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
    tokenizer = load_tokenizer(artifact.tokenizer_path)
    architecture = artifact.architecture
    if data_file is None:
        seed = artifact.provenance.get("seed", 0) if seed is None else seed
        held_out = conversation_corpus.split_conversations(seed, "development", conversations, architecture.context + 1)
        corpus = corpora.held_out_conversations(tokenizer, held_out, architecture.context + 1)
    else:
        raw, content = data_file
        _, development_text = corpora.split_text(content, development_fraction)
        corpus = corpora.held_out_text(
            tokenizer, development_text, architecture.context, data, hashlib.sha256(raw).hexdigest()
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
        "data": data or "conversations",
        "data_sha256": corpus.data_sha256,
        "development_loss": loss,
        "development_bits_per_byte": bits,
    }
    if corpus.exercises:
        from inference.execution import ModelExecution
        from jgpt.kernels.plan import Kernels

        execution = ModelExecution.from_artifact(artifact, tokenizer, kernels=Kernels.named(kernels))
        report["kernels"] = execution.kernels.to_json()
        report["skills"] = exact_match(execution, tokenizer, corpus.exercises)
    return report
