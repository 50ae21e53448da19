"""ApiError: the one error type for bad input anywhere in jgpt.

Every layer raises it with the field at fault and the reason; command-line faces
print it and exit non-zero without a traceback. Importing this module must stay
cheap (no jax), because kvsim and the CLI import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any


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


# The signals that end a command: each raises where the command is (KeyboardInterrupt, Terminated).
INTERRUPTIONS = frozenset({signal.SIGINT, signal.SIGTERM})
# How soon a signal held back inside an import is sent to the main thread again.
REDELIVERY_S = 0.02

# Set by a SIGTERM (or SIGINT) until its command ends. The handler's exception alone can be lost: Python runs a
# signal handler at the next bytecode boundary of the main thread, and one inside a garbage-collection callback
# (JAX registers one) or a __del__ has its exception printed and swallowed; with SIGTERM then ignored for the
# cleanup, a training run went on forever (2 of 24 resumed runs SIGTERMed in a loop, each with its handler
# inside `_xla_gc_callback`: the intermittent CI failure of tests/test_interruption.py).
_TERMINATION = threading.Event()
_INTERRUPTION = threading.Event()
# The signals held back and due again, each with the timer that sends it: at most one per signal.
_DEFERRED: dict[int, threading.Timer] = {}


def _signalled(signum, frame) -> None:
    """A command's SIGINT and SIGTERM handler: KeyboardInterrupt or Terminated where the command is, unless that
    is inside an import. There the exception would cross an extension module's initialization: jaxlib's turned
    it into an ImportError traceback (exit 1), crashed (SIGSEGV), or let an `except ImportError` swallow it; so
    the signal is sent again a moment later, until the import is done."""
    (_TERMINATION if signum == signal.SIGTERM else _INTERRUPTION).set()
    if _importing(frame):
        _send_again(signum)
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the cleanup
    raise Terminated


def _importing(frame) -> bool:
    """Whether `frame` runs inside an import (a module's code, or code an extension module's initialization
    calls): the import system's own frames are below it."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _send_again(signum: int) -> None:
    if signum in _DEFERRED:  # however many arrive meanwhile, one is sent again
        return
    timer = threading.Timer(REDELIVERY_S, _resend, (signum,))
    timer.daemon = True
    _DEFERRED[signum] = timer
    timer.start()


def _resend(signum: int) -> None:
    _DEFERRED.pop(signum, None)
    signal.pthread_kill(threading.main_thread().ident or 0, signum)


def _unreported(previous: Callable[[Any], object]) -> Callable[[Any], object]:
    """An unraisable-exception hook that keeps a KeyboardInterrupt or Terminated swallowed in a gc callback or a
    `__del__` off stderr (Python's "Exception ignored in ..." report, a traceback): the handler set the flag that
    ends the command at its next `raise_if_terminated`, with its one line. Any other exception goes to `previous`."""

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
            previous(unraisable)

    return hook


def raise_if_terminated() -> None:
    """Raise Terminated (or KeyboardInterrupt) if a SIGTERM (or SIGINT) arrived and its exception was swallowed or
    is still held back: call between units of long work (a train step), so that work still stops."""
    if _TERMINATION.is_set():
        raise Terminated
    if _INTERRUPTION.is_set():
        raise KeyboardInterrupt


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

    SIGTERM, like SIGINT, unwinds the command (exit 143, as a shell reports a TERM death; 130 for SIGINT),
    whenever it arrives: one held back since start-up (`jgpt.cli.main` blocks both until here) arrives as soon as
    the handlers are set, and one inside an import waits for its end.
    """
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = _Signals.take() if main_thread else None
    try:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTIONS)  # a signal held back since start-up lands here
        code = command() or 0
        raise_if_terminated()  # a signal whose exception was swallowed or held back still ends the command
        return code
    except ApiError as error:
        print(f"{prog}: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
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
        if previous is not None:
            previous.give_back()


@dataclasses.dataclass(frozen=True)
class _Signals:
    """What `run_guarded` changes in the main thread, to be put back when its command ends."""

    handlers: dict[int, Any]
    mask: frozenset[int]
    unraisablehook: Callable[[Any], object]

    @classmethod
    def take(cls) -> _Signals:
        """Set the command's handlers (and the unraisable hook); what was there before."""
        taken = cls(
            # A signal the parent set to be ignored (SIGINT in a background job) stays ignored, as Python does.
            {s: signal.signal(s, _signalled) for s in INTERRUPTIONS if signal.getsignal(s) != signal.SIG_IGN},
            frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, ())),
            sys.unraisablehook,
        )
        sys.unraisablehook = _unreported(taken.unraisablehook)
        return taken

    def give_back(self) -> None:
        """Put everything back (the mask first: a console script holds the signals back again until it exits),
        forget the signals this command received and cancel any still due."""
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        for signum, handler in self.handlers.items():  # None: not set from Python, so it was the default
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        sys.unraisablehook = self.unraisablehook
        for timer in _DEFERRED.values():
            timer.cancel()
        _DEFERRED.clear()
        _TERMINATION.clear()
        _INTERRUPTION.clear()
