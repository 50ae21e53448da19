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
* Trust: an entry is machine code JAX loads and runs, so the directory must be
  this user's alone (`checked_environment`): made with mode 0700, refused (one
  warning line, then no persistent cache) unless it is a real directory owned by
  this user, writable by no one else, under directories no other user can
  rename (JAX opens it by path, for the whole run).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from jgpt.runtime.cache_directory import CacheRefused, cache_home, open_private, require_fixed, warn_once


def cache_directory(environ: Mapping[str, str]) -> Path | None:
    """Where the `jgpt` command keeps compiled programs, or None when the user turned the cache off."""
    location = _location(environ)
    return None if location is None else location[0].joinpath(*location[1])


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` so that JAX reads and writes the cache (none if off or set by the user)."""
    directory = cache_directory(environ)
    if directory is None or "JAX_COMPILATION_CACHE_DIR" in environ:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": str(directory), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def checked_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environment(environ)` once its directory is made (mode 0700) and found to be this user's alone;
    nothing, after one warning line, where it is not: the command then runs without the persistent cache."""
    variables = environment(environ)
    location = _location(environ)
    if not variables or location is None:
        return variables
    home, parts = location
    try:
        os.close(open_private(home, parts))
        require_fixed(home.joinpath(*parts))
    except CacheRefused as refusal:
        warn_once(f"compilation cache {refusal}; running without the persistent compilation cache")
        return {}
    return variables


def _location(environ: Mapping[str, str]) -> tuple[Path, tuple[str, ...]] | None:
    """The cache directory as (a directory the user chose, the parts below it that jgpt makes), or None."""
    if "JGPT_CACHE_DIR" not in environ:
        return cache_home(environ), ("jgpt", "xla")
    if not environ["JGPT_CACHE_DIR"]:
        return None
    chosen = Path(environ["JGPT_CACHE_DIR"])
    return (chosen.parent, (chosen.name,)) if chosen.name else (chosen, ())
