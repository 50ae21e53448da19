"""Per-user cache directories no other user can write: where jgpt keeps what it later runs as code.

The compiled kernels (`jgpt.kernels.kernel_cache`) and XLA's compiled programs (`jgpt.runtime.compilation_cache`) are
machine code that jgpt loads and runs. Whoever can write their directory can make jgpt run code as its
user, so each directory jgpt creates for a cache is made with mode 0700, and a directory found there is
used only if it is a real directory (not a symbolic link) owned by this user and writable by no one else.
Anything else is refused with `CacheRefused`, naming the path and the reason; the caller then goes on
without that cache. Importing this module stays cheap (no jax): the CLI checks JAX's cache before jax
is imported.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from jgpt.foundation.errors import one_line

# A directory opened to be used through its descriptor: never a symbolic link, never inherited by a child.
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CacheRefused(Exception):
    """A cache directory or file that jgpt will not use: `path` is it, `reason` says why."""

    def __init__(self, path: Path | str, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}")


def cache_home(environ: Mapping[str, str]) -> Path:
    """`$XDG_CACHE_HOME`, else `~/.cache`. A relative `XDG_CACHE_HOME` is ignored, as the XDG base
    directory specification asks (it would name a different directory in every working directory)."""
    configured = environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(configured):
        return Path(configured)
    return Path(environ.get("HOME") or os.path.expanduser("~")) / ".cache"


@functools.cache
def warn_once(message: str) -> None:
    """`message` as one line on stderr, the first time only: a refused cache is worth one line per process,
    not one per kernel or per compile."""
    print(f"jgpt: warning: {one_line(message)}", file=sys.stderr)


def not_own(status: os.stat_result) -> str | None:
    """Why a file or directory with `status` is not this user's own (another owner, or writable by group or
    others), or None where it is."""
    if status.st_uid != os.geteuid():
        return f"owned by uid {status.st_uid}, not by this user (uid {os.geteuid()})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(status.st_mode):04o})"
    return None


def open_private(home: Path, parts: tuple[str, ...]) -> int:
    """A descriptor of the directory `home/parts...`, each of `parts` created with mode 0700 where missing
    (and `home` too, with its missing parents, as the XDG specification asks). Each of `parts` (or `home`
    itself where `parts` is empty) must be a directory, not a symbolic link, owned by this user and
    writable by no one else; `home` is the user's choice and may be a link. Raises CacheRefused, also
    where the directories cannot be made or opened (a read-only home, a file in the way)."""
    path = home
    try:
        _make_missing(home)
        descriptor = os.open(home, DIRECTORY_FLAGS & ~os.O_NOFOLLOW)
        for part in parts:
            path = path / part
            descriptor = _child(descriptor, part)
            _require_own(descriptor, path)
        if not parts:
            _require_own(descriptor, path)
    except OSError as error:
        raise CacheRefused(path, error.strerror or str(error)) from None
    return descriptor


def _require_own(descriptor: int, path: Path) -> None:
    reason = not_own(os.fstat(descriptor))
    if reason is not None:
        os.close(descriptor)
        raise CacheRefused(path, reason)


def require_fixed(directory: Path) -> None:
    """Raise CacheRefused unless no other user can swap `directory` for one of their own by renaming an
    entry above it: every directory above it (before and after symbolic links are followed) must be owned
    by this user or root, and writable by group or others only with the sticky bit (as /tmp). Needed where
    a library opens the directory by its path (JAX's cache) rather than through `open_private`'s descriptor."""
    above = {*Path(os.path.abspath(directory)).parents, *Path(os.path.realpath(directory)).parents}
    for ancestor in sorted(above):
        try:
            status = os.stat(ancestor)
        except OSError as error:
            raise CacheRefused(ancestor, error.strerror or str(error)) from None
        if status.st_uid not in (0, os.geteuid()):
            raise CacheRefused(ancestor, f"owned by uid {status.st_uid}, neither this user nor root")
        if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not status.st_mode & stat.S_ISVTX:
            raise CacheRefused(ancestor, f"writable by group or others (mode {stat.S_IMODE(status.st_mode):04o})")


def _make_missing(home: Path) -> None:
    for directory in reversed([home, *home.parents]):
        if not directory.exists():
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:  # made meanwhile by a concurrent jgpt
                pass


def _child(parent: int, name: str) -> int:
    """The directory `name` in `parent` (made with mode 0700 where missing), opened without following a
    link; `parent` is closed."""
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
        return os.open(name, DIRECTORY_FLAGS, dir_fd=parent)
    except OSError as error:  # ENOTDIR or ELOOP for a link, as the kernel pleases: say which it was
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
                error.strerror = "a symbolic link, not a directory of its own"
        raise
    finally:
        os.close(parent)
