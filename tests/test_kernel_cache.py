"""The kernel and compilation caches trust only what this user's own jgpt wrote (jgpt.kernels.kernel_cache,
jgpt.runtime.cache_directory, jgpt.runtime.compilation_cache).

How a library is planted: a tiny C file whose `__attribute__((constructor))` writes a marker file (the path in
$JGPT_PLANT_MARKER) is compiled once, and copied under the exact name the cache would load
(`kernel_cache.build_of(source).name` in `$XDG_CACHE_HOME/jgpt/kernels`), chowned to uid 65534 as an attacker's
file would be. A load that ran its code leaves the marker; the planted `jgpt_cache_probe` returns 666 where the
genuine one returns 42.

Most cases load a tiny kernel of our own (`probe.cc`) built by a fake compiler that copies a library compiled
once per session, so a case costs milliseconds; the real compiler runs for the session's genuine library and for
the real kernel (`blas_matvec.cc`), in subprocesses, where a wrong load would end in a bus error. Ownership
states need root (tests run as root here); they are skipped elsewhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from jgpt.cli import main as cli
from jgpt.kernels import blas_matvec, kernel_cache
from jgpt.runtime import cache_directory, compilation_cache
from tests.hostile import FUZZ

REPO = Path(__file__).resolve().parent.parent
OTHER = 65534  # nobody: the uid of a file another user planted
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="planting a file owned by another uid needs root")


def _require_compilers() -> None:
    if not (shutil.which(os.environ.get("CXX", "g++")) and shutil.which("gcc")):
        pytest.skip("needs a C and a C++ compiler")


PROBE = 'extern "C" int jgpt_cache_probe() { return 42; }\n'
PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *marker = getenv("JGPT_PLANT_MARKER");
    FILE *file = marker ? fopen(marker, "w") : NULL;
    if (file) { fputs("the planted library ran\n", file); fclose(file); }
}
int jgpt_cache_probe(void) { return 666; }
int jgpt_matvec_supported(void) { return 1; }
"""
FAKE_COMPILER = """#!/bin/sh
# A compiler that copies the genuine library to its -o argument and counts its builds.
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
echo built >> {log}
cp {genuine} "$out"
"""


@dataclasses.dataclass(frozen=True)
class Kit:
    root: Path
    source: Path
    genuine: bytes = dataclasses.field(repr=False)
    planted: bytes = dataclasses.field(repr=False)
    compiler: Path
    log: Path


@pytest.fixture(scope="session")
def kit(tmp_path_factory):
    """The tiny kernel's source, its genuine library (built once by the real compiler, through the cache),
    the planted library and a fake compiler copying the genuine one."""
    _require_compilers()
    root = tmp_path_factory.mktemp("kit")
    source = root / "source" / "probe.cc"
    source.parent.mkdir()
    source.write_text(PROBE)
    with mock.patch.dict(os.environ, {"XDG_CACHE_HOME": str(root / "real-home")}):
        kernel_cache.load(source)
        genuine = (kernel_cache.cache_path() / kernel_cache.build_of(source).name).read_bytes()
    (root / "genuine.so").write_bytes(genuine)
    (root / "planted.c").write_text(PLANTED)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", root / "planted.so", root / "planted.c"], check=True)
    compiler = root / "fake-cxx"
    compiler.write_text(FAKE_COMPILER.format(log=root / "builds.log", genuine=root / "genuine.so"))
    compiler.chmod(0o755)
    return Kit(root, source, genuine, (root / "planted.so").read_bytes(), compiler, root / "builds.log")


@pytest.fixture
def fake(kit, monkeypatch, tmp_path, capsys):
    """Each call: a fresh cache home, the fake compiler, the planted marker armed; returns (home, name, builds)."""
    counter = itertools.count()

    def fresh():
        home = tmp_path / f"case{next(counter)}"
        home.mkdir()
        monkeypatch.setenv("XDG_CACHE_HOME", str(home))
        monkeypatch.setenv("CXX", str(kit.compiler))
        monkeypatch.setenv("JGPT_PLANT_MARKER", str(home / "marker"))
        kit.log.unlink(missing_ok=True)
        cache_directory.warn_once.cache_clear()
        capsys.readouterr()
        return home, kernel_cache.build_of(kit.source).name

    return fresh


def builds(kit) -> int:
    return len(kit.log.read_text().splitlines()) if kit.log.exists() else 0


def warnings_of(capsys) -> list[str]:
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith("jgpt: warning: ") for line in lines), lines
    return lines


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_published(kernels: Path, name: str, genuine: bytes) -> None:
    library, record = kernels / name, kernels / f"{name}.sha256"
    assert library.read_bytes() == genuine
    assert record.read_bytes() == f"{sha(genuine)}  {name}\n".encode()
    assert stat.S_IMODE(library.stat().st_mode) == 0o700 and stat.S_IMODE(record.stat().st_mode) == 0o600
    assert not [p for p in kernels.iterdir() if p.name.endswith(".tmp")]


# -- the real compiler -----------------------------------------------------------------------------


def test_a_kernel_is_compiled_once_published_with_its_record_and_then_loaded_from_the_cache(kit, monkeypatch):
    home = kit.root / "real-home"  # the session fixture compiled it there with g++
    kernels, name = home / "jgpt" / "kernels", kernel_cache.build_of(kit.source).name
    assert stat.S_IMODE((home / "jgpt").stat().st_mode) == stat.S_IMODE(kernels.stat().st_mode) == 0o700
    assert_published(kernels, name, kit.genuine)
    before = (kernels / name).stat().st_ino
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    with mock.patch.object(kernel_cache.subprocess, "run", side_effect=AssertionError("compiled again")):
        assert kernel_cache.load(kit.source).jgpt_cache_probe() == 42
    assert (kernels / name).stat().st_ino == before


# The real kernel in a fresh process, whose cache holds what each case planted: it must work (AVX-512F decides
# whether it may run, as in tests/test_blas_matvec.py) and never run the planted code.
REAL_KERNEL = textwrap.dedent("""
    import numpy as np, jax.numpy as jnp
    from jgpt.kernels import blas_matvec
    AVX512 = "avx512f" in open("/proc/cpuinfo").read().split()
    assert blas_matvec.available() == AVX512
    if AVX512:
        x, m = np.arange(1.0, 8.0, dtype=np.float32)[None], np.ones((5, 7), np.float32)
        assert np.allclose(np.asarray(blas_matvec.matvec(jnp.asarray(x), jnp.asarray(m))), x @ m.T)
    print("kernel ok")
""")


@pytest.fixture(scope="session")
def real_cache(tmp_path_factory):
    """A cache home holding the real one-row kernel, compiled once per session."""
    _require_compilers()
    home = tmp_path_factory.mktemp("real-kernel")
    with mock.patch.dict(os.environ, {"XDG_CACHE_HOME": str(home)}):
        kernel_cache.load(blas_matvec.SOURCE)
        return home, kernel_cache.build_of(blas_matvec.SOURCE).name


def _run_real_kernel(home: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "XDG_CACHE_HOME": str(home), "JGPT_PLANT_MARKER": str(home / "marker"),
                   "PYTHONPATH": str(REPO)}  # fmt: skip
    return subprocess.run([sys.executable, "-c", REAL_KERNEL], env=environment, capture_output=True, text=True)


@pytest.mark.parametrize("owner", [pytest.param(OTHER, marks=needs_root), "own"])
def test_a_library_planted_under_the_real_kernels_name_is_refused_and_its_constructor_never_runs(
    kit, real_cache, tmp_path, owner
):
    """The issue's attack: a shared object under the name `jgpt generate` would load. Another user's is refused
    with one warning line; one of this user's own without a record is rebuilt silently. Either way the kernel
    works (rebuilt) and the constructor never ran."""
    session_home, name = real_cache
    home = tmp_path / "home"
    shutil.copytree(session_home, home)
    library = home / "jgpt" / "kernels" / name
    genuine = library.read_bytes()
    library.write_bytes(kit.planted)
    (home / "jgpt" / "kernels" / f"{name}.sha256").unlink()
    if owner == OTHER:
        os.chown(library, OTHER, OTHER)
    done = _run_real_kernel(home)
    assert (done.returncode, done.stdout) == (0, "kernel ok\n"), done.stderr
    assert not (home / "marker").exists(), "the planted constructor ran"
    warned = [line for line in done.stderr.splitlines() if line.startswith("jgpt: warning:")]
    if owner == OTHER:
        assert warned == [f"jgpt: warning: kernel cache {library}: owned by uid {OTHER}, not by this user (uid 0); "
                          "not loaded, rebuilt"]  # fmt: skip
    else:
        assert warned == []
    assert_published(library.parent, name, genuine)


@pytest.mark.parametrize("keep", [4096, "half"])
def test_a_truncated_real_kernel_is_rebuilt_not_loaded(real_cache, tmp_path, keep):
    """A torn write: the library cut short under its record. It used to end every decode with a bus error
    (exit 135); now it is rebuilt and the kernel works."""
    session_home, name = real_cache
    home = tmp_path / "home"
    shutil.copytree(session_home, home)
    library = home / "jgpt" / "kernels" / name
    genuine = library.read_bytes()
    size = len(genuine) // 2 if keep == "half" else keep
    os.truncate(library, size)
    done = _run_real_kernel(home)
    assert (done.returncode, done.stdout) == (0, "kernel ok\n"), done.stderr
    assert "warning" not in done.stderr  # a torn write is rebuilt silently
    assert_published(library.parent, name, genuine)


# -- refusals, with the fake compiler --------------------------------------------------------------


def _plant(kernels: Path, name: str, data: bytes, record: bytes | None) -> None:
    kernels.mkdir(parents=True, exist_ok=True, mode=0o700)
    (kernels / name).write_bytes(data)
    if record is not None:
        (kernels / f"{name}.sha256").write_bytes(record)


def test_a_library_without_its_record_or_with_a_wrong_one_is_rebuilt_silently(kit, fake, capsys):
    for data, record in [
        (kit.planted, None),
        (kit.planted, f"{sha(kit.genuine)}  NAME\n".encode()),
        (kit.genuine[:100], f"{sha(kit.genuine)}  NAME\n".encode()),
        (kit.genuine, b"0" * 64 + b"  NAME\n"),
        (kit.genuine, f"{sha(kit.genuine)}  other.so\n".encode()),
    ]:
        home, name = fake()
        kernels = home / "jgpt" / "kernels"
        _plant(kernels, name, data, None if record is None else record.replace(b"NAME", name.encode()))
        assert kernel_cache.load(kit.source).jgpt_cache_probe() == 42
        assert (builds(kit), warnings_of(capsys), (home / "marker").exists()) == (1, [], False)
        assert_published(kernels, name, kit.genuine)


@needs_root
@pytest.mark.parametrize(
    "what, make, reason",
    [
        ("kernels", lambda d: d.chmod(0o770), "writable by group or others (mode 0770)"),
        ("kernels", lambda d: d.chmod(0o1777), "writable by group or others (mode 1777)"),
        ("kernels", lambda d: os.chown(d, OTHER, OTHER), f"owned by uid {OTHER}, not by this user (uid 0)"),
        ("jgpt", lambda d: d.chmod(0o777), "writable by group or others (mode 0777)"),
        ("jgpt", lambda d: os.chown(d, OTHER, OTHER), f"owned by uid {OTHER}, not by this user (uid 0)"),
    ],
)
def test_a_cache_directory_another_user_can_write_is_refused_with_one_line(kit, fake, capsys, what, make, reason):
    """Refused, one warning line naming the directory and why; the kernel is built in a private temporary
    directory for this process, and nothing in the refused directory is read or written."""
    home, name = fake()
    kernels = home / "jgpt" / "kernels"
    _plant(kernels, name, kit.planted, f"{sha(kit.planted)}  {name}\n".encode())
    for path in (kernels / name, kernels / f"{name}.sha256"):
        os.chown(path, OTHER, OTHER)
    make(home / "jgpt" if what == "jgpt" else kernels)
    before = {p: p.read_bytes() for p in kernels.iterdir()}
    assert kernel_cache.load(kit.source).jgpt_cache_probe() == 42
    refused = home / "jgpt" if what == "jgpt" else kernels
    assert warnings_of(capsys) == [f"jgpt: warning: kernel cache {refused}: {reason}; building probe.cc in a "
                                   "private temporary directory instead"]  # fmt: skip
    assert (builds(kit), (home / "marker").exists()) == (1, False)
    assert {p: p.read_bytes() for p in kernels.iterdir()} == before


def test_a_symlinked_cache_directory_or_library_is_refused(kit, fake, capsys, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    _plant(elsewhere, "x.so", kit.planted, None)
    home, name = fake()
    (home / "jgpt").mkdir(mode=0o700)
    (home / "jgpt" / "kernels").symlink_to(elsewhere)
    assert kernel_cache.load(kit.source).jgpt_cache_probe() == 42
    [line] = warnings_of(capsys)
    assert "kernels: a symbolic link, not a directory of its own; building probe.cc in a private" in line
    home, name = fake()
    kernels = home / "jgpt" / "kernels"
    _plant(kernels, "unused", b"", None)
    (kernels / name).symlink_to(elsewhere / "x.so")
    (kernels / f"{name}.sha256").write_text(f"{sha(kit.planted)}  {name}\n")
    assert kernel_cache.load(kit.source).jgpt_cache_probe() == 42
    assert warnings_of(capsys) == [f"jgpt: warning: kernel cache {kernels / name}: a symbolic link; not loaded, "
                                   "rebuilt"]  # fmt: skip
    assert not (home / "marker").exists()
    assert_published(kernels, name, kit.genuine)


def test_an_unusable_cache_home_builds_privately(kit, fake, capsys):
    home, name = fake()
    (home / "jgpt").write_text("a file where the directory goes")
    assert kernel_cache.load(kit.source).jgpt_cache_probe() == 42
    [line] = warnings_of(capsys)
    assert line.startswith(f"jgpt: warning: kernel cache {home / 'jgpt'}: Not a directory; building probe.cc")


# -- the fuzz over cache states ---------------------------------------------------------------------

TRUSTED_DIRECTORY_MODES = (0o700, 0o755, 0o750, 0o711)
OPEN_DIRECTORY_MODES = (0o770, 0o777, 0o775, 0o1777, 0o720, 0o702)
TRUSTED_FILE_MODES = (0o600, 0o700, 0o644, 0o755, 0o400)
OPEN_FILE_MODES = (0o664, 0o666, 0o620, 0o602, 0o777)


@st.composite
def cache_states(draw):
    """One state of a kernel cache. A planted library is always another uid's: no other user can make a
    file of ours (the bytes of this user's own files are what the cache trusts)."""
    # Weighted towards this user's own, well-formed state, so that every outcome is drawn often.
    own = st.sampled_from(["own"] * 3 + ["other"])
    trusted_or_open = lambda trusted, open_: st.sampled_from(trusted * 2 + open_)
    file = draw(st.sampled_from(["genuine"] * 4 + ["absent", "truncated", "corrupt", "planted"]))
    return {
        "directory": draw(st.sampled_from(["own"] * 7 + ["open", "other", "link", "open parent", "other parent"])),
        "directory_mode": draw(st.sampled_from(TRUSTED_DIRECTORY_MODES)),
        "open_mode": draw(st.sampled_from(OPEN_DIRECTORY_MODES)),
        "file": file,
        "cut": draw(st.floats(0, 1, exclude_max=True)),
        "file_owner": "other" if file == "planted" else draw(own),
        "file_mode": draw(trusted_or_open(TRUSTED_FILE_MODES, OPEN_FILE_MODES)),
        "file_link": draw(st.integers(0, 4)) == 0,
        "record": draw(st.sampled_from(["genuine"] * 4 + ["absent", "wrong", "planted", "garbage", "truncated"])),
        "record_owner": draw(own),
        "record_mode": draw(trusted_or_open(TRUSTED_FILE_MODES, OPEN_FILE_MODES)),
        "record_link": draw(st.integers(0, 4)) == 0,
    } | (PRISTINE if draw(st.integers(0, 3)) == 0 else {})  # a quarter: the files as jgpt wrote them


PRISTINE = {"file": "genuine", "file_owner": "own", "file_mode": 0o700, "file_link": False,
            "record": "genuine", "record_owner": "own", "record_mode": 0o600, "record_link": False}  # fmt: skip


def _arrange(state, kit, home: Path, name: str) -> Path:
    """Make `state` under `home`; the kernels directory as the cache will look it up."""
    jgpt = home / "jgpt"
    jgpt.mkdir(mode=0o700)
    kernels = jgpt / "kernels"
    real = home / "linked-kernels" if state["directory"] == "link" else kernels
    real.mkdir(mode=0o700)
    genuine = kit.genuine
    content = {
        "genuine": genuine, "planted": kit.planted, "truncated": genuine[: int(state["cut"] * len(genuine))],
        "corrupt": bytes(b ^ (255 if i == int(state["cut"] * len(genuine)) else 0) for i, b in enumerate(genuine)),
    }.get(state["file"])  # fmt: skip
    record = {
        "genuine": f"{sha(genuine)}  {name}\n".encode(), "wrong": f"{'ab' * 32}  {name}\n".encode(),
        "planted": f"{sha(kit.planted)}  {name}\n".encode(), "garbage": b"\x00\xff not a record",
        "truncated": f"{sha(genuine)}  {name}\n".encode()[:40],
    }.get(state["record"])  # fmt: skip
    for file_name, data, prefix in ((name, content, "file"), (f"{name}.sha256", record, "record")):
        if data is None:
            continue
        target = home / f"outside-{file_name}" if state[f"{prefix}_link"] else real / file_name
        target.write_bytes(data)
        target.chmod(state[f"{prefix}_mode"])
        if state[f"{prefix}_owner"] == "other":
            os.chown(target, OTHER, OTHER)
        if state[f"{prefix}_link"]:
            (real / file_name).symlink_to(target)
    if state["directory"] == "link":
        kernels.symlink_to(real)
    mode = state["open_mode"] if state["directory"] == "open" else state["directory_mode"]
    real.chmod(mode)
    if state["directory"] == "other":
        os.chown(real, OTHER, OTHER)
    if state["directory"] == "open parent":
        jgpt.chmod(state["open_mode"])
    if state["directory"] == "other parent":
        os.chown(jgpt, OTHER, OTHER)
    return kernels


def _expected(state, kit) -> tuple[str, bool]:
    """('cached' | 'rebuilt' | 'private', whether one warning line is due) for `state`."""
    if state["directory"] != "own":
        return "private", True

    def own(prefix: str) -> bool:
        return not state[f"{prefix}_link"] and state[f"{prefix}_owner"] == "own" and not state[f"{prefix}_mode"] & 0o22

    if state["file"] == "absent":
        return "rebuilt", False
    if not own("file"):
        return "rebuilt", True
    if state["record"] == "absent":
        return "rebuilt", False
    if not own("record"):
        return "rebuilt", True
    matches = state["file"] == "genuine" and state["record"] == "genuine"
    return ("cached" if matches else "rebuilt"), False


@needs_root
@FUZZ
@given(state=cache_states())
def test_kernel_cache_fuzz_loads_only_a_verified_library_of_this_users_own(kit, fake, capsys, state):
    """Every state: the kernel works, the planted code never runs, and the outcome is the one the trust model
    gives: the cached library loaded without a build only where everything is this user's own and verified;
    else rebuilt into the cache (a trusted directory) or privately (one warning line, the cache untouched)."""
    home, name = fake()
    kernels = _arrange(state, kit, home, name)
    listing = lambda: {str(p): (p.lstat().st_mode, p.read_bytes() if p.is_file() else None) for p in home.rglob("*")}
    before = listing()
    outcome, warned = _expected(state, kit)
    event(outcome)
    assert kernel_cache.load(kit.source).jgpt_cache_probe() == 42
    assert not (home / "marker").exists(), "the planted constructor ran"
    lines = warnings_of(capsys)
    assert len(lines) == int(warned), (state, lines)
    assert builds(kit) == (0 if outcome == "cached" else 1), state
    if outcome != "rebuilt":
        assert listing() == before, "a refused cache was written, or a verified one changed"
    else:
        assert_published(kernels, name, kit.genuine)


# -- JAX's persistent compilation cache ----------------------------------------------------------------


def _checked(home: Path, capsys, **more) -> tuple[dict, list[str]]:
    cache_directory.warn_once.cache_clear()
    capsys.readouterr()
    variables = compilation_cache.checked_environment({"HOME": str(home / "user"), "XDG_CACHE_HOME": str(home),
                                                       **more})  # fmt: skip
    return variables, warnings_of(capsys)


def test_the_compilation_cache_is_made_private(tmp_path, capsys):
    home = tmp_path / "made" / "here"
    variables, lines = _checked(home, capsys)
    assert (variables["JAX_COMPILATION_CACHE_DIR"], lines) == (str(home / "jgpt" / "xla"), [])
    for directory in (tmp_path / "made", home, home / "jgpt", home / "jgpt" / "xla"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    chosen = tmp_path / "chosen" / "xla"
    variables, lines = _checked(home, capsys, JGPT_CACHE_DIR=str(chosen))
    assert (variables["JAX_COMPILATION_CACHE_DIR"], lines) == (str(chosen), [])
    assert stat.S_IMODE(chosen.stat().st_mode) == stat.S_IMODE(chosen.parent.stat().st_mode) == 0o700
    assert _checked(home, capsys, JAX_COMPILATION_CACHE_DIR="/theirs") == ({}, [])  # JAX's own setting
    assert _checked(home, capsys, JGPT_CACHE_DIR="") == ({}, [])  # off


@needs_root
@pytest.mark.parametrize(
    "make, refused, reason",
    [
        (lambda h: (h / "jgpt" / "xla").chmod(0o775), "jgpt/xla", "writable by group or others (mode 0775)"),
        (lambda h: os.chown(h / "jgpt" / "xla", OTHER, OTHER), "jgpt/xla", "owned by uid 65534, not by this user"),
        (lambda h: (h / "jgpt").chmod(0o777), "jgpt", "writable by group or others (mode 0777)"),
        (lambda h: h.chmod(0o777), ".", "writable by group or others (mode 0777)"),  # a non-sticky home
        (lambda h: os.chown(h, OTHER, OTHER), ".", "owned by uid 65534, neither this user nor root"),
    ],
)
def test_a_compilation_cache_another_user_can_write_or_swap_is_refused(tmp_path, capsys, make, refused, reason):
    home = tmp_path / "home"
    (home / "jgpt" / "xla").mkdir(parents=True, mode=0o700)
    home.chmod(0o700)
    make(home)
    variables, lines = _checked(home, capsys)
    assert variables == {}
    [line] = lines
    assert line.startswith(f"jgpt: warning: compilation cache {os.path.normpath(home / refused)}: {reason}"), line
    assert line.endswith("; running without the persistent compilation cache")


@needs_root
def test_the_command_runs_without_a_refused_compilation_cache(monkeypatch, tmp_path, capsys):
    """`jgpt.cli.main.entry` passes JAX no cache directory when the check refuses it."""
    execve = mock.Mock(side_effect=SystemExit(0))
    monkeypatch.setattr(cli.os, "execve", execve)
    monkeypatch.setattr(cli.sys, "platform", "linux")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("JGPT_CACHE_DIR", str(tmp_path / "xla"))
    monkeypatch.setattr(cli.sys, "argv", ["jgpt", "generate", "hi"])
    (tmp_path / "xla").mkdir(mode=0o777)
    (tmp_path / "xla").chmod(0o777)
    cache_directory.warn_once.cache_clear()
    with pytest.raises(SystemExit):
        cli.entry()
    [(_, _, environment)] = [call.args for call in execve.call_args_list]
    assert "JAX_COMPILATION_CACHE_DIR" not in environment
    assert "compilation cache" in capsys.readouterr().err


@st.composite
def compilation_cache_states(draw):
    return {
        name: draw(st.sampled_from(["absent", "own", "open", "sticky", "other", "link", "file"]))
        for name in ("home", "jgpt", "xla")
    } | {"mode": draw(st.sampled_from(TRUSTED_DIRECTORY_MODES)), "open": draw(st.sampled_from(OPEN_DIRECTORY_MODES))}


def _make_directory(path: Path, kind: str, state) -> None:
    if kind == "absent":
        return
    if kind == "file":
        path.write_text("not a directory")
        return
    if kind == "link":
        path.with_name(path.name + "-target").mkdir(mode=0o700)
        path.symlink_to(path.with_name(path.name + "-target"))
        return
    path.mkdir(mode=0o700)
    path.chmod({"open": state["open"] & ~0o1000, "sticky": state["open"] | 0o1000}.get(kind, state["mode"]))
    if kind == "other":
        os.chown(path, OTHER, OTHER)


@needs_root
@FUZZ
@given(state=compilation_cache_states())
def test_compilation_cache_fuzz_uses_only_a_directory_of_this_users_own(tmp_path_factory, capsys, state):
    """The cache home (`XDG_CACHE_HOME`, the user's choice, which may be a link), jgpt/ and jgpt/xla in every
    combination of absent, this user's, writable by others (with or without the sticky bit), another user's,
    a link, a file: used exactly when no other user can write it or swap it, else {} and one warning line."""
    root = tmp_path_factory.mktemp("xla")
    home = root / "home"
    kinds = {}
    for name, path in (("home", home), ("jgpt", home / "jgpt"), ("xla", home / "jgpt" / "xla")):
        kinds[name] = state[name] if path.parent.is_dir() else "absent"  # nothing is made inside a file
        _make_directory(path, kinds[name], state)
    mine = lambda kind: kind in ("absent", "own")
    # The home is the user's choice (a link is fine) but no one else may rename what is in it.
    usable = kinds["home"] in ("absent", "own", "sticky", "link") and mine(kinds["jgpt"]) and mine(kinds["xla"])
    event("used" if usable else "refused")
    variables, lines = _checked(home, capsys)
    assert (bool(variables), len(lines)) == (usable, int(not usable)), (state, lines)
    if usable:
        xla = Path(variables["JAX_COMPILATION_CACHE_DIR"])
        assert xla.is_dir() and not xla.is_symlink() and xla.stat().st_uid == os.geteuid()
        assert not xla.stat().st_mode & 0o22 and not (xla.parent.stat().st_mode & 0o22)
