"""The wheel is the whole program: built from the tree and installed alone into a fresh venv, jgpt answers
from a directory outside the checkout, lists and verifies the shipped models, and compiles its kernels.

The wheel is built from a copy of the files a clone holds (git's tracked and unignored files, with this
working copy's edits), so nothing an earlier in-tree build left in build/ can stand in for a missing file.
The venv gets the wheel's declared dependencies through pip (its cache makes a repeat cheap) and nothing of
the checkout: no PYTHONPATH, the working directory elsewhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOTS = ("jgpt", "training", "inference", "kvsim", "experiments")
SHIPPED_MODELS = "checkpoints"  # in the wheel as the package jgpt.checkpoints (pyproject.toml's package-dir)
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _clone_files() -> list[str]:
    """The tree's files as a clone of it would hold them, with this working copy's edits."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]  # a deleted file is listed


def _without_the_checkout() -> dict[str, str]:
    """This process's environment less what would put a checkout on the path (PYTHONPATH, an active venv)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _succeeds(command: list[str]) -> None:
    """Run a build or install step without the checkout on its path; its output shown only if it fails."""
    done = subprocess.run(command, env=_without_the_checkout(), capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(command)} ended {done.returncode}:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in _clone_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    _succeeds([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(source)])
    [built] = dist.glob("jgpt-*.whl")
    return built


def test_the_wheel_holds_every_module_kernel_source_header_and_shipped_model(wheel):
    import jax

    with zipfile.ZipFile(wheel) as archive:
        members = {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}
    tracked = [name for name in _clone_files() if name.split("/")[0] in PACKAGE_ROOTS]
    assert [name for name in tracked if name not in members] == []

    sources = [name for name in tracked if name.endswith(".cc")]
    assert sources, "the kernels' C++ sources moved out of the package roots"
    ffi_headers = Path(jax.ffi.include_dir())
    for source in sources:
        directory = Path(source).parent
        for include in QUOTED_INCLUDE.findall((ROOT / source).read_text()):
            # A quoted include is one of jgpt's headers beside the source, or one of the FFI headers jaxlib ships.
            shipped = (directory / include).as_posix() in members
            assert shipped or (ffi_headers / include).is_file(), f"{source} includes {include}, not in the wheel"
        # The kernel cache keys a build by every header beside its source, so each must be there.
        beside = {name for name in tracked if name.endswith(".h") and Path(name).parent == directory}
        assert beside <= set(members), f"headers beside {source} missing from the wheel"

    models = sorted(name for name in _clone_files() if name.startswith(f"{SHIPPED_MODELS}/"))
    assert {
        "checkpoints/catalog.json",
        "checkpoints/chat/manifest.json",
        "checkpoints/chat-draft/manifest.json",
    } <= set(models)
    for name in models:
        packaged = "jgpt/" + name
        assert packaged in members, f"{name} is not in the wheel as {packaged}"
        assert hashlib.sha256(members[packaged]).digest() == hashlib.sha256((ROOT / name).read_bytes()).digest()


@dataclasses.dataclass(frozen=True)
class Installed:
    """A venv holding the wheel and its dependencies, and how to run it from outside the checkout."""

    venv: Path
    environment: dict[str, str]
    elsewhere: Path

    @property
    def site(self) -> Path:
        return self.venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"

    def run(self, *argv: str, **environment: str) -> str:
        """The stdout of a venv's program (`jgpt`, `python`) run in `elsewhere`; it must succeed."""
        done = subprocess.run(
            [str(self.venv / "bin" / argv[0]), *argv[1:]],
            cwd=self.elsewhere,
            env={**self.environment, **environment},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"{' '.join(argv)} ended {done.returncode}:\n{done.stderr}"
        return done.stdout


def test_the_installed_wheel_works_outside_the_checkout(wheel, tmp_path_factory):
    """One test, so that the venv (about a minute of pip, 1 GB) is made once whatever worker runs it."""
    venv = tmp_path_factory.mktemp("venv")
    _succeeds([sys.executable, "-m", "venv", "--clear", str(venv)])
    _succeeds([str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", str(wheel)])
    environment = {**_without_the_checkout(), "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("cache"))}
    installed = Installed(venv, environment, tmp_path_factory.mktemp("elsewhere"))
    try:
        _imports_nothing_of_the_checkout(installed)
        assert installed.run("jgpt", "generate", "reverse abcd") == "dcba\n"
        _lists_and_verifies_the_shipped_models(installed)
        if not (shutil.which(os.environ.get("CXX", "g++")) and shutil.which("gcc")):
            pytest.skip("the kernel builds need a C and a C++ compiler (the checks before them passed)")
        _compiles_every_kernel_from_the_installed_files(installed, tmp_path_factory.mktemp("kernels"))
    finally:
        shutil.rmtree(venv)  # pytest keeps its last three temporary trees


def _imports_nothing_of_the_checkout(installed: Installed) -> None:
    assert not installed.elsewhere.resolve().is_relative_to(ROOT)
    script = "import json, sys, jgpt.artifacts.catalog as c; print(json.dumps([c.__file__, str(c.DEFAULT_CATALOG), sys.path]))"
    module, catalog, path = json.loads(installed.run("python", "-c", script))
    assert Path(module) == installed.site / "jgpt" / "artifacts" / "catalog.py"
    assert Path(catalog) == installed.site / "jgpt" / "checkpoints" / "catalog.json"
    assert [entry for entry in path if (installed.elsewhere / entry).resolve().is_relative_to(ROOT)] == []


def _lists_and_verifies_the_shipped_models(installed: Installed) -> None:
    heading, _, *rows = installed.run("jgpt", "catalog").splitlines()
    assert heading == f"{installed.site}/jgpt/checkpoints/catalog.json (storage .)"
    assert [row.split()[:2] for row in rows] == [["chat", "default"], ["chat-draft", "99,008"]]  # no role: blank
    listed = json.loads(installed.run("jgpt", "catalog", "--json"))
    assert listed == json.loads((ROOT / SHIPPED_MODELS / "catalog.json").read_text())
    # load_model hashes every asset of each artifact and checks the identities the catalog names.
    script = "from jgpt.artifacts.catalog import load_model\nfor m in ('chat', 'chat-draft'): print(m, load_model(m).checkpoint_sha256)"
    loaded = dict(line.split() for line in installed.run("python", "-c", script).splitlines())
    assert loaded == {model["id"]: model["weights"]["sha256"] for model in listed["models"]}


def _compiles_every_kernel_from_the_installed_files(installed: Installed, cache: Path) -> None:
    script = (
        "import json\n"
        "from pathlib import Path\n"
        "import jgpt\n"
        "from jgpt.kernels import kernel_cache\n"
        "sources = sorted(Path(jgpt.__file__).parent.rglob('*.cc'))\n"
        "for source in sources:\n"
        "    kernel_cache.load(source)\n"
        "print(json.dumps([str(s) for s in sources]))\n"
    )
    # An empty cache: every library in it afterwards was compiled by this call, from the installed files.
    sources = [Path(s) for s in json.loads(installed.run("python", "-c", script, XDG_CACHE_HOME=str(cache)))]
    assert all(source.is_relative_to(installed.site / "jgpt") for source in sources)
    in_tree = [name for name in _clone_files() if name.endswith(".cc") and name.split("/")[0] in PACKAGE_ROOTS]
    assert sorted(source.name for source in sources) == sorted(Path(name).name for name in in_tree)
    libraries = sorted(library.name for library in (cache / "jgpt" / "kernels").glob("*.so"))
    assert [name.rsplit("-", 1)[0] for name in libraries] == sorted(source.stem for source in sources)
