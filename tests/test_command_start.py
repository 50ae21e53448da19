"""A signal at any moment of a command's start-up ends it as a signal should: exit 143 (SIGTERM) or 130 (SIGINT)
and one line, never a traceback, a crash or a swallowed Ctrl-C (jgpt.cli.main holds the signals back until
jgpt.foundation.errors.run_guarded has its handlers; a signal inside an import waits for the import's end).

Before, `jgpt generate` signalled in its first 0.6 s ended, in 30 starts each: SIGTERM, 17 killed with no message,
8 in an ImportError traceback from jaxlib's initialization (exit 1), 2 in a segmentation fault, 4 cleanly; SIGINT,
1 cleanly and 29 in a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jgpt.foundation.errors import raise_if_terminated, run_guarded

from hostile import interruptible

REPO = Path(__file__).resolve().parent.parent
JGPT = os.path.join(os.path.dirname(sys.executable), "jgpt")  # the console script, as a user starts it
STARTS = 10  # per signal
DEADLINE = 120
HELD_BACK = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))  # SigBlk's bits for both


def _holding_signals(pid: int) -> bool | None:
    """Whether the process blocks SIGINT and SIGTERM (jgpt.cli.main's first line ran); None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    blocked = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    return blocked & HELD_BACK == HELD_BACK


def _signalled_start(signum: int, delay: float) -> tuple[int, str]:
    """Start `jgpt generate`, send `signum` `delay` s after jgpt's own code began, and return (exit, stderr)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    # SIGINT as a terminal delivers it: an xdist worker ignores SIGINT, and a child would inherit that.
    process = subprocess.Popen([JGPT, "generate", "--max-new-tokens", "2", "hi"], env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    # Before jgpt.cli.main's first line only the interpreter runs; a signal there takes its default action.
    deadline = time.monotonic() + DEADLINE
    while not _holding_signals(process.pid) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(delay)
    process.send_signal(signum)
    try:
        _, stderr = process.communicate(timeout=DEADLINE)
    finally:
        process.kill()
    return process.returncode, stderr


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
@pytest.mark.parametrize(
    "signum, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_at_any_moment_of_start_up_ends_the_command_with_one_line(signum, code, word):
    """STARTS starts, each signalled at a random moment of its first 0.55 s after jgpt's first line: the
    console script's imports, the restart with the malloc tunables, the command's import and jax's."""
    rng = random.Random(signum)
    outcomes = [(delay, *_signalled_start(signum, delay)) for delay in (rng.uniform(0, 0.55) for _ in range(STARTS))]
    wrong = [(round(delay, 3), exit_, stderr[-600:]) for delay, exit_, stderr in outcomes
             if (exit_, stderr) != (code, f"jgpt generate: {word}\n")]  # fmt: skip
    assert not wrong, wrong


def test_a_signal_inside_an_import_waits_for_its_end(tmp_path, monkeypatch):
    """The handler's exception would cross the import (for an extension module, its initialization): it is
    raised once the module is whole instead."""
    (tmp_path / "signalled_module.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.1)\nWHOLE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reached = []

    def command():
        import signalled_module

        reached.append(signalled_module.WHOLE)
        time.sleep(5)  # the signal, sent again, ends the command here

    started = time.monotonic()
    assert run_guarded("test", command) == 143
    assert reached == [True] and time.monotonic() - started < 2
    sys.modules.pop("signalled_module", None)
    raise_if_terminated()  # nothing left over


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_swallowed_in_a_gc_callback_ends_the_command_without_a_report(capfd, signum, code):
    """A handler that runs inside a garbage-collection callback (JAX registers one) has its exception swallowed;
    Python printed it as "Exception ignored in ..." with a traceback, and a Ctrl-C was lost. The command still
    ends as signalled (tests/test_interruption.py: at its next check or when it returns), with its one line."""

    def callback(phase, info):
        if phase == "start":
            os.kill(os.getpid(), signum)

    def command():
        gc.callbacks.append(callback)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(callback)

    with interruptible():
        assert run_guarded("test", command) == code
    assert capfd.readouterr().err == f"test: {'terminated' if signum == signal.SIGTERM else 'interrupted'}\n"
