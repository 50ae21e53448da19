"""Where a command writes: checked before any work, so a bad path costs nothing and destroys nothing.

A command names its output file (or directory) and its input files; the output is
refused, as an ApiError naming the option, when it is a directory where a file is
written (or a file where a directory is), when its directory does not exist or is a
file, or when it is the same file as an input (by resolved path or by inode: a link to
the input counts), because writing it would replace the input the command is reading.

A command that writes a directory (`export-hf`, an artifact) stages it beside the target and
renames it into place (`staged`, `replace_directory`): a reader never sees half of it, a write
the system refuses (a full disk, in a native library too) is one ApiError naming the option and
removes the staging, and a signal cannot land between the two renames of a replacement. What a
SIGKILL there leaves (the old directory moved aside as `.NAME.XXXXXXXX.replaced`) is put back
or removed by the next run (`recover_replaced`).
Cheap to import (no jax).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import output_mode, system_refusal

# The signals a person or a supervisor sends to stop a command; held back while a directory is swapped.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ASIDE_SUFFIX = ".replaced"


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


def _staging_prefix(target: Path) -> str:
    # Cut short like write_atomically's: a 255-byte target name (NAME_MAX) must leave room for the suffixes.
    return f".{target.name[:200]}."


@contextlib.contextmanager
def staged(target: Path, field: str) -> Iterator[Path]:
    """A new directory beside `target` to write the output into; the block ends by moving it into place
    (`replace_directory`). On any failure it is removed; one the system refused (a full disk, a read-only
    directory, also as a native library reports it) becomes an ApiError naming `field` and `target`."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(target), dir=target.parent))
    except OSError as error:
        raise ApiError(field, f"cannot write {target}: {error.strerror}") from None
    try:
        yield staging
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if reason := _refusal_inside(error, staging):
            raise ApiError(field, f"cannot write {target}: {reason}") from None
        raise


def _refusal_inside(error: BaseException, staging: Path) -> str | None:
    """The system's reason when `error` is a write into `staging` it refused; None for anything else (a read
    of an input that failed keeps its own message)."""
    if isinstance(error, ApiError):  # write_atomically's refusal of one file in the staging directory
        inside = Path(error.field).is_relative_to(staging) and error.reason.startswith("cannot write: ")
        return error.reason.removeprefix("cannot write: ") if inside else None
    if isinstance(error, OSError) and error.filename and not Path(error.filename).is_relative_to(staging):
        return None
    return system_refusal(error)


def replace_directory(staging: Path, target: Path) -> None:
    """Move the complete `staging` to `target`, replacing the directory there (the old one is moved aside
    and removed only once the new one is in place). SIGINT and SIGTERM are held back meanwhile, so `target`
    is always the old directory or the new one, whole, and nothing is left aside; the mode is the replaced
    directory's, or the umask's for a new one."""
    os.chmod(staging, output_mode(target, directory=True))
    aside = staging.with_name(staging.name + ASIDE_SUFFIX)
    with signals_deferred():
        if not os.path.lexists(target):
            staging.rename(target)
            return
        target.rename(aside)
        try:
            staging.rename(target)
        except BaseException:
            aside.rename(target)
            raise
        shutil.rmtree(aside, ignore_errors=True)  # left only by an error; the next run removes it


def recover_replaced(target: Path, replaceable: Callable[[Path], bool]) -> None:
    """Undo what a replacement killed between its renames (SIGKILL, a power cut) left beside `target`: with
    `target` missing, the newest directory moved aside is put back; the others are removed. Only directories
    that `replaceable` recognises as this command's output are touched."""
    # Exactly this target's: mkdtemp's eight characters between prefix and suffix (".out.v2.*" is not "out"'s).
    pattern = re.compile(re.escape(_staging_prefix(target)) + r"[a-z0-9_]{8}" + re.escape(ASIDE_SUFFIX))
    try:
        entries = list(target.parent.iterdir())
    except OSError:  # no parent yet: nothing to recover
        return
    asides = [
        entry
        for entry in entries
        if pattern.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink() and replaceable(entry)
    ]
    asides.sort(key=lambda entry: entry.stat().st_mtime_ns)
    if asides and not os.path.lexists(target):
        with signals_deferred():
            asides.pop().rename(target)
    for aside in asides:
        shutil.rmtree(aside)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back until the block ends, then deliver them to the handlers in place before.
    A Python-level deferral, not `pthread_sigmask`: a signal blocked in the main thread is still taken by
    another thread (JAX's, orbax's), and CPython then runs its handler in the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {
        number: signal.signal(number, lambda signum, frame: received.append(signum)) for number in STOPPING_SIGNALS
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(received):  # each once, in the order they came
            signal.raise_signal(signum)


# How long a failed library write's worker threads are waited for before the command reports the failure.
LIBRARY_THREAD_WAIT = 60.0
# How long no worker thread may run before the library's failed write counts as over.
LIBRARY_SETTLE = 0.5


@contextlib.contextmanager
def library_write() -> Iterator[None]:
    """Run a native library's write (orbax's checkpoints over tensorstore) so that a failure is one exception
    and nothing else. What the library prints meanwhile (its log records, the tracebacks its callbacks print
    from C) is held and printed afterwards, unless the write failed because the system refused it, which the
    command reports in one line. After a failure its worker threads are waited for: orbax raises on the first
    failed item while the others are still writing, so files reappeared after the cleanup and tracebacks
    followed the error line. Its worker threads are Thread subclasses started during the write; a thread
    pool's workers (plain Threads) wait for work for ever and are not waited for."""
    threads = set(threading.enumerate())
    sys.stderr.flush()
    saved_descriptor, saved_stream = os.dup(2), sys.stderr
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        sys.stderr = open(os.dup(held.fileno()), "w", encoding="utf-8", errors="backslashreplace")
        report = True
        try:
            yield
        except BaseException as error:
            _wait_for_library_threads(threads)
            gc.collect()  # the failed futures it dropped log "exception was never retrieved" when collected
            report = system_refusal(error) is None
            raise
        finally:
            sys.stderr.close()
            sys.stderr = saved_stream
            os.dup2(saved_descriptor, 2)
            os.close(saved_descriptor)
            if report:
                held.seek(0)
                saved_stream.write(held.read().decode("utf-8", "backslashreplace"))


def _wait_for_library_threads(before: set[threading.Thread]) -> None:
    """Until no worker thread started since `before` has been alive for LIBRARY_SETTLE seconds (one finishing
    may start the next), or LIBRARY_THREAD_WAIT has passed."""
    deadline = time.monotonic() + LIBRARY_THREAD_WAIT
    quiet_since = time.monotonic()
    while (now := time.monotonic()) < deadline and now - quiet_since < LIBRARY_SETTLE:
        workers = [t for t in set(threading.enumerate()) - before if type(t) is not threading.Thread]
        for worker in workers:  # Thread's own join: orbax's raises the error the thread ended in
            threading.Thread.join(worker, max(0.0, deadline - time.monotonic()))
        if workers:
            quiet_since = time.monotonic()
        else:
            time.sleep(LIBRARY_SETTLE / 5)
