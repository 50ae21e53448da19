"""AdamW with a warmup + cosine schedule, global-norm clipping and decay chosen by parameter path."""

from __future__ import annotations

import jax
import optax

from jgpt.runtime.mesh import leaf_name

# Leaves whose name contains one of these are scale or offset parameters (or lookup tables) that
# weight decay would only pull toward zero without regularising a linear map.
NO_DECAY_MARKERS = ("bias", "norm", "scale", "embedding")


def decays(name: str) -> bool:
    return not any(marker in name for marker in NO_DECAY_MARKERS)


def decay_mask(weights):
    """A pytree of booleans like `weights`: True where weight decay applies."""
    return jax.tree_util.tree_map_with_path(lambda path, _: decays(leaf_name(path)), weights)


def schedule(learning_rate: float, warmup_steps: int, total_steps: int, final_fraction: float) -> optax.Schedule:
    """Linear warmup from 0 to `learning_rate`, then cosine decay to `final_fraction` of it."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=max(total_steps, warmup_steps + 1),
        end_value=learning_rate * final_fraction,
    )


def adamw(config) -> optax.GradientTransformation:
    """The optimizer of a TrainingConfig; its schedule spans `schedule_steps` and holds its final rate after
    them (optax's cosine decay stays at its end value past `decay_steps`)."""
    return optax.chain(
        optax.clip_by_global_norm(config.clip_norm),
        optax.adamw(
            schedule(
                config.learning_rate, config.warmup_steps, config.schedule_steps, config.final_learning_rate_fraction
            ),
            b1=config.beta1,
            b2=config.beta2,
            weight_decay=config.weight_decay,
            mask=decay_mask,
        ),
    )
