"""The shipped recipe's arithmetic, guarded without a retrain.

`checkpoints/chat` was made by `jgpt train --out runs/chat` with every default (docs/training.md, "The shipped
default model"). Its provenance names the sources it was trained from; a later change to them that leaves the
arithmetic alone leaves the model valid. What guards the arithmetic is this test: it runs the first STEPS
updates of that recipe (the default TrainingConfig: the built-in conversations, seed 0, the shipped
architecture, batch 32, AdamW with the 3000-step schedule, one device) through the trainer's own `start_run`
and compares a SHA-256 of the whole train state (step, weights, both Adam moments) with the one recorded,
bit for bit. When it fails, the training arithmetic changed: retrain the shipped model with the command above
and say so in the commit (CONTRIBUTING.md).

XLA's CPU arithmetic depends on the machine: the vector instructions it compiles for and the threads that
split a product (one thread and two give different bits here). So the steps run in a child process held to
one CPU, and the digest is recorded per instruction set. Both were computed, 10 steps, by the sources that
last reproduced the shipped model bit for bit (checkpoint 3f44878a...; the training arithmetic has not
changed since), on the 2-core development machine (x86-64 with AVX-512): "avx512" as it runs, "avx2" with
XLA held to AVX2 (`XLA_FLAGS=--xla_cpu_max_isa=AVX2`), the instructions of an x86-64 CPU without AVX-512.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# 10 updates take about 30 s with the corpus, the compile and one CPU; every weight has moved by then.
STEPS = 10
RECORDED = {
    "avx512": "0b82acb7a4012b33d080690b494783491958b05c6e0f1931d952f94ee25a8bbb",
    "avx2": "265a7b3dc03ccf384234f9fc9e625a946dc85b7560e273401addabfd9fac50e6",
}


def instruction_set() -> str:
    """The widest recorded vector instruction set this CPU has, as XLA compiles for it ("" if none)."""
    flags = set()
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return next((name for name, flag in (("avx512", "avx512f"), ("avx2", "avx2")) if flag in flags), "")


def state_sha256(state) -> str:
    """SHA-256 over every leaf of a train state: its path, dtype, shape and bytes, in tree order."""
    import jax
    import numpy as np

    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        value = np.asarray(jax.device_get(leaf))
        digest.update(f"{jax.tree_util.keystr(path)} {value.dtype.str} {value.shape}\n".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def first_steps_sha256(steps: int) -> str:
    """The train state's digest after `steps` updates of the default recipe on one device, in this process."""
    import jax

    from training import corpus as corpora
    from training.config import TrainingConfig
    from training.sharding import mesh
    from training.trainer import start_run

    config = TrainingConfig()
    started = start_run(config, corpora.prepare(config), mesh(1, jax.devices()[:1]))
    state = started.state
    for _ in range(steps):
        state, _ = started.train_step(state, started.data)
    assert int(state.step) == steps
    return state_sha256(state)


# The child holds itself to one CPU before JAX starts, so XLA's pool has one thread on any machine.
CHILD = f"""
import os
os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})
from tests.test_training_recipe import first_steps_sha256
print(first_steps_sha256({STEPS}))
"""


def test_the_first_steps_of_the_shipped_recipe_reproduce_bit_for_bit():
    isa = instruction_set()
    assert isa in RECORDED, "no digest is recorded for this CPU's instruction set (x86-64 with AVX2 or AVX-512)"
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"} | {"PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == RECORDED[isa], f"the first {STEPS} steps of the shipped recipe changed ({isa})"
