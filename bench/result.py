"""A bench run's result: the conditions it ran under and its figures, one JSON file per run.

Every bench script starts a `BenchRun` before it measures anything, which prints the conditions line (a
figure from a shared 2-core machine means little without them), and ends with `BenchRun.write(figures)`,
which writes `BENCH-YYYYMMDDTHHMMSSZ.json` under `bench/results/` (or the directory `--results` names).
`python bench/results_page.py` presents the latest result of each bench as docs/results.md.

The document, version 1 (`RESULT` describes it; `read_result` checks a file against it, `python
bench/results_page.py --schema` prints its JSON Schema):

    format, version  "jgpt-bench-result", 1
    bench            the benchmark's name ("decode", "kvsim-why-batch"); the page shows the latest of each
    title            what it measures, one line
    date             when it started, UTC: "2026-12-06T21:56:06Z" (a transcription may know only the minute, or
                     only the day)
    command          the exact command line
    commit, dirty    the checkout's commit and whether tracked files differed from it (null: not known)
    machine          cpu, cores, usable_cores, memory_bytes, python, jax, malloc (each null where not known)
    load             the 1-minute load average before and after the run (null where not known)
    transcribed      null for a run; for figures copied from an older log: {"from": FILE, "at_commit": COMMIT}
    note             what a reader must know to read the figures ("" if nothing)
    figures          {table: {row: {column: value}}}: a value is a number, a string, true/false or null; a
                     number's column ends in its unit (UNITS), as `decode_step_ms` or `against_torch_x`
    plots            PNG files beside the result that belong to it

The machine facts come from /proc where there is one; jax's version is read from the installed package,
so a jax-free bench (kvsim) stays jax-free.

Scripts run as `python bench/NAME.py` find this module beside them (`from result import BenchRun`); the ones
that put the repository first on sys.path instead import `bench.result`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import write_atomically
from jgpt.foundation.validation import (
    Boolean,
    Const,
    Either,
    Integer,
    ListOf,
    MapOf,
    Nullable,
    Number,
    Object,
    String,
    Text,
    json_schema,
    member,
)
from jgpt.runtime import process_settings

REPOSITORY = Path(__file__).resolve().parent.parent
RESULTS = REPOSITORY / "bench" / "results"
FORMAT, VERSION = "jgpt-bench-result", 1
# The unit a number's column ends in: `_ms`, `_per_s` (tok_per_s, gb_per_s, gflop_per_s), `_x` (a ratio of
# two times or rates), `_fraction` (0..1), `_percent`, `_count`.
UNITS = ("us", "ms", "s", "bytes", "mb", "gb", "mib", "gib", "per_s", "gflop", "x", "fraction", "percent",
         "count", "nats", "bits_per_byte")  # fmt: skip
SIGNIFICANT_DIGITS = 4  # of a measured float: more would be noise on a shared machine

_NAME = r"^[a-z0-9][a-z0-9-]*$"
_COMMIT = r"^[0-9a-f]{7,40}$"
_DATE = r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?Z)?$"
_COLUMN = r"[a-z][a-z0-9_]*"
_PLOT = r"^[A-Za-z0-9][A-Za-z0-9._-]*\.png$"
_VALUE = Nullable(Either((Number(minimum=None, exact=False), String(), Boolean())))
RESULT = Object(
    required={
        "format": Const(FORMAT),
        "version": Const(VERSION),
        "bench": String(pattern=_NAME, meaning="a name of lower-case letters, digits and '-'"),
        "title": Text(),
        "date": String(pattern=_DATE, meaning="a UTC time as 2026-12-06T21:56:06Z (or 2026-12-06T21:56Z, 2026-12-06)"),
        "command": Text(),
        "commit": Nullable(String(pattern=_COMMIT, meaning="a commit id in hexadecimal")),
        "dirty": Nullable(Boolean()),
        "machine": Object(
            required={
                "cpu": Nullable(Text()),
                "cores": Nullable(Integer(1)),
                "usable_cores": Nullable(Integer(1)),
                "memory_bytes": Nullable(Integer(1)),
                "python": Nullable(Text()),
                "jax": Nullable(Text()),
                "malloc": Nullable(Text()),
            }
        ),
        "load": Object(required={"before": Nullable(Number(exact=False)), "after": Nullable(Number(exact=False))}),
        "transcribed": Nullable(
            Object(required={"from": Text(), "at_commit": String(pattern=_COMMIT, meaning="a commit id")})
        ),
        "note": String(),
        "figures": MapOf(MapOf(MapOf(_VALUE))),
        "plots": ListOf(String(pattern=_PLOT, meaning="a PNG file name beside the result")),
    },
    about="One run of a jgpt benchmark: the conditions it ran under and its figures (bench/result.py).",
)


def schema() -> dict[str, Any]:
    return json_schema(RESULT, "bench-result", "jgpt bench result")


def check_figures(figures: dict, field: str = "figures") -> None:
    """What the schema cannot say: a column is a lower-case name, and a number's column ends in its unit."""
    for table, rows in figures.items():
        for row, columns in rows.items():
            for column, value in columns.items():
                at = member(member(member(field, table), row), column)
                if not re.fullmatch(_COLUMN, column):
                    raise ApiError(at, "a column is a lower-case name of letters, digits and '_'")
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                if numeric and not any(column == unit or column.endswith(f"_{unit}") for unit in UNITS):
                    raise ApiError(at, f"a number's column must end in its unit, one of {', '.join(UNITS)}")


def read_result(path: Path) -> dict:
    """A result file, checked: the description, the figures' units, and its plots beside it."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ApiError(str(path), f"not a readable JSON document: {error}") from None
    document = RESULT.read(document, "")
    check_figures(document["figures"])
    for plot in document["plots"]:
        if not (Path(path).parent / plot).is_file():
            raise ApiError("plots", f"{plot} is not beside {Path(path).name}")
    return document


def add_results_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results", type=Path, default=RESULTS, metavar="DIR", help=f"where the result is written (default {RESULTS})"
    )


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """What a bench knows of its run before it measures: its name, the command, the machine and its load."""

    bench: str
    title: str
    date: str
    command: str
    commit: str | None
    dirty: bool | None
    machine: dict
    load_before: float

    @classmethod
    def start(cls, bench: str, about: str | None) -> BenchRun:
        """The run starting now; prints its conditions line. The title is the first paragraph of `about` (the
        script's docstring, say)."""
        commit, dirty = _commit()
        run = cls(
            bench=bench,
            title=" ".join((about or bench).strip().split("\n\n")[0].split()),
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            command=shlex.join(["python", _script(), *sys.argv[1:]]),
            commit=commit,
            dirty=dirty,
            machine=_machine(),
            load_before=round(os.getloadavg()[0], 2),
        )
        print(run.conditions(), flush=True)
        return run

    def conditions(self) -> str:
        """One line: machine, usable CPUs, load average, commit, malloc tunables."""
        m, commit = self.machine, f"{self.commit}{'+dirty' if self.dirty else ''}" if self.commit else "unknown"
        return (
            f"conditions: {m['cpu']}, {m['usable_cores']} of {m['cores']} CPUs usable, load {self.load_before:.2f}, "
            f"commit {commit}, python {m['python']}, jax {m['jax']}; {m['malloc']}"
        )

    def write(
        self, figures: dict, directory: Path = RESULTS, note: str = "", plots: dict[str, bytes] | None = None
    ) -> Path:
        """Write the result (and each plot beside it, `STEM-NAME`); prints and returns the result's path."""
        directory = Path(directory)
        stem = f"{self.bench}-{self.date.replace('-', '').replace(':', '')}"
        names = {name: f"{stem}-{name}" for name in plots or {}}
        document = {
            "format": FORMAT,
            "version": VERSION,
            "bench": self.bench,
            "title": self.title,
            "date": self.date,
            "command": self.command,
            "commit": self.commit,
            "dirty": self.dirty,
            "machine": self.machine,
            "load": {"before": self.load_before, "after": round(os.getloadavg()[0], 2)},
            "transcribed": None,
            "note": note,
            "figures": _rounded(figures),
            "plots": sorted(names.values()),
        }
        RESULT.read(document, "")
        check_figures(document["figures"])
        for name, data in (plots or {}).items():
            write_atomically(directory / names[name], data)
        path = directory / f"{stem}.json"
        write_atomically(path, (json.dumps(document, indent=1) + "\n").encode())
        print(f"result: {path}", flush=True)
        return path


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, float):  # NaN or an infinity: a figure the run could not measure
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}") if math.isfinite(value) else None
    return value


def _script() -> str:
    script = Path(sys.argv[0]).resolve()
    return str(script.relative_to(REPOSITORY)) if script.is_relative_to(REPOSITORY) else sys.argv[0]


def _machine() -> dict:
    try:
        jax = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        jax = None
    return {
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "python": platform.python_version(),
        "jax": jax,
        "malloc": process_settings.describe(),
    }


def _cpu() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _commit() -> tuple[str | None, bool | None]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True, check=False)
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return None, None
    return commit, bool(git("status", "--porcelain", "--untracked-files=no"))
