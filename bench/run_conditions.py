"""The conditions a bench ran under, the first line every bench script prints.

A figure from a shared 2-core machine means little without them: the CPU and how many of its cores this
process may use, the load average at the start, the commit (with `+dirty` when tracked files differ from it)
and whether the malloc tunables were in force (`jgpt.runtime.process_settings`: glibc takes them only at a process's
start, and a small CPU train step ran up to 2x slower without them; docs/process-settings.md).

Scripts run as `python bench/NAME.py` find this module beside them (`from run_conditions import ...`); the
ones that put the repository first on sys.path instead import `bench.run_conditions`.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from jgpt.runtime import process_settings

REPOSITORY = Path(__file__).resolve().parent.parent


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def run_conditions() -> str:
    """One line: machine, usable CPUs, load average, commit, malloc tunables."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"conditions: {_cpu()}, {usable} of {os.cpu_count()} CPUs usable, load {load}, commit {_commit()}, "
        f"python {platform.python_version()}; {process_settings.describe()}"
    )
