"""The sandbox process: where a foreign chat template renders and a foreign tokenizer's regexes are tried.

jinja2's immutable sandbox keeps a template from reaching Python, not from computing. Checks on the
numbers a template passes (sizes, widths, exponents) were bypassed each time a new way to combine
allowed ones was found: a width given as a string or by key, a product of allowed sizes through
replace/join/expandtabs/translate/indent, a tower of powers, nested loops, a string doubled in a loop
through a namespace. A tokenizer.json's regex can likewise backtrack for ever or make the library panic.
So nothing here recognises patterns: the work runs in a child process (jgpt/tokenizers/sandbox_child.py) whose
bounds hold whatever it computes, enforced by the kernel and by this process:

    memory       MEMORY_LIMIT of address space (RLIMIT_AS): past it an allocation fails, a refusal
    CPU time     CPU_SECONDS per request (RLIMIT_CPU): past it the kernel ends the child, even inside
                 one C call (a big-integer power no signal interrupts)
    wall clock   WALL_SECONDS per request: past it this process kills the child (a child starved of CPU)
    output       OUTPUT_LIMIT characters of rendered text, counted as the template's output streams

Every failure is an ApiError naming the caller's field. One child serves the whole jgpt process: it
starts at the first request (about 0.1 s) and is reused, so a render costs a pipe round trip (well
under a millisecond for a real template); one that was ended is started afresh at the next request.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError

MEMORY_LIMIT = 256 << 20  # the child's address space: about 35 MiB of it is Python, jinja2 and tokenizers
CPU_SECONDS = 2  # a real template renders in a millisecond, a probe of every regex in a few
WALL_SECONDS = 10  # a child starved of CPU on a busy machine still answers
# Characters of framing: a real template renders a few hundred, one with a default system prompt a few thousand.
OUTPUT_LIMIT = 1 << 16
START_SECONDS = 60  # the child's start: an interpreter and jinja2 on a loaded machine

_PROGRAM = Path(__file__).with_name("sandbox_child.py")


class _Child:
    """The one child process, started on first use; a lock serializes requests (engine threads share it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.owner = os.getpid()  # a forked copy of this process starts its own child: never the parent's pipes
        atexit.register(self.close)

    def exchange(self, request: dict[str, Any], field: str) -> Any:
        with self.lock:
            process = self._running() or self._started(field)
            reply = self._reply(process, json.dumps({**request, "cpu_seconds": CPU_SECONDS}) + "\n", field)
        if "refused" in reply:
            raise ApiError(field, reply["refused"])
        return reply["result"]

    def _running(self) -> subprocess.Popen | None:
        process = self.process
        return process if process is not None and process.poll() is None and self.owner == os.getpid() else None

    def _started(self, field: str) -> subprocess.Popen:
        environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
        try:
            process = subprocess.Popen(
                # -P: the script's directory (jgpt/, whose module names could shadow a library's) is not on the path
                [sys.executable, "-P", str(_PROGRAM), str(MEMORY_LIMIT), str(OUTPUT_LIMIT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # a Rust panic's message: the refusal carries it
                env=environment,
                start_new_session=True,  # a Ctrl-C at the terminal is this process's to handle, not the child's
            )
        except OSError as error:
            raise ApiError(field, f"cannot start the sandbox process: {error.strerror or error}") from None
        self.process, self.owner = process, os.getpid()
        if self._line(process, START_SECONDS) is None:
            raise ApiError(field, f"the sandbox process did not start: {self._ended(process)}")
        return process

    def close(self) -> None:
        """End the child at exit: it ends by itself when its input closes."""
        process, self.process = self.process, None
        if process is not None and self.owner == os.getpid() and process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _reply(self, process: subprocess.Popen, request: str, field: str) -> dict[str, Any]:
        try:
            assert process.stdin is not None
            process.stdin.write(request.encode("ascii"))
            process.stdin.flush()
        except BrokenPipeError:
            raise ApiError(field, f"the sandbox process ended: {self._ended(process)}") from None
        line = self._line(process, WALL_SECONDS)
        if line is None:
            raise ApiError(field, self._ended(process))
        return json.loads(line)

    @staticmethod
    def _line(process: subprocess.Popen, seconds: float) -> bytes | None:
        """The child's next line, or None if it ended or did not answer within `seconds`."""
        assert process.stdout is not None
        descriptor = process.stdout.fileno()
        deadline = time.monotonic() + seconds
        chunks: list[bytes] = []
        with selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0 and selector.select(left):
                chunk = os.read(descriptor, 1 << 20)
                if not chunk:
                    return None
                chunks.append(chunk)
                if chunk.endswith(b"\n"):
                    return b"".join(chunks)
        return None

    def _ended(self, process: subprocess.Popen) -> str:
        """Why the child gave no answer; it is killed if it still runs, and replaced at the next request."""
        timed_out = process.poll() is None
        if timed_out:
            process.kill()
        code = process.wait()
        self.process = None
        if timed_out:
            return f"takes more than {WALL_SECONDS} s (wall clock)"
        if code in (-signal.SIGXCPU, -signal.SIGKILL):
            return f"takes more than {CPU_SECONDS} s of CPU time"
        return f"the sandbox process ended with {'signal ' + str(-code) if code < 0 else 'exit ' + str(code)}"


_CHILD = _Child()


def render(template: str, context: dict[str, Any], field: str) -> str:
    """The template rendered with `context` (JSON values) in jinja2's immutable sandbox, within the bounds above."""
    rendered = _CHILD.exchange({"kind": "render", "template": template, "context": context}, field)
    if not isinstance(rendered, str):
        raise ApiError(field, "the sandbox process answered something other than text")
    return rendered


def probe(pipeline: dict[str, Any], texts: list[str], field: str) -> None:
    """Run a tokenizer.json's normalizer, pre-tokenizer and decoder (JSON) on texts within the bounds above."""
    _CHILD.exchange({"kind": "probe", "pipeline": pipeline, "texts": texts}, field)
