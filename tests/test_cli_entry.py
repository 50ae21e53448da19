"""The `jgpt` console script restarts itself once with huge-page mallocs (jgpt.cli.main.entry)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jgpt.cli import main as cli
from jgpt.runtime.compilation_cache import cache_directory, environment


class Restarted(Exception):
    pass


def _capture_execve(monkeypatch) -> list[tuple]:
    calls = []

    def execve(path, argv, environment):
        calls.append((path, argv, environment))
        raise Restarted

    monkeypatch.setattr(cli.os, "execve", execve)
    monkeypatch.setattr(cli.sys, "platform", "linux")
    return calls


def test_entry_restarts_with_the_tunable_added_to_the_users_own(monkeypatch):
    calls = _capture_execve(monkeypatch)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    monkeypatch.setattr(cli.sys, "argv", ["jgpt", "train", "--steps", "3"])
    with pytest.raises(Restarted):
        cli.entry()
    [(path, argv, environment)] = calls
    assert path == sys.executable
    assert argv == [sys.executable, "-m", "jgpt.cli.main", "train", "--steps", "3"]
    assert environment["GLIBC_TUNABLES"] == ("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:"
                                             "glibc.malloc.trim_threshold=0x10000000000")  # fmt: skip


def test_entry_runs_main_directly_once_the_tunable_is_set(monkeypatch, capsys):
    calls = _capture_execve(monkeypatch)
    user = "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=4:glibc.malloc.mmap_max=9:glibc.malloc.trim_threshold=0"
    monkeypatch.setenv("GLIBC_TUNABLES", user)  # the user's choices win
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/nonexistent/user-choice")  # so entry() adds nothing here
    monkeypatch.setattr(cli.sys, "argv", ["jgpt", "--help"])
    with pytest.raises(SystemExit) as exit_:
        cli.entry()
    assert (exit_.value.code, calls) == (0, [])
    assert "commands:" in capsys.readouterr().out


def test_the_installed_script_keeps_exit_codes_across_the_restart():
    script = os.path.join(os.path.dirname(sys.executable), "jgpt")  # installed by `pip install -e .`
    environment = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    ok = subprocess.run([script, "--help"], env=environment, capture_output=True, text=True)
    bad = subprocess.run([script, "no-such-command"], env=environment, capture_output=True, text=True)
    assert (ok.returncode, bad.returncode) == (0, 2)
    assert "commands:" in ok.stdout and "unknown command 'no-such-command'" in bad.stderr


def test_entry_restarts_with_the_compilation_cache_on(monkeypatch, tmp_path):
    calls = _capture_execve(monkeypatch)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("JGPT_CACHE_DIR", str(tmp_path / "xla"))
    monkeypatch.setattr(cli.sys, "argv", ["jgpt", "generate", "hi"])
    with pytest.raises(Restarted):
        cli.entry()
    [(_, _, environment)] = calls
    assert environment["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "xla")
    assert environment["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"


@pytest.mark.parametrize(
    "environ, directory",
    [
        ({"HOME": "/home/u"}, "/home/u/.cache/jgpt/xla"),
        ({"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}, "/c/jgpt/xla"),
        ({"HOME": "/home/u", "XDG_CACHE_HOME": "/c", "JGPT_CACHE_DIR": "/mine"}, "/mine"),
        ({"HOME": "/home/u", "JGPT_CACHE_DIR": ""}, None),  # turned off
    ],
)
def test_compilation_cache_directory(environ, directory):
    assert cache_directory(environ) == (None if directory is None else Path(directory))
    assert environment(environ).get("JAX_COMPILATION_CACHE_DIR") == directory
    assert environment({**environ, "JAX_COMPILATION_CACHE_DIR": "/theirs"}) == {}  # the user's own setting wins
