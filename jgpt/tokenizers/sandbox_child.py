"""The sandbox process's program: renders chat templates and tries tokenizer regexes under limits.

jgpt.tokenizers.sandbox runs this file as `python -P sandbox_child.py MEMORY_BYTES OUTPUT_LIMIT`. It reads one JSON
request a line from stdin and writes one JSON reply a line to stdout: {"result": ...} or {"refused":
reason}. It imports nothing of jgpt (the script's own directory is not on its path), only jinja2 and
tokenizers, so it starts in a tenth of a second and holds a few tens of MB.

The limits are set here, before any request is read, and the kernel enforces them whatever the
template or the regex does: RLIMIT_AS (an allocation past it is a MemoryError, answered as a refusal),
RLIMIT_CPU raised before each request to the CPU time used so far plus the request's budget (past it
the kernel ends the process with SIGXCPU, even inside one C call such as a big-integer power),
RLIMIT_CORE and RLIMIT_FSIZE zero (no core dump, no file written). The parent adds the wall-clock deadline.
"""

from __future__ import annotations

import functools
import json
import math
import resource
import sys
from typing import Any

REASON_LIMIT = 300  # characters of a library's own message kept in a refusal


class Refused(Exception):
    """A refusal with its reason, e.g. a template's raise_exception."""


def main(memory_bytes: int, output_limit: int) -> None:
    for limit in (resource.RLIMIT_CORE, resource.RLIMIT_FSIZE):
        resource.setrlimit(limit, (0, 0))
    memory_bytes = _within_hard(resource.RLIMIT_AS, memory_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    sys.stdout.write('{"result": "ready"}\n')
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        _limit_cpu(request["cpu_seconds"])
        sys.stdout.write(json.dumps(_answer(request, memory_bytes, output_limit)) + "\n")
        sys.stdout.flush()


def _limit_cpu(seconds: int) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = math.ceil(usage.ru_utime + usage.ru_stime)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)  # kept: an unprivileged process cannot raise it again
    resource.setrlimit(resource.RLIMIT_CPU, (_within_hard(resource.RLIMIT_CPU, used + seconds), hard))


def _within_hard(limit: int, value: int) -> int:
    """value, or the hard limit this process inherited if that is lower (a soft limit cannot exceed it)."""
    _, hard = resource.getrlimit(limit)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _answer(request: dict[str, Any], memory_bytes: int, output_limit: int) -> dict[str, Any]:
    rendering = request["kind"] == "render"
    try:
        if rendering:
            return {"result": _render(request["template"], request["context"], output_limit)}
        _probe(request["pipeline"], request["texts"])
        return {"result": None}
    except Refused as refusal:
        return {"refused": _shortened(str(refusal))}
    except MemoryError:
        return {"refused": f"needs more than {memory_bytes >> 20} MiB of memory"}
    except BaseException as error:  # anything the template or the library raised, a Rust panic included
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        return {"refused": _shortened(f"{'cannot be rendered' if rendering else 'fails'}: {_described(error)}")}


def _render(template: str, context: dict[str, Any], output_limit: int) -> str:
    """The template's output, streamed so that it stops at output_limit characters."""
    chunks, size = [], 0
    for chunk in _compiled(template).generate(**context):
        size += len(chunk)
        if size > output_limit:
            raise Refused(f"renders more than {output_limit} characters")
        chunks.append(chunk)
    return "".join(chunks)


@functools.lru_cache(maxsize=8)  # a conversation renders the same template at every turn
def _compiled(template: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise Refused(f"refuses the turns: {message}")

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    try:
        return environment.from_string(template)
    except TemplateError as error:
        raise Refused(f"cannot be rendered: {_described(error)}") from None


def _probe(pipeline: dict[str, Any], texts: list[str]) -> None:
    """Run the normalizer, pre-tokenizer and decoder of a tokenizer.json (without its vocabulary) on each text."""
    import tokenizers

    document = {
        "version": "1.0",
        "added_tokens": [],
        **pipeline,
        "model": {"type": "BPE", "vocab": {}, "merges": []},
    }
    library = tokenizers.Tokenizer.from_str(json.dumps(document))
    for text in texts:
        normalized = library.normalizer.normalize_str(text) if library.normalizer else text
        if library.pre_tokenizer:
            library.pre_tokenizer.pre_tokenize_str(normalized)
        if library.decoder:
            library.decoder.decode([text, text])


def _described(error: BaseException) -> str:
    from jinja2 import TemplateError

    return str(error) if isinstance(error, TemplateError) else f"{type(error).__name__}: {error}"


def _shortened(reason: str) -> str:
    return reason if len(reason) <= REASON_LIMIT else reason[:REASON_LIMIT] + "..."


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
