"""Identities and safe file I/O shared by every layer: canonical JSON, SHA-256, reads, atomic writes.

Manifests, encodings, run configurations and records are identified by the SHA-256
of one canonical JSON form, so two writers never disagree about an identity. Cheap to
import (no jax): kvsim and the command line use it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError

REPOSITORY = Path(__file__).resolve().parents[2]

# Bytes of one input read whole. JSON decodes to several times its size in memory, so a file past
# this is not one a command can use; a pipe that never ends (`yes |`) stops here, not in MemoryError.
READ_LIMIT = 1 << 30


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, ASCII with \\u escapes, no NaN: one byte string per value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def require_finite(value: Any, field: str) -> None:
    """An ApiError naming the path of the first NaN or infinity inside a parsed JSON value.

    Readers that want the field named (not just the file) parse with non-finite numbers
    allowed and call this before anything hashes or uses the value.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(field, f"is {value}, not a finite number")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        require_finite(item, f"{field}.{key}" if isinstance(key, str) else f"{field}[{key}]")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def source_hashes(packages: Iterable[str]) -> dict[str, str]:
    """SHA-256 of every Python file under the given top-level packages, by repository path."""
    files = sorted(path for package in packages for path in (REPOSITORY / package).rglob("*.py"))
    return {path.relative_to(REPOSITORY).as_posix(): file_sha256(path) for path in files}


def read_bytes(path: str | os.PathLike, field: str) -> bytes:
    """A file's bytes, or a pipe's up to READ_LIMIT; a missing or unreadable file, a device (`/dev/zero`
    never ends) or anything larger is an ApiError naming `field` and the path."""
    try:
        with open(path, "rb") as file:
            status = os.fstat(file.fileno())
            if not (stat.S_ISREG(status.st_mode) or stat.S_ISFIFO(status.st_mode)):
                raise ApiError(field, f"cannot read {path}: not a file or a pipe")
            if status.st_size > READ_LIMIT:
                raise ApiError(field, f"cannot read {path}: larger than {READ_LIMIT} bytes")
            # read(n) allocates n bytes up front: a pipe is read a chunk at a time up to the limit
            data = file.read() if stat.S_ISREG(status.st_mode) else b"".join(_chunks(file, READ_LIMIT + 1))
    except OSError as error:
        raise ApiError(field, f"cannot read {path}: {error.strerror}") from None
    except MemoryError:
        raise ApiError(field, f"cannot read {path}: larger than this machine's free memory") from None
    if len(data) > READ_LIMIT:
        raise ApiError(field, f"cannot read {path}: larger than {READ_LIMIT} bytes")
    return data


def _chunks(file: io.BufferedReader, limit: int) -> Iterator[bytes]:
    while limit > 0 and (chunk := file.read1(min(limit, 1 << 20))):
        limit -= len(chunk)
        yield chunk


def write_atomically(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write next to the target, then rename: a reader never sees half a file, and a write the system
    refuses (a full disk, a read-only directory) leaves the old file as it was and names the path."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # The name cut short: a target of 255 bytes (NAME_MAX) is writable, its temporary name must be too.
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=".tmp")
    except OSError as error:
        raise ApiError(str(path), f"cannot write: {error.strerror}") from None
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.writelines([data] if isinstance(data, bytes) else data)
        os.chmod(temporary, output_mode(path))  # mkstemp creates 0600 whatever the umask
        os.replace(temporary, path)
    except BaseException as error:
        os.unlink(temporary)
        if isinstance(error, OSError):
            raise ApiError(str(path), f"cannot write: {error.strerror}") from None
        raise


def umask() -> int:
    """The process's umask, read without changing it: `os.umask` sets one to read it, and a file another
    thread created meanwhile would get the wrong mode."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    if found := re.search(r"^Umask:\s*([0-7]+)$", status, re.MULTILINE):
        return int(found.group(1), 8)
    mask = os.umask(0o022)  # no /proc (not Linux): the race above is accepted there
    os.umask(mask)
    return mask


def output_mode(path: str | os.PathLike, directory: bool = False) -> int:
    """The permission bits for an output written at `path`: those of the file (or directory) it replaces,
    else what the umask gives a new one, as `open` or `mkdir` would. Temporary files and directories
    (mkstemp, mkdtemp) are private whatever the umask, so each output gets this mode before it is renamed."""
    try:
        existing = os.lstat(path)
    except OSError:
        existing = None
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    if existing is not None and kind(existing.st_mode):
        return stat.S_IMODE(existing.st_mode)
    return (0o777 if directory else 0o666) & ~umask()


# How a native library (safetensors, tensorstore under orbax) reports the system's refusal in its message.
_LIBRARY_ERRNO = re.compile(r"os error (\d+)|os_error_code='?(\d+)")


def system_refusal(error: BaseException) -> str | None:
    """The system's reason (`No space left on device`) when `error`, or an exception it was raised from,
    is an OSError or a native library's error carrying an errno; None for any other failure."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno:
            return current.strerror or os.strerror(current.errno)
        if found := _LIBRARY_ERRNO.search(str(current)):
            return os.strerror(int(found.group(1) or found.group(2)))
        current = current.__cause__ or current.__context__
    return None
