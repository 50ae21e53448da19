"""The compiled-kernel cache: each C++ kernel built once per user, and loaded only once verified.

jgpt's XLA FFI kernels (`blas_matmul.cc`, `blas_attention.cc`, `blas_matvec.cc`, `fused_decode.cc`) are
compiled on first use with the system's C++ compiler (`$CXX`, else `g++`) against the FFI headers jaxlib
ships, and every later process loads the library from `$XDG_CACHE_HOME/jgpt/kernels` (or
`~/.cache/jgpt/kernels`). Loading a shared library runs its code, so the cache trusts only what this
user's own jgpt wrote there:

* The directory: `jgpt/` and `jgpt/kernels/` are made with mode 0700, and used only if each is a real
  directory owned by this user and writable by no one else (`jgpt.runtime.cache_directory.open_private`). Else one
  warning line, and the kernel is built in a private temporary directory for this process only (the cache
  is neither read nor written): the same kernel and the same results, a few seconds of compiling later;
  falling back to XLA instead would change speed and rounding with the state of a directory.
* The file: a library (and its record) must be a regular file, not a symbolic link, owned by this user and
  writable by no one else; else one warning line, and it is rebuilt (replaced by a rename).
* Its bytes: each library is published with a record of its SHA-256 beside it, `NAME.so.sha256` in
  `sha256sum` format, written after it; the library is loaded only if its bytes hash to the record. One
  without a record (a cache from an older jgpt, a build interrupted between the two renames), truncated
  (a torn write) or corrupt is rebuilt silently, never loaded: a truncated library used to end every later
  decode with a bus error.
* Publishing: the library is compiled in a private temporary directory, copied into a new file in the cache,
  fsynced, renamed over the name, and the directory fsynced; then the record the same way. A crash leaves
  the old state, a library without its record, or a temporary file, each rebuilt or ignored.
* Loading: the verified file is loaded through the descriptor it was hashed from (`/proc/self/fd/N`), so
  the bytes loaded are the bytes hashed even if the name is replaced meanwhile; as the file is this user's
  and writable by no one else, no other user can change them between the hash and the load.

The name is `{source stem}-{key}.so`, the key the SHA-256 of the source, every header beside it (its quoted
includes), jaxlib's version and the compile command; a concurrent first use compiles twice at worst. Where
the kernel cannot be built or loaded, `load` raises OSError or CalledProcessError, each kernel's module
says it is unavailable, and a plan resolved there says "xla" for it (`jgpt.kernels.plan`). Kept apart from
the kernels so that every one loads through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import hashlib
import os
import secrets
import stat
import subprocess
import tempfile
from pathlib import Path

import jax
import jaxlib

from jgpt.runtime.cache_directory import CacheRefused, cache_home, not_own, open_private, warn_once

# A cached file opened to be verified: never through a symbolic link, never blocking on a FIFO.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
LIBRARY_MODE, RECORD_MODE = 0o700, 0o600
RECORD_SUFFIX = ".sha256"
CACHE_PARTS = ("jgpt", "kernels")  # below the user's cache home
RECORD_LIMIT = 4096  # a record is 64 hex digits, two spaces, the name and a newline


@dataclasses.dataclass(frozen=True)
class Build:
    """How one kernel is compiled, and the name its library has in the cache."""

    source: Path
    command: tuple[str, ...]
    name: str


def build_of(source: Path) -> Build:
    """The build of the kernel `source`, named by the key of everything that makes its bytes."""
    include = str(Path(jax.ffi.include_dir()))
    command = (os.environ.get("CXX", "g++"), "-O2", "-std=c++17", "-shared", "-fPIC", "-w", "-I", include)
    # The headers beside the source are what its quoted includes can reach (jgpt/kernels/one_row.h).
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    text = source.read_bytes() + headers + jaxlib.__version__.encode() + " ".join(command).encode()
    return Build(source, command, f"{source.stem}-{hashlib.sha256(text).hexdigest()[:16]}.so")


def cache_path() -> Path:
    """Where the kernels are cached for this user."""
    return cache_home(os.environ).joinpath(*CACHE_PARTS)


def load(source: Path) -> ctypes.CDLL:
    """The kernel `source` compiled and loaded: the cached library where it is verified, else built afresh
    (and published to the cache where the cache is this user's own). Raises OSError or CalledProcessError
    where it cannot be built or loaded."""
    build = build_of(source)
    try:
        directory = open_private(cache_home(os.environ), CACHE_PARTS)
    except CacheRefused as refusal:
        warn_once(f"kernel cache {refusal}; building {source.name} in a private temporary directory instead")
        return _loaded(_compiled(build))
    try:
        library = _verified(directory, cache_path(), build.name)
        if library is None:
            library = _published(directory, build.name, _compiled(build))
        return _loaded(library)
    finally:
        os.close(directory)


def record(digest: str, name: str) -> bytes:
    """The record written beside the library `name` whose SHA-256 is `digest` (`sha256sum -c` reads it)."""
    return f"{digest}  {name}\n".encode()


def digest_of(descriptor: int) -> str:
    """The SHA-256 of the whole file open at `descriptor`, read by offset (the file position is untouched)."""
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(descriptor, 1 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def _verified(directory: int, path: Path, name: str) -> int | None:
    """A descriptor of the cached library `name` whose bytes match its record, or None (to rebuild)."""
    library = _own_file(directory, path, name)
    if library is None:
        return None
    recorded, verified = _own_file(directory, path, name + RECORD_SUFFIX), False
    if recorded is not None:
        with os.fdopen(recorded, "rb") as file:
            verified = file.read(RECORD_LIMIT) == record(digest_of(library), name)
    if verified:
        return library
    os.close(library)
    return None


def _own_file(directory: int, path: Path, name: str) -> int | None:
    """A descriptor of the regular file `name` in `directory`, if it is there and this user's own; None
    if it is absent, or (with one warning line) a link, not a regular file, or not this user's own."""
    try:
        descriptor = os.open(name, FILE_FLAGS, dir_fd=directory)
    except FileNotFoundError:
        return None
    except OSError as error:
        reason = "a symbolic link" if error.errno == errno.ELOOP else error.strerror
        warn_once(f"kernel cache {path / name}: {reason}; not loaded, rebuilt")
        return None
    status = os.fstat(descriptor)
    reason = not_own(status) if stat.S_ISREG(status.st_mode) else "not a regular file"
    if reason is None:
        return descriptor
    os.close(descriptor)
    warn_once(f"kernel cache {path / name}: {reason}; not loaded, rebuilt")
    return None


def _compiled(build: Build) -> int:
    """A descriptor of the kernel compiled in a private temporary directory (removed again: the open
    descriptor keeps the file)."""
    with tempfile.TemporaryDirectory(prefix="jgpt-kernel-") as private:
        output = os.path.join(private, build.name)
        subprocess.run([*build.command, "-o", output, str(build.source)], check=True, capture_output=True)
        return os.open(output, FILE_FLAGS)


def _published(directory: int, name: str, built: int) -> int:
    """Copy the library open at `built` into the cache as `name`, then its record; a descriptor of the copy."""
    with os.fdopen(built, "rb") as file:
        data = file.read()
    library = _replaced(directory, name, data, LIBRARY_MODE)
    os.close(_replaced(directory, name + RECORD_SUFFIX, record(hashlib.sha256(data).hexdigest(), name), RECORD_MODE))
    return library


def _replaced(directory: int, name: str, data: bytes, mode: int) -> int:
    """Write `data` to a new file, fsync it, rename it to `name` and fsync the directory: readers see the
    old file or the whole new one, also after a crash. Returns a descriptor of the new file."""
    temporary = f".{name}.{secrets.token_hex(8)}.tmp"
    descriptor = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         dir_fd=directory)  # fmt: skip
    try:
        with open(descriptor, "wb", closefd=False) as file:
            file.write(data)
        os.fsync(descriptor)
        os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
        os.fsync(directory)
    except BaseException:
        os.close(descriptor)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=directory)
        raise
    return descriptor


def _loaded(descriptor: int) -> ctypes.CDLL:
    """The library open at `descriptor`, loaded through the descriptor, which then stays open for the life of
    the process: glibc matches a `dlopen` by its path before its file, so a number closed and reused later
    would hand back the library loaded before under that number."""
    try:
        return ctypes.CDLL(f"/proc/self/fd/{descriptor}")
    except OSError:
        os.close(descriptor)
        raise
