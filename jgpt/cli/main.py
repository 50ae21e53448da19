"""The umbrella `jgpt` command: a face that only dispatches.

Each package keeps its own commands next to its code; this table names them
with a one-line summary so that `jgpt --help` lists everything without importing
jax or any package behind a command.
"""

from __future__ import annotations

import os
import signal
import sys

# The console script (`jgpt`, and its restart `python -m jgpt.cli.main`) holds SIGINT and SIGTERM back from its
# first line until `run_guarded` has set the command's handlers, which then receive a signal sent at any moment
# of start-up (the mask and a pending signal survive the restart's exec). Left to Python's defaults, a signal
# there killed the process with no message (SIGTERM) or raised inside jaxlib's initialization: an ImportError
# traceback, a segmentation fault, or a swallowed Ctrl-C. Not when a program imports this module.
if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "jgpt":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

import importlib.util
import pkgutil
from collections.abc import Callable
from types import ModuleType

from jgpt.foundation import command_line
from jgpt.foundation.errors import run_guarded
from jgpt.runtime import compilation_cache, process_settings

# Each face is imported only when its command runs, so `jgpt --help` imports no jax: one function per face
# module, whose import the architecture test reads like any other (jgpt.cli is the layer above every package).


def _tokenize() -> ModuleType:
    from jgpt.cli import tokenize

    return tokenize


def _catalog() -> ModuleType:
    from jgpt.cli import catalog

    return catalog


def _import_hf() -> ModuleType:
    from jgpt.cli import import_hf

    return import_hf


def _export_hf() -> ModuleType:
    from jgpt.cli import export_hf

    return export_hf


def _schema() -> ModuleType:
    from jgpt.cli import schema

    return schema


def _devices() -> ModuleType:
    from jgpt.cli import devices

    return devices


def _training() -> ModuleType:
    from training import commands

    return commands


def _inference() -> ModuleType:
    from inference import commands

    return commands


def _kvsim() -> ModuleType:
    from kvsim import commands

    return commands


def _lab() -> ModuleType:
    from experiments.commands import lab

    return lab


# name -> (the face whose `main(command, argv) -> int` runs it, summary)
COMMANDS: dict[str, tuple[Callable[[], ModuleType], str]] = {
    "tokenize": (_tokenize, "encode text or conversation turns and print the Encoding; train a tokenizer"),
    "train": (
        _training,
        "train a model on the built-in conversations or a text file: checkpoints, resume, an artifact",
    ),
    "eval": (_training, "development loss and bits per byte on held-out data; a chat model's exact match per skill"),
    "catalog": (_catalog, "list the model catalog or add a verified artifact to it"),
    "import-hf": (
        _import_hf,
        "convert a local Hugging Face model directory (GPT-2, Llama, Mistral, Qwen2) into an artifact",
    ),
    "export-hf": (_export_hf, "write an artifact as a Hugging Face directory (config.json, safetensors, tokenizer)"),
    "generate": (
        _inference,
        "continue a prompt framed as the model declares (chat or plain), greedy or sampled; text or --json",
    ),
    "record": (_inference, "run a Workload and write the recorded computation document kvsim reads"),
    "serve": (
        _inference,
        "serve a Workload on the InferenceEngine (wall clock, batching, KV pool), or live clients (--http, OpenAI API)",
    ),
    "kvsim": (_kvsim, "simulate KV residency and service: run, replay, plot, perfetto, import-trace, synthesize"),
    "lab": (_lab, "list, show and run the ontology-bound labs (model -> recorded computations -> kvsim -> record)"),
    "report": (_lab, "write one self-contained HTML page explaining an experiment record"),
    "schema": (_schema, "print the JSON Schema of a document: labs, workloads, kvsim inputs and records, ..."),
    "devices": (_devices, "the JAX backend and every device it sees (check an accelerator install)"),
}

USAGE = "usage: jgpt [-h] [-V] COMMAND [ARGS...]\n"


def _help() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        USAGE,
        "jgpt: a JAX functional reference GPT: train it, run it with evidence,",
        "and simulate how a serving system holds and moves its KV state.\n",
        "commands:",
        *(f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()),
        "\nRun `jgpt COMMAND --help` for the options of one command; `jgpt --version` for the version.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _dispatch(sys.argv[1:] if argv is None else argv)
        finally:  # also after argparse's --help (SystemExit)
            sys.stdout.flush()  # output that fit in the pipe's buffer meets a closed pipe only here
    except BrokenPipeError:  # `jgpt ... | head` stopped reading: end quietly, as a SIGPIPE death would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail too
        return 128 + signal.SIGPIPE


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(_help())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"jgpt {command_line.version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(USAGE + f"jgpt: error: unknown command {name!r}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    # The command's module (and jax with it) is imported under the command's signal handlers.
    return run_guarded(f"jgpt {name}", lambda: COMMANDS[name][0]().main(name, rest))


def _accelerator_backend() -> bool:
    """Whether JAX will start on a GPU or TPU, where the huge-page restart buys nothing. Asked before jax
    is imported: the first platform `JAX_PLATFORMS` names, else whether a GPU or TPU plugin is installed
    (a module under JAX's `jax_plugins` namespace, or libtpu)."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip() != "cpu"
    plugins = importlib.util.find_spec("jax_plugins")
    installed = plugins is not None and any(pkgutil.iter_modules(plugins.submodule_search_locations))
    return installed or importlib.util.find_spec("libtpu") is not None


def entry() -> None:
    """The console script: on Linux with XLA's CPU backend, restart once with the malloc tunables of
    `jgpt.runtime.process_settings` (glibc reads them only as a process starts), then run `main` with the persistent
    compilation cache on (`jgpt.runtime.compilation_cache`)."""
    cache = compilation_cache.checked_environment(os.environ)
    unset = process_settings.missing(os.environ.get(process_settings.VARIABLE, ""))
    if process_settings.applies() and unset and not _accelerator_backend():
        environment = {**process_settings.launch_environment(os.environ), **cache}
        os.execve(sys.executable, [sys.executable, "-m", "jgpt.cli.main", *sys.argv[1:]], environment)
    os.environ.update(cache)  # before any command imports jax, which reads them once
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
