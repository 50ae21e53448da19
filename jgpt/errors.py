"""ApiError: the one error type for bad input anywhere in jgpt.

Every layer raises it with the field at fault and the reason; command-line faces
print it and exit non-zero without a traceback. Importing this module must stay
cheap (no jax), because kvsim and the CLI import it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator


class ApiError(Exception):
    """An explicit rejection: `field` names what was wrong, `reason` says why."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")

    @property
    def error(self) -> str:
        """The ontology's ApiError.error: the explicit rejection reason."""
        return str(self)


def library_failure(error: BaseException) -> bool:
    """Whether a native library call failed on its input: any Exception, or the PanicException
    that pyo3 raises when Rust code (tokenizers, safetensors) panics. The latter derives from
    BaseException, so `except Exception` lets it through as a traceback."""
    kind = type(error)
    return isinstance(error, Exception) or (kind.__module__ == "pyo3_runtime" and kind.__name__ == "PanicException")


def one_line(text: str) -> str:
    """`text` with line breaks and other unprintable characters escaped: a field name read from a
    file (a key holding a carriage return) must not split the one error line."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


class Terminated(BaseException):
    """SIGTERM, raised where the command was, so that cleanup (`finally`, `except BaseException`)
    removes temporary files and staging directories as it does for Ctrl-C."""


# Set by a SIGTERM until its command ends. The handler's exception alone can be lost: Python runs a signal
# handler at the next bytecode boundary of the main thread, and one inside a garbage-collection callback (JAX
# registers one) or a __del__ has its exception printed and swallowed; with SIGTERM then ignored for the
# cleanup, a training run went on forever (2 of 24 resumed runs SIGTERMed in a loop, each with its handler
# inside `_xla_gc_callback`: the intermittent CI failure of tests/test_interruption.py).
_TERMINATION = threading.Event()


def _terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the cleanup
    _TERMINATION.set()
    raise Terminated


def raise_if_terminated() -> None:
    """Raise Terminated if a SIGTERM arrived and its exception was swallowed: call between units of long work
    (a train step), so that work still stops."""
    if _TERMINATION.is_set():
        raise Terminated


@contextlib.contextmanager
def termination_deferred() -> Iterator[None]:
    """Hold a SIGTERM back until the block ends, then deliver it. For writes finished by a library's
    own threads (orbax checkpoints), which an exception in the main thread would abandon half-way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            signal.raise_signal(signal.SIGTERM)


def run_guarded(prog: str, command: Callable[[], int | None]) -> int:
    """Run a command-line action; bad input becomes one line on stderr and exit code 2.

    SIGTERM, like SIGINT, unwinds the command (exit 143, as a shell reports a TERM death).
    """
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        code = command() or 0
        raise_if_terminated()  # a SIGTERM whose exception was swallowed still ends as one
        return code
    except ApiError as error:
        print(f"{prog}: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:  # `jgpt ... | head` stopped reading: end quietly, as a SIGPIPE death would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail too
        return 128 + signal.SIGPIPE
    except OSError as error:  # the system refused a file the command named (read-only, full, no permission)
        print(f"{prog}: error: {one_line(f'{error.filename or prog}: {error.strerror or error}')}", file=sys.stderr)
        return 2
    finally:
        if main_thread:  # None: the previous handler was not set from Python, so it was the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
            _TERMINATION.clear()
