"""Hostile model input and output: `export-hf --force`, `import-hf`'s files, a full disk, an interrupted
replacement, output modes and a config that describes fewer layers than the weights hold.

- `export-hf --force` replaces only its own previous export (the files an export writes and nothing else,
  its model.safetensors carrying the export's mark); never the current directory, a parent of it, $HOME
  or the root. It used to delete any non-empty directory, the current one included, with exit 0.
- `import-hf` reads config.json, the weights and tokenizer.json through `jgpt.foundation.paths.confined`: a link out
  of the model directory, a directory, a FIFO or a dangling link in their place is refused naming the file
  (each used to be followed, or taken for an absent file).
- A full disk (injected at a random byte of an export, a real small tmpfs where mounting is permitted, an
  orbax save that fails) is one line and exit 2, with the staging removed and the previous output intact;
  a training run leaves no orbax temporary checkpoint behind.
- A signal at any point of a replacement leaves the old output or the new one, whole, and nothing aside;
  what a SIGKILL between the two renames leaves is put back by the next run.
- Outputs get the mode the umask gives a new file, and a replaced file keeps its mode.
- Weights the config does not describe (a layer past `n_layer`) are refused naming the first such tensor.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.artifacts.artifact import load_artifact, save_artifact
from jgpt.artifacts.hf_export import EXPORT_FILES, _check_out, is_export
from jgpt.foundation import identity, output_paths
from jgpt.foundation.errors import ApiError
from jgpt.model.architecture import ModelArchitecture
from jgpt.model.weights import initialize
from jgpt.tokenizers.tokenizer import Tokenizer
from tests.hostile import FUZZ, assert_refused, interruptible, run_jgpt
from tests.test_hostile_surfaces import TINY_TRAIN
from tests.test_path_confinement import tiny_gpt2

ARCHITECTURE = ModelArchitecture(vocabulary=260, width=16, ffn=32, context=8, layers=1, heads=2)
NO_SPACE = "No space left on device"
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    weights, provenance = initialize(ARCHITECTURE, seed=0)
    path = tmp_path_factory.mktemp("artifact") / "tiny"
    return save_artifact(path, ARCHITECTURE, weights, provenance, Tokenizer.bytes_only()).path


@pytest.fixture(scope="module")
def exported(artifact, tmp_path_factory) -> Path:
    """A previous export of `artifact` (vocabulary 260, so that jgpt's byte tokenizer.json fits it)."""
    out = tmp_path_factory.mktemp("exported") / "hf"
    assert run_jgpt(["export-hf", artifact, "--out", out])[0] == 0
    return out


def files_under(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` (not following links) with its bytes."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if stat.S_ISREG(path.lstat().st_mode)
    }


# -- export-hf --force replaces only its own previous export -------------------------------------


def test_export_force_onto_a_directory_it_did_not_write_is_refused_and_nothing_is_deleted(artifact, tmp_path):
    out = tmp_path / "mine"
    (out / "notes").mkdir(parents=True)
    (out / "a.txt").write_text("keep")
    (out / "notes" / "b.txt").write_text("keep too")
    before = files_under(tmp_path)
    line = assert_refused(["export-hf", artifact, "--out", out, "--force"], watch=[tmp_path], field="out")
    assert f"out: {out} is not a previous export of jgpt's" in line, line
    assert files_under(tmp_path) == before


def test_export_force_refuses_a_hugging_face_directory_that_jgpt_did_not_export(artifact, tmp_path):
    """The same file names as an export, but no export mark in the safetensors header: a downloaded model."""
    out = tiny_gpt2(tmp_path / "downloaded")
    before = files_under(tmp_path)
    assert_refused(["export-hf", artifact, "--out", out, "--force"], watch=[tmp_path], field="out")
    assert files_under(tmp_path) == before


def test_export_force_replaces_its_own_previous_export_whole(artifact, exported, tmp_path):
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    assert is_export(out)
    code, _, err = run_jgpt(["export-hf", artifact, "--out", out, "--force"])
    assert code == 0, err
    assert files_under(out) == files_under(exported)  # the damaged weights are replaced
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no staging, nothing aside


@pytest.mark.parametrize("where", ["extra file", "subdirectory", "link in place of a file", "no config.json"])
def test_export_force_refuses_a_previous_export_that_holds_anything_else(artifact, exported, tmp_path, where):
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    if where == "extra file":
        (out / "README.md").write_text("mine")
    elif where == "subdirectory":
        (out / "checkpoints").mkdir()
    elif where == "link in place of a file":
        (tmp_path / "elsewhere.json").write_bytes((out / "config.json").read_bytes())
        (out / "config.json").unlink()
        (out / "config.json").symlink_to(tmp_path / "elsewhere.json")
    else:
        (out / "config.json").unlink()
    before = files_under(tmp_path)
    assert_refused(["export-hf", artifact, "--out", out, "--force"], watch=[tmp_path], field="out")
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("spelling", [".", "..", "CWD", "PARENT", "CWD/."])
@pytest.mark.parametrize("force", [True, False])
def test_export_never_replaces_the_current_directory_or_one_holding_it(
    artifact, exported, tmp_path, monkeypatch, spelling, force
):
    """`--out . --force` used to delete the current directory (exit 0); an empty one was replaced even without
    --force. Even a previous export is refused when it is the current directory."""
    cwd = tmp_path / "parent" / "cwd"
    shutil.copytree(exported, cwd)  # a previous export: only the rule about the current directory refuses it
    monkeypatch.chdir(cwd)
    out = spelling.replace("CWD", str(cwd)).replace("PARENT", str(cwd.parent))
    before = files_under(tmp_path)
    line = assert_refused(
        ["export-hf", artifact, "--out", out, *(["--force"] if force else [])], watch=[tmp_path], field="out"
    )
    assert "is the current directory or holds it" in line, line
    assert files_under(tmp_path) == before and Path.cwd() == cwd


def test_export_never_replaces_home_or_the_root(artifact, exported, tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(exported, home)  # even a $HOME that looks like a previous export
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    before = files_under(tmp_path)
    line = assert_refused(["export-hf", artifact, "--out", home, "--force"], watch=[tmp_path], field="out")
    assert f"is {home}" in line, line
    assert files_under(tmp_path) == before
    # The root: the gate alone (it only reads), so that no bug here could ever touch /.
    with pytest.raises(ApiError, match="current directory or holds it|is /"):
        _check_out(Path("/"), True)


# -- import-hf reads its files through the confinement gate --------------------------------------


def hostile_entry(path: Path, kind: str, outside: Path) -> None:
    """Put something hostile at `path` (which may exist) in place of a file."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "a link out of the directory":
        path.symlink_to(outside / "secret.json")
    elif kind == "a link out to a directory":
        path.symlink_to(outside)
    elif kind == "a dangling link":
        path.symlink_to(path.parent / "no-such-file")
    elif kind == "a link loop":
        path.symlink_to(path)
    elif kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a directory":
        path.mkdir()
    else:  # "a directory holding the file"
        path.mkdir()
        (path / "config.json").write_text("{}")


HOSTILE_KINDS = [
    "a link out of the directory",
    "a link out to a directory",
    "a dangling link",
    "a link loop",
    "a FIFO",
    "a directory",
    "a directory holding the file",
]


def sharded(source: Path, directory: Path) -> Path:
    """`source`'s model as save_pretrained writes a large one: two shards and their index."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, directory)
    tensors = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, members in halves.items():
        save_file({name: tensors[name] for name in members}, directory / shard, metadata={"format": "pt"})
    weight_map = {name: shard for shard, members in halves.items() for name in members}
    (directory / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """What a link out of a model directory points at: a file that must never be read."""
    directory = tmp_path_factory.mktemp("outside")
    (directory / "secret.json").write_text(json.dumps({"model_type": "gpt2", "secret": True}))
    return directory


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_import_hf_refuses_a_main_file_that_is_not_a_regular_file_inside_the_directory(
    exported, outside, tmp_path, name, kind
):
    model = tmp_path / "hf"
    shutil.copytree(exported, model)
    hostile_entry(model / name, kind, outside)
    line = assert_refused(
        ["import-hf", model, "--out", tmp_path / "out"], inputs=[outside / "secret.json"], watch=[tmp_path]
    )
    assert f": error: {name}: " in line, line


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
@pytest.mark.parametrize("which", [INDEX, "model-00002-of-00002.safetensors"])
def test_import_hf_refuses_a_hostile_index_or_shard_naming_the_index(exported, outside, tmp_path, which, kind):
    model = sharded(exported, tmp_path / "hf")
    hostile_entry(model / which, kind, outside)
    line = assert_refused(
        ["import-hf", model, "--out", tmp_path / "out"], inputs=[outside / "secret.json"], watch=[tmp_path]
    )
    assert f": error: {INDEX}: " in line, line


def test_import_hf_still_reads_links_that_stay_inside_the_directory(exported, tmp_path):
    model = tmp_path / "hf"
    shutil.copytree(exported, model)
    (model / "real").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (model / name).rename(model / "real" / name)
        (model / name).symlink_to(Path("real") / name)
    assert run_jgpt(["import-hf", model, "--out", tmp_path / "out"])[0] == 0


# -- weights the config does not describe ---------------------------------------------------------


def with_tensors(source: Path, directory: Path, extra: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, directory)
    tensors = load_file(directory / "model.safetensors") | extra
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def test_import_hf_refuses_weights_past_the_layers_config_json_describes(exported, tmp_path):
    """A config.json with n_layer 1 over two layers' weights imported the first layer alone, without a word."""
    from safetensors.numpy import load_file

    layer = {k: v for k, v in load_file(exported / "model.safetensors").items() if k.startswith("transformer.h.0.")}
    second = {k.replace(".h.0.", ".h.1."): v for k, v in layer.items()}
    model = with_tensors(exported, tmp_path / "hf", second)
    line = assert_refused(["import-hf", model, "--out", tmp_path / "out"], watch=[tmp_path])
    assert ": error: safetensors: tensor 'h.1.attn.c_attn.bias' is not part of the model config.json describes" in line


def test_import_hf_accepts_the_buffers_older_transformers_saved_but_not_past_the_last_layer(exported, tmp_path):
    mask = np.tril(np.ones((1, 1, 8, 8), np.float32))
    model = with_tensors(exported, tmp_path / "hf", {"transformer.h.0.attn.bias": mask})
    assert run_jgpt(["import-hf", model, "--out", tmp_path / "out"])[0] == 0
    model = with_tensors(exported, tmp_path / "hf2", {"transformer.h.1.attn.masked_bias": np.zeros(1, np.float32)})
    line = assert_refused(["import-hf", model, "--out", tmp_path / "out2"], watch=[tmp_path])
    assert "'h.1.attn.masked_bias' is not part of the model" in line, line


# -- a full disk ------------------------------------------------------------------------------------


class FillingDisk:
    """`os.fdopen` for `write_atomically` whose streams take `budget` bytes in all, then fail as a full disk
    does (the chunk that overflows is written in part first, as a real disk would)."""

    def __init__(self, budget: int):
        self.left = budget
        self.fdopen = os.fdopen

    def __call__(self, descriptor, *args, **kwargs):
        stream = self.fdopen(descriptor, *args, **kwargs)
        disk = self

        class Filling:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                stream.close()

            def writelines(self, chunks):
                for chunk in chunks:
                    taken = bytes(chunk[: disk.left])
                    stream.write(taken)
                    disk.left -= len(taken)
                    if len(taken) < len(chunk):
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return Filling()


@contextlib.contextmanager
def small_disk(directory: Path, size: int):
    """A tmpfs of `size` bytes mounted at `directory`; the test is skipped where mounting is not permitted
    (it needs root, or CAP_SYS_ADMIN)."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"a small tmpfs cannot be mounted here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield directory
    finally:
        _unmount(directory)


def _unmount(directory: Path) -> None:
    """Unmount, waiting out a moment of "target is busy": a library's worker thread that ended may not have
    closed its file yet when the command has returned (seen once in 200 real imports); detach it at last."""
    for _ in range(20):
        if not os.path.ismount(directory):
            return
        subprocess.run(["umount", str(directory)], capture_output=True)
        time.sleep(0.1)
    while os.path.ismount(directory):  # a mount stacked on another is unmounted one layer at a time
        subprocess.run(["umount", "--lazy", str(directory)], check=True)


def export_bytes(exported: Path) -> int:
    return sum(len(data) for data in files_under(exported).values())


def test_export_on_a_disk_that_fills_keeps_the_previous_export_and_leaves_nothing(
    artifact, exported, tmp_path, monkeypatch
):
    """safetensors' own writer ended in a SafetensorError traceback; every byte now goes through write_atomically."""
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    (out / "config.json").write_text('{"previous": true}')  # still an export, and told apart from the new one
    before = files_under(tmp_path)
    monkeypatch.setattr(identity.os, "fdopen", FillingDisk(export_bytes(exported) // 2))
    line = assert_refused(["export-hf", artifact, "--out", out, "--force"], watch=[tmp_path])
    assert line.endswith(f": error: out: cannot write {out}: {NO_SPACE}"), line
    assert files_under(tmp_path) == before


def test_export_and_import_on_a_real_full_disk_end_in_one_line(artifact, exported, tmp_path):
    for size in (16 << 10, 40 << 10):
        with small_disk(tmp_path / "disk", size) as disk:
            for command in (["export-hf", artifact], ["import-hf", exported]):
                line = assert_refused([*command, "--out", disk / "out"], watch=[disk])
                assert line.endswith(f": error: out: cannot write {disk / 'out'}: {NO_SPACE}"), line


@pytest.mark.parametrize("fails", ["weights", "tokenizer.json", "manifest.json"])
def test_import_on_a_disk_that_fills_keeps_the_previous_artifact(exported, tmp_path, monkeypatch, fails):
    """orbax's error (a ValueError carrying os_error_code 28, with tracebacks logged by its threads) or a
    failed tokenizer or manifest write: one line, the staging removed, the artifact --overwrite would
    replace untouched."""
    from jgpt.artifacts import artifact as artifacts

    out = tmp_path / "artifact"
    assert run_jgpt(["import-hf", exported, "--out", out])[0] == 0
    before = files_under(tmp_path)
    if fails == "weights":

        def fails_half_way(directory, weights):
            (directory / "ocdbt.process_0").mkdir(parents=True)
            (directory / "ocdbt.process_0" / "manifest.ocdbt").write_bytes(b"half")
            message = "RESOURCE_EXHAUSTED: Error writing local file: No space left on device [os_error_code='28']"
            raise ValueError(message)

        monkeypatch.setattr(artifacts, "_save_weights", fails_half_way)
    else:
        budget = 0 if fails == "tokenizer.json" else len((exported / "tokenizer.json").read_bytes())
        monkeypatch.setattr(identity.os, "fdopen", FillingDisk(budget))
    line = assert_refused(["import-hf", exported, "--out", out, "--overwrite"], watch=[tmp_path])
    assert line.endswith(f": error: out: cannot write {out}: {NO_SPACE}"), line
    assert files_under(tmp_path) == before


def test_training_on_a_disk_that_fills_leaves_no_temporary_checkpoint(tmp_path, monkeypatch):
    """orbax's save failed in a traceback and left `N.orbax-checkpoint-tmp` behind."""
    import orbax.checkpoint as ocp

    def fails_half_way(manager, step, *args, **kwargs):
        unfinished = Path(manager.directory) / f"{step}.orbax-checkpoint-tmp" / "state.orbax-checkpoint-tmp"
        unfinished.mkdir(parents=True)
        (unfinished / "_sharding").write_bytes(b"half")
        raise ValueError(
            "RESOURCE_EXHAUSTED: Failed to write 10293 bytes: No space left on device [os_error_code='28']"
        )

    monkeypatch.setattr(ocp.CheckpointManager, "save", fails_half_way)
    out = tmp_path / "run"
    code, _, err = run_jgpt([*TINY_TRAIN, "--out", out])
    assert code == 2 and err == f"jgpt train: error: out: cannot write checkpoint {out}/checkpoints/1: {NO_SPACE}\n"
    assert not list((out / "checkpoints").iterdir())


def test_training_on_a_real_full_disk_ends_in_one_line_and_leaves_no_temporary_checkpoint(tmp_path):
    with small_disk(tmp_path / "disk", 64 << 10) as disk:
        code, _, err = run_jgpt([*TINY_TRAIN, "--out", disk / "run"])
        assert (
            code == 2
            and err == f"jgpt train: error: out: cannot write checkpoint {disk}/run/checkpoints/1: {NO_SPACE}\n"
        )
        assert not [p for p in disk.rglob("*") if "orbax-checkpoint-tmp" in p.name]


def test_a_metrics_line_the_disk_refuses_is_taken_back(tmp_path, monkeypatch):
    """A resumed run reads every line of metrics.jsonl: a half-written one would be refused there."""
    from training import metrics

    path = tmp_path / "metrics.jsonl"
    metrics.append(path, {"step": 1})

    class NearlyFull(io.FileIO):
        """Takes three bytes of the first write, then refuses."""

        def write(self, data):
            if self.tell() == len(b'{"step": 1}\n'):
                return super().write(bytes(data)[:3])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "open", lambda self, mode, buffering=-1: NearlyFull(self, mode.replace("b", "")))
    with pytest.raises(OSError, match=NO_SPACE):
        metrics.append(path, {"step": 2})
    monkeypatch.undo()
    assert path.read_bytes() == b'{"step": 1}\n'


# -- a signal while a directory is replaced ---------------------------------------------------------


@contextlib.contextmanager
def interrupted_at(target: Path, point: str, signum: int):
    """Send `signum` to this process at `point` of the replacement of `target`: at the first or second rename
    beside it (`rename 1`, `rename 2`), before or after it runs, or at the removal of the old directory."""
    renames = []
    real_rename, real_rmtree = Path.rename, shutil.rmtree

    def rename(self, destination):
        if Path(self).parent == target.parent:
            renames.append(self)
            if point == f"before rename {len(renames)}":
                signal.raise_signal(signum)
            moved = real_rename(self, destination)
            if point == f"after rename {len(renames)}":
                signal.raise_signal(signum)
            return moved
        return real_rename(self, destination)

    def rmtree(path, *args, **kwargs):
        if point == "removing the old one" and Path(path).name.endswith(".replaced"):
            signal.raise_signal(signum)
        return real_rmtree(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, interruptible():
        patch.setattr(Path, "rename", rename)
        patch.setattr(output_paths.shutil, "rmtree", rmtree)
        yield


REPLACEMENT_POINTS = ["before rename 1", "after rename 1", "before rename 2", "after rename 2", "removing the old one"]
STOPPED = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("point", REPLACEMENT_POINTS)
def test_a_signal_during_export_force_leaves_one_whole_export_and_nothing_aside(
    artifact, exported, tmp_path, point, signum
):
    """The signal is held until the two renames and the removal are done, then ends the command."""
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    (out / "config.json").write_text('{"previous": true}')
    with interrupted_at(out, point, signum):
        code, _, err = run_jgpt(["export-hf", artifact, "--out", out, "--force"])
    assert (code, err) == (STOPPED[signum][0], f"jgpt export-hf: {STOPPED[signum][1]}\n")
    assert files_under(out) == files_under(exported)  # the new export, whole
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


@pytest.mark.parametrize("point", REPLACEMENT_POINTS)
def test_a_signal_during_import_overwrite_leaves_one_whole_artifact_and_nothing_aside(exported, tmp_path, point):
    """SIGINT during `import-hf --overwrite` used to leave a hidden `.OUT.*.replaced` directory."""
    out = tmp_path / "artifact"
    assert run_jgpt(["import-hf", exported, "--out", out])[0] == 0
    previous = load_artifact(out).manifest_sha256
    with interrupted_at(out, point, signal.SIGINT):
        code, _, err = run_jgpt(["import-hf", exported, "--out", out, "--overwrite"])
    assert (code, err) == (130, "jgpt import-hf: interrupted\n")
    assert load_artifact(out).manifest_sha256 != previous  # the new one (its provenance names another time)
    assert [p.name for p in tmp_path.iterdir()] == ["artifact"]


def test_a_signal_while_the_export_is_staged_keeps_the_previous_one(artifact, exported, tmp_path, monkeypatch):
    from jgpt.artifacts import hf_export

    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    (out / "config.json").write_text('{"previous": true}')
    before = files_under(tmp_path)
    real = hf_export.write_atomically

    def interrupted(path, data):
        if path.name == "config.json":
            signal.raise_signal(signal.SIGINT)
        real(path, data)

    monkeypatch.setattr(hf_export, "write_atomically", interrupted)
    with interruptible():
        code, _, err = run_jgpt(["export-hf", artifact, "--out", out, "--force"])
    assert (code, err) == (130, "jgpt export-hf: interrupted\n")
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("fails", ["rename 2", "removing the old one"])
def test_an_error_inside_the_replacement_leaves_one_whole_export_and_the_next_run_clears_the_rest(
    artifact, exported, tmp_path, monkeypatch, fails
):
    """An exception (not a signal, which is held) from the second rename puts the old export back; one from the
    removal of the old export leaves it aside, and the next run removes it."""
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    (out / "config.json").write_text('{"previous": true}')
    previous = files_under(out)
    real_rename, renames = Path.rename, []

    def rename(self, destination):
        renames.append(self)
        if fails == "rename 2" and Path(self).parent == tmp_path and len(renames) == 2:
            raise KeyboardInterrupt
        return real_rename(self, destination)

    def rmtree(path, ignore_errors=False):
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "rename", rename)
        if fails != "rename 2":
            patch.setattr(output_paths.shutil, "rmtree", rmtree)
        code, _, err = run_jgpt(["export-hf", artifact, "--out", out, "--force"])
    assert (code, err) == (130, "jgpt export-hf: interrupted\n")
    assert files_under(out) == (previous if fails == "rename 2" else files_under(exported))
    assert run_jgpt(["export-hf", artifact, "--out", out, "--force"])[0] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def killed_between_the_renames(target: Path) -> Path:
    """What a SIGKILL between the two renames leaves: the old directory aside, the new one staged, no target."""
    aside = target.with_name(f".{target.name}.k1ll3d_x.replaced")
    target.rename(aside)
    staging = target.with_name(f".{target.name}.k1ll3d_x")
    staging.mkdir()
    (staging / "config.json").write_text("{}")
    return aside


def test_the_next_export_puts_back_what_a_kill_between_the_renames_moved_aside(artifact, exported, tmp_path):
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    killed_between_the_renames(out)
    line = assert_refused(["export-hf", artifact, "--out", out], field="out")  # no --force: refused, yet put back
    assert "is not empty" in line, line
    assert files_under(out) == files_under(exported)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hf.k1ll3d_x", "hf"]  # the half-written staging stays


def test_the_next_import_puts_back_the_artifact_a_kill_moved_aside_and_removes_older_ones(exported, tmp_path):
    out = tmp_path / "artifact"
    assert run_jgpt(["import-hf", exported, "--out", out])[0] == 0
    shutil.copytree(out, tmp_path / ".artifact.older___.replaced")
    aside = killed_between_the_renames(out)
    os.utime(tmp_path / ".artifact.older___.replaced", (1, 1))  # the older of the two
    foreign = tmp_path / ".artifact.mine____.replaced"  # a name like an aside, but not an artifact: left alone
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    expected = load_artifact(aside).manifest_sha256
    assert run_jgpt(["import-hf", exported, "--out", out])[0] == 2  # refused: the artifact is back
    assert load_artifact(out).manifest_sha256 == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".artifact.k1ll3d_x",
        ".artifact.mine____.replaced",
        "artifact",
    ]


# -- modes follow the umask -------------------------------------------------------------------------


@contextlib.contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize("mask", [0o077, 0o022])
def test_outputs_get_the_mode_the_umask_gives_a_new_file(artifact, exported, tmp_path, mask):
    """They were forced to 0644 (0755 for directories), and model.safetensors was 0600."""
    with umask(mask):
        identity.write_atomically(tmp_path / "file", b"x")
        assert run_jgpt(["export-hf", artifact, "--out", tmp_path / "hf"])[0] == 0
        assert run_jgpt(["import-hf", exported, "--out", tmp_path / "artifact"])[0] == 0
    assert stat.S_IMODE((tmp_path / "file").stat().st_mode) == 0o666 & ~mask
    for output in ("hf", "artifact"):
        for name, mode in modes(tmp_path / output).items():
            directory = (tmp_path / output / name).is_dir()
            assert mode == (0o777 if directory else 0o666) & ~mask, (output, name, oct(mode))


def test_a_replaced_file_or_export_keeps_its_mode(artifact, exported, tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"old")
    path.chmod(0o600)
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    out.chmod(0o750)
    with umask(0o022):
        identity.write_atomically(path, b"new")
        assert run_jgpt(["export-hf", artifact, "--out", out, "--force"])[0] == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"new"
    assert stat.S_IMODE(out.stat().st_mode) == 0o750


def test_the_catalog_keeps_its_mode(tmp_path):
    from jgpt.artifacts.catalog import read_catalog, write_catalog

    path = tmp_path / "catalog.json"
    shutil.copyfile(Path(__file__).resolve().parents[1] / "checkpoints" / "catalog.json", path)
    path.chmod(0o600)
    write_catalog(read_catalog(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# -- fuzz -------------------------------------------------------------------------------------------

SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
# The order import-hf looks at its files in; the field its refusal names.
CHECK_ORDER = {"config.json": "config.json", "model.safetensors": "model.safetensors", INDEX: INDEX,
               SHARDS[0]: INDEX, SHARDS[1]: INDEX, "tokenizer.json": "tokenizer.json"}  # fmt: skip


@contextlib.contextmanager
def scratch(tmp_path: Path):
    """A fresh directory for one generated case, removed after it."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        yield root
    finally:
        shutil.rmtree(root)


@FUZZ
@given(data=st.data())
def test_fuzz_import_hf_directories_with_links_fifos_and_directories_in_place_of_files(
    exported, outside, tmp_path, data
):
    """One to three of the files import-hf reads replaced by a link out (to a file, a directory, a device), a
    dangling link, a link loop, a FIFO or a directory: refused naming the first in the order they are read,
    nothing outside read or changed, nothing written."""
    layout = data.draw(st.sampled_from(["single", "sharded"]), "layout")
    names = ["config.json", "tokenizer.json", *(["model.safetensors"] if layout == "single" else [INDEX, *SHARDS])]
    hostile = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True), "replaced")
    kinds = [data.draw(st.sampled_from([*HOSTILE_KINDS, "a link to a device"]), name) for name in hostile]
    with scratch(tmp_path) as root:
        model = sharded(exported, root / "hf") if layout == "sharded" else shutil.copytree(exported, root / "hf")
        for name, kind in zip(hostile, kinds):
            if kind == "a link to a device":
                (model / name).unlink()
                (model / name).symlink_to("/dev/zero")
            else:
                hostile_entry(model / name, kind, outside)
        line = assert_refused(
            ["import-hf", model, "--out", root / "out"], inputs=[outside / "secret.json"], watch=[root, outside]
        )
        first = min(hostile, key=list(CHECK_ORDER).index)
        assert f": error: {CHECK_ORDER[first]}: " in line, (first, line)


OUT_KINDS = ["foreign files", "a downloaded model", "an export and a file", "an export and a directory",
             "an export holding a link", "the current directory", "a parent of the current directory", "$HOME",
             "a link to an export", "the artifact", "inside the artifact", "a file", "an empty directory",
             "missing", "an export"]  # fmt: skip
NAMES = st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=12).filter(
    lambda name: name not in (".", "..")
)


@FUZZ
@given(kind=st.sampled_from(OUT_KINDS), force=st.booleans(), names=st.lists(NAMES, min_size=1, max_size=4),
       spelling=st.sampled_from(["absolute", "relative"]))  # fmt: skip
def test_fuzz_export_hf_out_targets(artifact, exported, tmp_path, kind, force, names, spelling):
    """`export-hf --out` onto what a person has: refused naming `out` with every file byte-identical, unless it
    is missing, empty, or (with --force) a previous export holding nothing else, which is written whole."""
    with scratch(tmp_path) as root, pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        model = shutil.copytree(artifact, root / "model")
        out = root / "out"
        if kind in ("an export", "an export and a file", "an export and a directory", "an export holding a link"):
            shutil.copytree(exported, out)
            (out / "config.json").write_text('{"previous": true}')
        if kind == "foreign files":
            for n, name in enumerate(names):
                (out / str(n)).mkdir(parents=True)
                (out / str(n) / name).write_text(name)
        elif kind == "a downloaded model":
            tiny_gpt2(out)
        elif kind == "an export and a file":
            if names[0] not in EXPORT_FILES:
                (out / names[0]).write_text("mine")
            else:
                (out / "notes.txt").write_text("mine")
        elif kind == "an export and a directory":
            (out / names[0]).mkdir(exist_ok=True) if names[0] not in EXPORT_FILES else (out / "sub").mkdir()
        elif kind == "an export holding a link":
            (out / "tokenizer.json").unlink()
            (out / "tokenizer.json").symlink_to(model / "tokenizer.json")
        elif kind in ("the current directory", "a parent of the current directory", "$HOME"):
            shutil.copytree(exported, out)
            (out / "inner").mkdir()
            patch.chdir(out / "inner" if kind == "a parent of the current directory" else out)
            patch.setenv("HOME", str(out if kind == "$HOME" else root / "home"))
        elif kind == "a link to an export":
            shutil.copytree(exported, root / "export")
            out.symlink_to(root / "export")
        elif kind in ("the artifact", "inside the artifact"):
            out = model if kind == "the artifact" else model / "weights"
        elif kind == "a file":
            out.write_text("mine")
        elif kind == "an empty directory":
            out.mkdir()
        target = os.path.relpath(out) if spelling == "relative" else out
        argv = ["export-hf", model, "--out", target, *(["--force"] if force else [])]
        if kind in ("missing", "an empty directory") or (kind == "an export" and force):
            code, _, err = run_jgpt(argv)
            assert code == 0 and files_under(out) == files_under(exported), err
            assert sorted(p.name for p in root.iterdir()) == ["model", "out"]
        else:
            before = files_under(root)
            assert_refused(argv, watch=[root], field="out")
            assert files_under(root) == before


@FUZZ
@given(fraction=st.floats(0, 1.05), over_previous=st.booleans())
def test_fuzz_export_hf_on_a_disk_that_fills_at_a_random_byte(artifact, exported, tmp_path, fraction, over_previous):
    """The disk fills at any byte of any file of the export: one line naming `out`, the previous export (or
    nothing) in place, no staging or temporary file left; an export that fits is written whole."""
    total = export_bytes(exported)
    budget = int(total * fraction)
    with scratch(tmp_path) as root, pytest.MonkeyPatch.context() as patch:
        out = root / "hf"
        if over_previous:
            shutil.copytree(exported, out)
            (out / "config.json").write_text('{"previous": true}')
        before = files_under(root)
        patch.setattr(identity.os, "fdopen", FillingDisk(budget))
        argv = ["export-hf", artifact, "--out", out, "--force"]
        if budget >= total:
            code, _, err = run_jgpt(argv)
            assert code == 0 and files_under(out) == files_under(exported), err
            assert [p.name for p in root.iterdir()] == ["hf"]
        else:
            line = assert_refused(argv, watch=[root])
            assert line.endswith(f": error: out: cannot write {out}: {NO_SPACE}"), line
            assert files_under(root) == before


DISK = 192 << 10


@FUZZ
@given(ballast=st.integers(0, DISK), over_previous=st.booleans())
def test_fuzz_import_hf_on_a_real_disk_that_fills_at_a_random_byte(exported, tmp_path, ballast, over_previous):
    """A real tmpfs, filled by a ballast file of random size before `import-hf` (orbax writes the weights
    through tensorstore, out of reach of an injected Python write): the import fits and is whole, or is one line
    naming `out` with the disk as it was and the artifact --overwrite would replace intact."""
    with small_disk(tmp_path / "disk", DISK) as disk:
        out = disk / "artifact"
        previous = None
        if over_previous and run_jgpt(["import-hf", exported, "--out", out])[0] == 0:
            previous = load_artifact(out).manifest_sha256
        with contextlib.suppress(OSError), open(disk / "ballast", "wb") as file:
            file.write(bytes(ballast))
        before = files_under(disk)
        argv = ["import-hf", exported, "--out", out, *(["--overwrite"] if previous else [])]
        code, _, err = run_jgpt(argv)
        if code == 0:
            assert load_artifact(out).manifest_sha256 != previous
        else:
            assert (code, err) == (2, f"jgpt import-hf: error: out: cannot write {out}: {NO_SPACE}\n")
            assert files_under(disk) == before
            assert previous is None or load_artifact(out).manifest_sha256 == previous
        assert sorted(p.name for p in disk.iterdir()) == sorted(
            ["ballast", *(["artifact"] if code == 0 or previous else [])]
        )
