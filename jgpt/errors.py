"""ApiError: the one error type for bad input anywhere in jgpt.

Every layer raises it with the field at fault and the reason; command-line faces
print it and exit non-zero without a traceback. Importing this module must stay
cheap (no jax), because kvsim and the CLI import it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


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


def run_guarded(prog: str, command: Callable[[], int | None]) -> int:
    """Run a command-line action; bad input becomes one line on stderr and exit code 2."""
    try:
        return command() or 0
    except ApiError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
