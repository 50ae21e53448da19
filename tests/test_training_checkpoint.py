"""The shipped default model: made by the documented command, complete provenance, small enough to commit."""

from __future__ import annotations

from jgpt.artifacts.catalog import load_model, read_catalog
from training import conversation_corpus
from training.config import TrainingConfig

MAX_BYTES = 8 * 2**20


def test_the_default_model_carries_the_provenance_of_the_documented_command():
    catalog = read_catalog()
    descriptor = catalog.default
    assert descriptor is not None and descriptor.role == "default"
    artifact = load_model(descriptor.id)  # verifies every identity against the catalog
    provenance = artifact.provenance
    assert all(provenance[field] not in (None, "", {}) for field in
               ("kind", "seed", "step", "selection", "development_loss", "data_sha256", "source_sha256",
                "preparation_run_sha256"))  # fmt: skip
    # `jgpt train --out runs/chat` runs the defaults: the same preparation, the same data.
    recipe = TrainingConfig()
    assert provenance["preparation_run_sha256"] == recipe.preparation_run_sha256
    assert (provenance["kind"], provenance["seed"]) == ("conversations", recipe.seed)
    corpus = conversation_corpus.generate(
        recipe.seed, recipe.train_conversations, recipe.development_conversations, recipe.window + 1
    )
    assert provenance["data_sha256"] == corpus.data_sha256
    # The sources by their names in the commit the model was trained from (before jgpt/ moved into rooms).
    assert {"training/step.py", "jgpt/model.py", "jgpt/operations.py"} <= set(provenance["source_sha256"])
    assert artifact.architecture.to_json() == recipe.architecture.to_json()
    assert sum(asset.bytes for asset in artifact.assets) < MAX_BYTES
