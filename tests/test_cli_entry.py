"""The `jgpt` console script restarts itself once with huge-page mallocs (jgpt.cli.entry)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jgpt import cli


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
    assert argv == [sys.executable, "-m", "jgpt.cli", "train", "--steps", "3"]
    assert environment["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


def test_entry_runs_main_directly_once_the_tunable_is_set(monkeypatch, capsys):
    calls = _capture_execve(monkeypatch)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")  # the user's choice wins
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
