"""Where a command writes: checked before any work, so a bad path costs nothing and destroys nothing.

A command names its output file (or directory) and its input files; the output is
refused, as an ApiError naming the option, when it is a directory where a file is
written (or a file where a directory is), when its directory does not exist or is a
file, or when it is the same file as an input (by resolved path or by inode: a link to
the input counts), because writing it would replace the input the command is reading.
Cheap to import (no jax).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from jgpt.errors import ApiError


def output_file(path: str | os.PathLike, field: str, inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
    """`path` if a file may be written there (atomically, replacing a regular file); else an ApiError."""
    path = Path(path)
    if path.is_dir():
        raise ApiError(field, f"{path} is a directory; give the path of a file to write")
    if path.exists() and not path.is_file():
        raise ApiError(field, f"{path} exists and is not a regular file")
    parent = path.parent
    if not parent.is_dir():
        state = "is not a directory" if parent.exists() else "does not exist"
        raise ApiError(field, f"cannot write {path}: its directory {parent} {state}")
    _refuse_inputs(path, field, inputs)
    return path


def output_directory(path: str | os.PathLike, field: str, inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
    """`path` if files may be written into it (missing directories are created later); else an ApiError."""
    path = Path(path)
    for ancestor in (path, *path.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                where = "is a file" if ancestor == path else f"lies under the file {ancestor}"
                raise ApiError(field, f"{path} {where}; give a directory")
            break
    _refuse_inputs(path, field, inputs)
    return path


def _refuse_inputs(path: Path, field: str, inputs: Iterable[str | os.PathLike | None]) -> None:
    for source in inputs:
        if source and _same_file(path, Path(source)):
            raise ApiError(field, f"{path} is the input {source}; writing it would destroy the input")


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist: not the same file
        return False
