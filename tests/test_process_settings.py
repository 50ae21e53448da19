"""The malloc tunables (jgpt.runtime.process_settings): glibc takes them only from a process's start, which is what
the `jgpt` command's restart and the `python -m jgpt.runtime.process_settings --` launcher are for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jgpt.runtime import process_settings

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "jgpt"  # installed by `pip install -e .`
ALL = ("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
       "glibc.malloc.trim_threshold=0x10000000000")  # fmt: skip

# glibc's own count of mmap'd blocks around one 64 MiB malloc (above any mmap threshold): 1 by default,
# 0 under glibc.malloc.mmap_max=0, one of the tunables; and whether process_settings says they are in force.
# With "late" the program sets GLIBC_TUNABLES itself, after its start.
PROBE = """
import ctypes, os, sys
from jgpt.runtime import process_settings

class MallocInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = MallocInfo, ctypes.c_void_p
if sys.argv[1:] == ["late"]:
    os.environ.update(process_settings.launch_environment())
before = libc.mallinfo2().hblks
block = libc.malloc(64 << 20)
print(libc.mallinfo2().hblks - before, process_settings.in_force())
libc.free(ctypes.c_void_p(block))
"""


def plain_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != process_settings.VARIABLE} | {"PYTHONPATH": str(REPO)}


def probe(*command: str) -> str:
    done = subprocess.run(command, cwd=REPO, env=plain_environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


pytestmark = pytest.mark.skipif(not process_settings.applies(), reason="glibc reads the tunables; not a glibc process")


def test_glibc_takes_the_tunables_only_from_the_start_of_a_process():
    assert probe(sys.executable, "-c", PROBE) == "1 False"  # importing jgpt sets nothing
    assert probe(sys.executable, "-c", PROBE, "late") == "1 False"  # set from inside: too late for glibc
    launched = probe(sys.executable, "-m", "jgpt.runtime.process_settings", "--", sys.executable, "-c", PROBE)
    assert launched == "0 True"


def test_the_jgpt_command_restarts_into_them_and_a_plain_interpreter_has_none():
    """What the restart in jgpt.cli.main.entry fixes: without it the command's process runs without the tunables."""
    assert probe(str(SCRIPT), "devices").splitlines()[2] == f"malloc tunables: in force (GLIBC_TUNABLES={ALL})"
    assert probe(sys.executable, "-m", "jgpt", "devices").splitlines()[2].startswith("malloc tunables: NOT in force")


@pytest.mark.parametrize(
    "own, value",
    [("", ALL),
     ("glibc.malloc.arena_max=4", "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:"
                                  "glibc.malloc.trim_threshold=0x10000000000"),
     ("glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2:glibc.malloc.mmap_max=9:glibc.malloc.trim_threshold=0",
      "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2:glibc.malloc.mmap_max=9:glibc.malloc.trim_threshold=0")],
)  # fmt: skip
def test_the_users_own_tunables_win(own, value):
    environment = {"HOME": "/h"} | ({process_settings.VARIABLE: own} if own else {})
    assert process_settings.launch_environment(environment) == {"HOME": "/h", process_settings.VARIABLE: value}
    assert process_settings.missing(value) == []


def test_the_launcher_prints_the_value_to_export_and_refuses_other_arguments():
    done = subprocess.run([sys.executable, "-m", "jgpt.runtime.process_settings"], cwd=REPO, env=plain_environment(),
                          capture_output=True, text=True)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, ALL + "\n")
    for argv, code in ((["--"], 2), (["python"], 2), (["--", "/nonexistent/program"], 127)):
        done = subprocess.run([sys.executable, "-m", "jgpt.runtime.process_settings", *argv], cwd=REPO,
                              env=plain_environment(), capture_output=True, text=True)  # fmt: skip
        assert done.returncode == code and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
