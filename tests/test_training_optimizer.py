"""AdamW by parameter path, the warmup + cosine schedule and clipping, against a NumPy reference."""

from __future__ import annotations

import math

import jax
import numpy as np
import optax
import pytest

from jgpt.model.architecture import LlamaArchitecture, ModelArchitecture
from jgpt.model.weights import initialize
from training.config import TrainingConfig
from training.optimizer import adamw, decay_mask, schedule

CONFIG = TrainingConfig(steps=100, warmup_steps=10, learning_rate=1e-2, weight_decay=0.1, clip_norm=0.5)
DECAYED = {"query", "key", "value", "attention_output", "ff_up", "ff_down", "ff_gate", "lm_head"}


@pytest.mark.parametrize(
    "architecture",
    [
        ModelArchitecture(vocabulary=260, width=16, ffn=32, context=8, layers=2, heads=2),
        LlamaArchitecture(vocabulary=260, width=16, ffn=32, context=8, layers=2, heads=2),
    ],
)
def test_decay_applies_to_matrices_only_not_biases_norms_or_embeddings(architecture):
    weights, _ = initialize(architecture, 0)
    mask = decay_mask(weights)
    for name in weights.as_dict():
        assert getattr(mask, name) == (name in DECAYED), name


def test_schedule_warms_up_linearly_then_follows_the_cosine():
    rate = schedule(1e-2, 10, 100, 0.1)
    assert float(rate(0)) == 0.0
    assert float(rate(5)) == pytest.approx(5e-3)
    assert float(rate(10)) == pytest.approx(1e-2)
    for step in (30, 55, 80, 100):
        progress = (step - 10) / 90
        expected = 1e-3 + (1e-2 - 1e-3) * 0.5 * (1 + math.cos(math.pi * progress))
        assert float(rate(step)) == pytest.approx(expected, rel=1e-5)


def reference_adamw(params, grads, steps, config, decays):
    """NumPy AdamW with global-norm clipping, written from the algorithm's definition."""
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    params = {k: p.astype(np.float64) for k, p in params.items()}
    for t in range(1, steps + 1):
        g = grads(t)
        norm = math.sqrt(sum(float((x.astype(np.float64) ** 2).sum()) for x in g.values()))
        scale = min(1.0, config.clip_norm / norm)
        lr = float(
            schedule(config.learning_rate, config.warmup_steps, config.steps, config.final_learning_rate_fraction)(
                t - 1
            )
        )
        for k in params:
            gk = g[k] * scale
            m[k] = config.beta1 * m[k] + (1 - config.beta1) * gk
            v[k] = config.beta2 * v[k] + (1 - config.beta2) * gk**2
            m_hat, v_hat = m[k] / (1 - config.beta1**t), v[k] / (1 - config.beta2**t)
            update = m_hat / (np.sqrt(v_hat) + 1e-8) + (config.weight_decay * params[k] if decays[k] else 0.0)
            params[k] = params[k] - lr * update
    return params


def test_one_run_of_updates_matches_the_reference():
    rng = np.random.default_rng(0)
    params = {
        "ff_up": rng.normal(size=(4, 3)),
        "ff_up_bias": rng.normal(size=3),
        "token_embedding": rng.normal(size=(5, 2)),
    }
    params = {k: v.astype(np.float32) for k, v in params.items()}
    grads = lambda t: {k: np.float32(t) * rng_grads[k] for k in params}
    rng_grads = {k: np.random.default_rng(1).normal(size=v.shape).astype(np.float32) for k, v in params.items()}
    optimizer = adamw(CONFIG)
    state = optimizer.init(params)
    current = jax.tree.map(np.asarray, params)
    for t in range(1, 16):
        updates, state = optimizer.update(grads(t), state, current)
        current = optax.apply_updates(current, updates)
    expected = reference_adamw(params, grads, 15, CONFIG, {k: k == "ff_up" for k in params})
    for k in params:
        np.testing.assert_allclose(np.asarray(current[k]), expected[k], rtol=2e-5, atol=2e-6)
