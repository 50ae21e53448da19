"""Progress a person sees while a command works for more than about a second.

Library code marks a long loop with `tracked(items, "recording requests")` and a long step with
`with stage("drawing plots"):`; both show nothing unless a command turned progress on with
`shown(quiet=...)`, and then only when stderr is a terminal. So pipes, logs, tests and library
users see exactly the output they saw before, and nothing is written while a timed loop runs
(a stage draws when it starts and when it ends, never in between).

tqdm draws the bars; it is imported only once progress is on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sized
from contextvars import ContextVar
from typing import TextIO, TypeVar

T = TypeVar("T")
DEFAULT_SIZE = (100, 24)  # columns, lines

_stream: ContextVar[TextIO | None] = ContextVar("jgpt_progress_stream", default=None)


def enabled(quiet: bool, stream: TextIO) -> bool:
    """Progress is drawn on a terminal only, and never with --quiet."""
    return not quiet and _is_terminal(stream)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


@contextlib.contextmanager
def shown(quiet: bool = False, stream: TextIO | None = None) -> Iterator[bool]:
    """Within the block, `tracked` and `stage` draw on `stream` (stderr) if it is a terminal and not `quiet`.
    Yields whether they do."""
    stream = sys.stderr if stream is None else stream
    token = _stream.set(stream if enabled(quiet, stream) else None)
    try:
        yield _stream.get() is not None
    finally:
        _stream.reset(token)


def tracked(items: Iterable[T], description: str, total: int | None = None, unit: str = "it") -> Iterable[T]:
    """`items` unchanged, drawn as a bar (items done of `total`, rate, time left) while progress is shown."""
    stream = _stream.get()
    if stream is None:
        return items
    from tqdm import tqdm

    if total is None and isinstance(items, Sized):
        total = len(items)
    # A terminal that reports no size (a pty nobody sized) would get no bar at all.
    sized = min(_size(stream)) > 0
    return tqdm(
        items,
        desc=description,
        total=total,
        unit=unit,
        file=stream,
        dynamic_ncols=sized,
        **({} if sized else {"ncols": DEFAULT_SIZE[0], "nrows": DEFAULT_SIZE[1]}),
    )


def _size(stream: TextIO) -> tuple[int, int]:
    try:
        columns, lines = os.get_terminal_size(stream.fileno())
        return columns, lines
    except (AttributeError, OSError, ValueError):  # a stand-in stream without a descriptor
        return 0, 0


@contextlib.contextmanager
def stage(description: str) -> Iterator[None]:
    """A step without countable parts: its name while it runs, then how long it took."""
    stream = _stream.get()
    if stream is None:
        yield
        return
    started = time.perf_counter()
    stream.write(f"{description} ...\r")
    stream.flush()
    try:
        yield
    except BaseException:
        stream.write("\x1b[2K")  # the error line takes its place
        raise
    stream.write(f"{description}: {time.perf_counter() - started:.1f} s\x1b[K\n")
    stream.flush()
