"""The persistent XLA compilation cache of the `jgpt` command.

Compiling the jitted prefill and decode programs is most of a short command's
wall time (`jgpt generate` compiles a prefill and a decode loop on every call).
JAX can keep compiled executables on disk and load them when the same program
is compiled again. The `jgpt` console script turns that on for its own process;
library users and the test suite keep JAX's defaults.

* Where: `$JGPT_CACHE_DIR`, else `$XDG_CACHE_HOME/jgpt/xla`, else
  `~/.cache/jgpt/xla`. `JGPT_CACHE_DIR=` (set and empty) turns the cache off.
  A user's own `JAX_COMPILATION_CACHE_DIR` wins. The directory is safe to
  delete at any time: a missing entry is compiled again.
* What: every program, however quick to compile. JAX's default skips programs
  that compile in under a second, which is most of ours.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_directory(environ: Mapping[str, str]) -> Path | None:
    """Where the `jgpt` command keeps compiled programs, or None when the user turned the cache off."""
    if "JGPT_CACHE_DIR" in environ:
        return Path(environ["JGPT_CACHE_DIR"]) if environ["JGPT_CACHE_DIR"] else None
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(base) / "jgpt" / "xla"


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` so that JAX reads and writes the cache (none if off or set by the user)."""
    directory = cache_directory(environ)
    if directory is None or "JAX_COMPILATION_CACHE_DIR" in environ:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": str(directory), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
