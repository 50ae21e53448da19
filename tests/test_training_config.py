"""TrainingConfig.architecture: a frozen Architecture read from a config's settings, written back as one spelling."""

from __future__ import annotations

import dataclasses

import pytest

from jgpt.foundation.errors import ApiError
from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture, architecture_from_json
from training.config import TrainingConfig, architecture_settings, from_json

GPT = {"width": 32, "ffn": 64, "context": 64, "layers": 2, "heads": 4}


def test_the_architecture_is_a_frozen_architecture_with_the_tokenizers_vocabulary():
    config = TrainingConfig()
    assert isinstance(config.architecture, LlamaArchitecture) and config.architecture.vocabulary == 260
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.architecture.width = 8  # type: ignore[misc]
    bpe = from_json({"architecture": GPT, "tokenizer": "bpe", "data": "corpus.txt", "vocab_size": 300})
    assert bpe.architecture == ModelArchitecture(vocabulary=300, **GPT)


@pytest.mark.parametrize("settings", [
    GPT, {**GPT, "precision": "bfloat16"}, {**GPT, "activation": "gelu_tanh"},
    {**GPT, "position": "rope"}, {**GPT, "position": "rope", "kv_heads": 2, "rope_theta": 500000.0},
    # an imported Mistral's window and Qwen2's biases (an --init-from parent's), Llama 3.1's scaling
    {**GPT, "position": "rope", "kv_heads": 2, "sliding_window": 16, "attention_bias": True},
    {**GPT, "position": "rope", "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_context": 32}},
])  # fmt: skip
def test_settings_read_back_to_the_same_architecture_and_spell_only_what_differs(settings):
    config = from_json({"architecture": settings})
    assert architecture_settings(config.architecture) == settings
    assert from_json({"architecture": architecture_settings(config.architecture)}).architecture == config.architecture
    assert from_json({"architecture": config.architecture}).to_json() == config.to_json()  # given as the value itself


def test_a_default_written_out_prepares_what_it_left_out_prepares():
    spelled = {**GPT, "position": "learned", "epsilon": 1e-5, "vocabulary": 260}
    assert (
        from_json({"architecture": spelled}).preparation_run_sha256
        == from_json({"architecture": GPT}).preparation_run_sha256
    )
    assert from_json({"architecture": {**GPT, "epsilon": 1e-6}}).preparation_run_sha256 != \
        from_json({"architecture": GPT}).preparation_run_sha256  # fmt: skip


@pytest.mark.parametrize(("architecture", "field"), [
    ({**GPT, "vocabulary": 300}, "vocabulary"), ([1, 2], "architecture"), ({**GPT, "depth": 3}, "depth"),
])  # fmt: skip
def test_a_bad_architecture_is_refused_naming_its_field(architecture, field):
    with pytest.raises(ApiError) as refused:
        from_json({"architecture": architecture})
    assert refused.value.field == field


def test_a_blank_architecture_key_is_refused_naming_it_quoted():
    """Found by the hostile-document fuzz test in CI: `{"": null}` gave the one-line error an empty field name."""
    for key in ("", " "):
        with pytest.raises(ApiError) as error:
            architecture_from_json({key: None})
        assert error.value.field == repr(key) and "is not a field of ModelArchitecture" in str(error.value)
