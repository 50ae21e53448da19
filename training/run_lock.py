"""One training run per run directory: an exclusive lock held for the whole run.

Two `jgpt train` processes on the same `--out` once interleaved `metrics.jsonl` and the
second died in an orbax traceback. The run takes `fcntl.flock` on `train.lock` in the
run directory (the kernel releases it when the process ends, however it ends) and writes
its pid there, so a second process is refused at once, naming the holder. In a run over
several processes (`jax.distributed`) process 0 alone takes it: the others are the same run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from jgpt.foundation.errors import ApiError
from training.sharding import main_process

LOCK = "train.lock"


@contextlib.contextmanager
def run_lock(root: Path) -> Iterator[None]:
    """Hold `root/train.lock` for the block (process 0 of a multi-process run; the others hold nothing)."""
    if main_process():
        with _exclusive(root):
            yield
    else:
        yield


@contextlib.contextmanager
def _exclusive(root: Path) -> Iterator[None]:
    """Hold `root/train.lock` for the block; a directory this call created and the run left empty goes again."""
    created = [path for path in (root, *root.parents) if not path.exists()]  # the run creates these
    try:
        root.mkdir(parents=True, exist_ok=True)
        before = set(os.listdir(root))
        descriptor = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise ApiError("out", f"cannot use {root} as the run directory: {error.strerror}") from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise ApiError(
                "out",
                f"{root} is in use by another jgpt train (process {holder}); "
                f"wait for it to end or choose another --out",
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            if LOCK not in before and set(os.listdir(root)) == before | {LOCK}:  # refused before writing: no trace
                if created:
                    shutil.rmtree(created[-1])
                else:
                    os.unlink(root / LOCK)
    finally:
        os.close(descriptor)
