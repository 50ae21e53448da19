"""Paths read from files: confined to the directory they are relative to.

A manifest, a safetensors index or a lab record names its files by relative path.
One that is absolute, climbs out with `..`, or reaches outside through a symlink
would let a crafted file read, or probe for, anything on the machine. `confined`
refuses all of them by looking at the text first, so the refusal reads the same
whether or not the target exists. Inside the directory, a FIFO, device or socket is
refused too. Cheap to import (no jax).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import UNSAFE_PATH


def confined(base: str | os.PathLike, relative: Any, field: str) -> Path:
    """`base / relative`, resolved; an ApiError naming `field` unless it stays inside `base`."""
    if not isinstance(relative, str) or not relative:
        raise ApiError(field, f"must be a non-empty relative path, got {relative!r}")
    # The same textual rule as the schemas' (a backslash climbs on Windows; NUL has no place in a path).
    if re.search(UNSAFE_PATH, relative):
        raise ApiError(field, f"{relative!r} must be a relative path inside its directory (no absolute path, no '..')")
    root = Path(base).resolve()
    try:
        target = (root / PurePosixPath(relative)).resolve()  # follows symlinks, dangling ones too
    except RuntimeError:  # a link loop before Python 3.13
        raise ApiError(field, f"{relative!r} is a loop of symbolic links") from None
    except OSError as error:  # ELOOP from 3.13 on; ENAMETOOLONG for a component past the file system's limit
        raise ApiError(field, f"{relative!r} cannot be looked up: {error.strerror}") from None
    if not target.is_relative_to(root):
        raise ApiError(field, f"{relative!r} leads outside its directory through a symbolic link")
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return target  # a missing file is the reader's to report, the same whether or not it exists elsewhere
    except OSError as error:
        raise ApiError(field, f"{relative!r} cannot be looked up: {error.strerror}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a FIFO would block its reader, a device never end
        raise ApiError(field, f"{relative!r} is neither a file nor a directory")
    return target
