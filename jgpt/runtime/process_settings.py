"""Process settings: the glibc malloc tunables XLA's CPU backend runs faster with, and whether they are in force.

XLA on CPU allocates a step's temporaries afresh at every call; glibc maps large blocks in 4 KiB pages,
and faulting them in cost a third of a training step's CPU time. Transparent huge pages cut the faults
many times over, but each step still faulted its blocks in afresh (hundreds of faults a step, some
stalled on compaction), from whichever arena the executing thread had: one arena, no mmap'd blocks and
no trimming keep freed temporaries in the heap for the next step (no faults per step). Their effect on a
train step and a decode, and the commands that measure it, are in docs/process-settings.md.

glibc reads `GLIBC_TUNABLES` once, as the process starts: setting it in `os.environ` afterwards changes
nothing, so a program gets the tunables only from whoever starts it. The ways to start one with them:

* the `jgpt` command restarts itself once with them (`jgpt.cli.main.entry`);
* `python -m jgpt.runtime.process_settings -- COMMAND [ARGS...]` runs any command with them, for example
  `python -m jgpt.runtime.process_settings -- python my_script.py`;
* `export GLIBC_TUNABLES="$(python -m jgpt.runtime.process_settings)"` sets them for a shell's later commands;
* `launch_environment()` is an environment to start a subprocess with.

Each adds a tunable only where the user's own `GLIBC_TUNABLES` does not name it. Importing jax is not
needed here (the command line asks before jax starts).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

MALLOC_TUNABLES = {
    "glibc.malloc.hugetlb": "1",
    "glibc.malloc.arena_max": "1",
    "glibc.malloc.mmap_max": "0",
    "glibc.malloc.trim_threshold": "0x10000000000",
}
VARIABLE = "GLIBC_TUNABLES"


def applies() -> bool:
    """Whether this is a process glibc starts (Linux with glibc), the only kind that reads the tunables."""
    if sys.platform != "linux":
        return False
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (OSError, ValueError):  # musl and other C libraries name no GNU libc version
        return False


def missing(tunables: str) -> list[str]:
    """`name=value` of every malloc tunable a `GLIBC_TUNABLES` value does not name."""
    named = {setting.split("=", 1)[0] for setting in tunables.split(":")}
    return [f"{name}={value}" for name, value in MALLOC_TUNABLES.items() if name not in named]


def tunables_value(environment: Mapping[str, str]) -> str:
    """The `GLIBC_TUNABLES` to start with: the user's own settings first, then the missing malloc tunables."""
    own = environment.get(VARIABLE, "")
    return ":".join(filter(None, (own, *missing(own))))


def launch_environment(environment: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`environment` with the malloc tunables added: the environment to start a process with them."""
    return {**environment, VARIABLE: tunables_value(environment)}


# GLIBC_TUNABLES as this module is first imported, read as near the process's start as Python allows: glibc
# read it before Python began, and a later change to os.environ reaches neither glibc nor this value. (Linux
# shows no unaltered copy: glibc 2.36 cuts the one in /proc/self/environ at the first tunable.)
START_TUNABLES = os.environ.get(VARIABLE, "")


def in_force() -> bool:
    """Whether every malloc tunable was set as this process started (the user's own value of one counts)."""
    return applies() and not missing(START_TUNABLES)


def describe() -> str:
    """One line on the malloc tunables of this process, for a bench or a command to print."""
    if not applies():
        return "malloc tunables: not applicable (not a glibc process)"
    if in_force():
        return f"malloc tunables: in force ({VARIABLE}={START_TUNABLES})"
    return (
        f"malloc tunables: NOT in force (missing {':'.join(missing(START_TUNABLES))}; "
        "start with `python -m jgpt.runtime.process_settings -- python ...`)"
    )


USAGE = "usage: python -m jgpt.runtime.process_settings [-- COMMAND [ARGS...]]"


def main(argv: list[str]) -> int:
    """No arguments: print the GLIBC_TUNABLES value to export. `-- COMMAND ...`: become COMMAND with it."""
    if not argv:
        print(tunables_value(os.environ))
        return 0
    if argv[0] != "--" or len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        os.execvpe(argv[1], argv[1:], launch_environment())
    except OSError as error:
        print(f"jgpt.runtime.process_settings: cannot run {argv[1]!r}: {error.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
