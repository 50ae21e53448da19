"""Fixtures shared by test modules (imports inside them: collecting any test must stay cheap)."""

from __future__ import annotations

import json

import pytest

LAB = "prefix-reuse-multi-turn"


def tiny_model(directory, seed: int):
    """A random-weight 2-layer model saved as an artifact under `directory`, with the bytes-only tokenizer."""
    from jgpt.artifacts.artifact import save_artifact
    from jgpt.model.architecture import ModelArchitecture
    from jgpt.model.weights import initialize
    from jgpt.tokenizers.tokenizer import Tokenizer

    architecture = ModelArchitecture(vocabulary=260, width=32, ffn=64, context=128, layers=2, heads=2)
    weights, provenance = initialize(architecture, seed=seed)
    return save_artifact(directory / "tiny", architecture, weights, provenance, Tokenizer.bytes_only())


def lab_defaults(model, max_new_tokens: int):
    """The labs' generation defaults with `model` as the model and a short output budget."""
    from experiments.generation_defaults import DEFAULTS, GenerationDefaults

    document = json.loads(DEFAULTS.read_text())
    for setting in document["execution"]:
        if setting["control"] == "model.model_id":
            setting["value"] = str(model.path)
        if setting["control"] == "generation.max_new_tokens":
            setting["value"] = max_new_tokens
    return GenerationDefaults.from_json(document)


@pytest.fixture(scope="session")
def lab_run(tmp_path_factory):
    """One lab run by a tiny random-weight model, without report or plots (tests copy it before changing it)."""
    from experiments.experiment_design import default_catalog
    from experiments.experiment_execution import run_lab

    defaults = lab_defaults(tiny_model(tmp_path_factory.mktemp("model"), seed=1), max_new_tokens=4)
    return run_lab(
        default_catalog().lab(LAB), tmp_path_factory.mktemp("lab") / LAB, report=False, plots=False, defaults=defaults
    )
