"""The command line as a person meets it: help on every option, --version, a closed pipe, a short
training run's warm-up, --json that parses, human units, and progress only on a terminal."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jgpt.cli import main as cli
from jgpt.foundation import progress
from jgpt.foundation.command_line import HelpFormatter
from jgpt.foundation.errors import ApiError
from jgpt.foundation.units import byte_size, count, duration_us

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tests" / "data" / "kvsim_worked_example.json"
SCRIPT = Path(sys.executable).with_name("jgpt")  # installed by `pip install -e .`


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _walk(parser: argparse.ArgumentParser, name: str):
    """(name, parser) for the parser and every sub-parser below it; each sub-command has help."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest for choice in action._choices_actions if choice.help}
            assert helped == set(action.choices), f"{name}: sub-commands without help: {set(action.choices) - helped}"
            for sub, subparser in action.choices.items():
                yield from _walk(subparser, f"{name} {sub}")


@pytest.fixture
def every_option(monkeypatch) -> list[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    """Every option of every command (command line, parser, action): each command's parser is caught
    where the command would parse its arguments."""

    def caught(self, args=None, namespace=None):
        raise _Built(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    options = []
    for command, (face, _) in cli.COMMANDS.items():
        with pytest.raises(_Built) as built:
            face().main(command, [])
        for name, parser in _walk(built.value.parser, f"jgpt {command}"):
            options += [
                (name, parser, action)
                for action in parser._actions
                if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
            ]
    return options


def test_every_option_of_every_command_has_help(every_option):
    missing = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, _, action in every_option
        if not (action.help or "").strip()
    ]
    assert len(every_option) > 100 and missing == []


def test_every_help_shows_the_default_and_the_choices(every_option):
    for name, parser, action in every_option:
        shown = " ".join(parser.format_help().split())
        if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
            assert f"(default: {action.default})" in shown, (name, action.option_strings)
        if action.choices:  # in place of a missing metavar, or after the help
            assert all(str(choice) in shown for choice in action.choices), (name, action.option_strings)


def test_help_formatter_shows_meaningful_defaults_only():
    parser = argparse.ArgumentParser(prog="p", formatter_class=HelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="a seed")
    parser.add_argument("--out", help="where (default: beside the input)")
    parser.add_argument("--json", action="store_true", help="as JSON")
    parser.add_argument("--mode", choices=("a", "b"), default="a", metavar="MODE", help="how")
    text = " ".join(parser.format_help().split())
    assert "a seed (default: 0)" in text and "where (default: beside the input)" in text
    assert "as JSON (default" not in text and "how (one of: a, b) (default: a)" in text


def test_version_is_the_installed_packages(capsys):
    assert cli.main(["--version"]) == 0 and cli.main(["-V"]) == 0
    assert capsys.readouterr().out == f"jgpt {metadata.version('jgpt')}\n" * 2
    assert "--version" in cli._help()


@pytest.mark.parametrize(
    "argv", [["--help"], ["catalog", "--json"], ["catalog", "--help"], ["kvsim", "run", str(EXAMPLE)]]
)
def test_a_closed_pipe_ends_quietly(argv):
    """`jgpt ... | head -1`: the reader is gone before jgpt writes (a block-buffered pipe, as in a shell)."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    process = subprocess.Popen([str(SCRIPT), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait() == 141  # as a shell reports a SIGPIPE death
    assert stderr == ""


def test_a_short_run_scales_its_warmup(tmp_path):
    from training.commands import _train_parser, training_config
    from training.config import WARMUP_STEPS, TrainingConfig

    def config(*argv: str) -> TrainingConfig:
        return training_config(_train_parser("jgpt train").parse_args(list(argv)))

    assert TrainingConfig().warmup_steps == WARMUP_STEPS == 100  # the shipped recipe (3000 steps) is unchanged
    assert config("--steps", "60").warmup_steps == 6
    assert config("--steps", "5").warmup_steps == 0
    assert config("--steps", "60", "--warmup-steps", "30").warmup_steps == 30
    file = tmp_path / "config.json"
    file.write_text(json.dumps({"steps": 3000, "batch_size": 8}))
    assert config("--config", str(file), "--steps", "60").warmup_steps == 6  # the file gave no warm-up of its own
    file.write_text(json.dumps({"warmup_steps": 50}))
    assert config("--config", str(file), "--steps", "60").warmup_steps == 50
    with pytest.raises(ApiError, match="warmup_steps"):
        config("--steps", "60", "--warmup-steps", "100")  # one the user chose is never changed silently
    assert TrainingConfig(steps=60).to_json()["warmup_steps"] == 6  # the run records the number it used


def test_json_outputs_parse(tmp_path, capsys):
    def printed(argv) -> object:
        assert cli.main(argv) == 0
        return json.loads(capsys.readouterr().out)

    run = printed(["kvsim", "run", str(EXAMPLE), "--json", "--out", str(tmp_path / "record.json")])
    record = json.loads((tmp_path / "record.json").read_text())
    assert run["id"] == record["id"] and run["outcomes"] == record["outcomes"]
    assert run["outcomes"]["totals"]["bytes_device_to_host"] == 700  # exact numbers, not "700 B"
    replayed = printed(["kvsim", "replay", str(tmp_path / "record.json"), "--json"])
    assert replayed == {
        "id": run["id"],
        "identical": True,
        "bytes": (tmp_path / "record.json").stat().st_size,
        "events": len(record["events"]),
        "difference": None,
    }
    labs = printed(["lab", "list", "--json"])
    assert {"id", "planned", "arms", "question"} == set(labs[0]) and len({lab["id"] for lab in labs}) == len(labs)
    assert printed(["catalog", "--json"])["models"]
    assert printed(["tokenize", "--json", "hi"])["ids"][0] == 257


def test_kvsim_summary_prints_human_units(capsys):
    assert cli.main(["kvsim", "run", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "virtual end 32 us" in out and "device->host 700 B  host->device 700 B" in out
    assert re.search(r"TTFT +4 +5 us +28 us +28 us", out)


def test_lab_summary_prints_human_units_and_json_keeps_the_numbers(lab_run, capsys):
    from experiments.commands.lab import summary_text
    from experiments.record_summary import summary

    assert cli.main(["lab", "replay", str(lab_run.directory / "record.json"), "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert (checked["id"], checked["arms_replayed"], checked["measured_runs_checked"]) == (
        lab_run.record["id"],
        len(lab_run.record["arms"]),
        0,
    )
    figures = summary(lab_run.record)
    assert json.loads((lab_run.directory / "summary.json").read_text()) == figures
    text = summary_text(figures)
    for arm in figures["arms"]:
        row = next(line for line in text.splitlines() if line.strip().startswith(arm["label"]))
        assert duration_us(arm["ttft_p50_us"]) in row and byte_size(arm["bytes_host_to_device"]) in row


UNITS = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "PiB": 1024**5,
    "EiB": 1024**6,
    "us": 1,
    "ms": 1e3,
    "s": 1e6,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}


def _read_back(text: str) -> float:
    number, _, unit = text.partition(" ")
    return float(number) * UNITS.get(unit, 1)


@given(
    st.one_of(st.integers(0, 2**70), st.floats(0, 1e21, allow_nan=False)),
    st.sampled_from([byte_size, duration_us, count]),
)
def test_human_units_read_back_within_half_a_percent(value, formatter):
    text = formatter(value)
    number, _, unit = text.partition(" ")
    assert re.fullmatch(r"\d+(\.\d+)?", number) and (unit in UNITS or (formatter is count and unit == ""))
    if value >= 1 or isinstance(value, int):
        assert _read_back(text) == pytest.approx(value, rel=0.005)
    else:  # below one of the smallest unit: two decimals
        assert abs(_read_back(text) - value) <= 0.005
    if float(number) != 0 and UNITS.get(unit, 1) > 1:  # the largest unit it reaches: at least 1 of it
        assert float(number) >= 1
    if unit not in ("s", "EiB", "E"):  # below the next unit, where there is one
        assert float(number) < (1024 if formatter is byte_size else 1000)


@pytest.mark.parametrize(
    "value, text",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (2515464192, "2.34 GiB"),
        (1048575, "1.00 MiB"),
        (10 * 1024**2, "10.0 MiB"),
    ],
)
def test_byte_sizes(value, text):
    assert byte_size(value) == text


def test_durations_and_counts():
    assert [duration_us(v) for v in (850, 12345, 4.5e6, 0.5, None)] == ["850 us", "12.3 ms", "4.50 s", "0.50 us", "-"]
    assert [count(v) for v in (950, 1234567, 110)] == ["950", "1.23 M", "110"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_terminal_and_never_when_quiet():
    items = [1, 2, 3]
    for stream, quiet in ((io.StringIO(), False), (_Terminal(), True)):
        with progress.shown(quiet, stream) as drawn:
            assert not drawn and progress.tracked(items, "x") is items
            with progress.stage("loading"):
                pass
        assert stream.getvalue() == ""
    terminal = _Terminal()
    with progress.shown(False, terminal) as drawn:
        assert drawn and list(progress.tracked(items, "counting", unit="item")) == items
        with progress.stage("loading"):
            pass
    assert "counting: 100%" in terminal.getvalue() and "3/3" in terminal.getvalue()
    assert re.search(r"loading: \d+\.\d s", terminal.getvalue())
    assert progress.tracked(items, "outside") is items  # off again after the block


def test_commands_draw_no_progress_when_stderr_is_not_a_terminal(tmp_path):
    done = subprocess.run(
        [str(SCRIPT), "kvsim", "run", str(EXAMPLE), "--out", str(tmp_path / "r.json")], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stderr == ""


def test_weights_are_read_without_orbax_as_orbax_restores_them(tmp_path):
    """Start-up: load_artifact reads orbax's OCDBT layout with tensorstore; the arrays are orbax's, bit for bit."""
    import numpy as np
    import orbax.checkpoint as ocp

    from jgpt.artifacts.artifact import _read_ocdbt
    from jgpt.model.weights import abstract_weights

    from conftest import tiny_model

    artifact = tiny_model(tmp_path, seed=3)
    directory = artifact.path / "weights"
    target = abstract_weights(artifact.architecture).as_dict()
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(directory, target)
    read = _read_ocdbt(directory, target)
    assert read.keys() == restored.keys()
    assert all(read[name].dtype == np.float32 and np.array_equal(read[name], restored[name]) for name in read)
    wider = {**target, "query": type(target["query"])((9, *target["query"].shape[1:]), np.float32)}
    assert _read_ocdbt(directory, wider) is None  # another shape: orbax's to read (and refuse)
    assert _read_ocdbt(tmp_path, target) is None  # not an OCDBT checkpoint
    code = f"import sys; from jgpt.artifacts.artifact import load_artifact; load_artifact({str(artifact.path)!r}); print('orbax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_loading_and_running_a_model_imports_neither_flax_nor_orbax():
    """Start-up: flax (via flax.struct) and orbax were a quarter and a third of a second of `jgpt generate`."""
    code = (
        "import sys, inference.commands, inference.generation, inference.execution, jgpt.artifacts.artifact, jgpt.artifacts.catalog\n"
        "print(sorted(m for m in ('flax', 'orbax') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_pytree_dataclass_keeps_flax_structs_contract():
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import struct as flax_struct

    from jgpt.model import pytree

    def declare(module):
        @module.dataclass
        class State:
            keys: jax.Array
            lengths: jax.Array
            checkpoint: str = module.field(pytree_node=False)
            precision: str | None = module.field(pytree_node=False, default=None)

        return State

    ours, theirs = (
        declare(pytree)(jnp.ones(2), jnp.zeros(3), "c", "f32"),
        declare(flax_struct)(jnp.ones(2), jnp.zeros(3), "c", "f32"),
    )
    (leaves, tree), (their_leaves, their_tree) = (
        jax.tree_util.tree_flatten_with_path(ours),
        jax.tree_util.tree_flatten_with_path(theirs),
    )
    assert [path for path, _ in leaves] == [path for path, _ in their_leaves]
    assert str(tree).replace("State", "") == str(their_tree).replace("State", "")  # static fields in the structure
    moved = jax.jit(lambda s: s.replace(lengths=s.lengths + 1))(ours)
    assert (moved.checkpoint, moved.precision, moved.lengths.tolist()) == ("c", "f32", [1.0, 1.0, 1.0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.checkpoint = "other"
    assert jax.tree_util.tree_structure(ours) != jax.tree_util.tree_structure(ours.replace(checkpoint="d"))


def test_serve_summary_prints_bytes_in_human_units():
    from inference.measured_run import summary

    latency = {"count": 1, "p50": 1500, "p90": 1500, "p99": 1500}
    totals = {
        "arrived": 1,
        "completed": 1,
        "stopped": 0,
        "cancelled": 0,
        "rejected": 0,
        "end_us": 2_000_000,
        "compute_busy_fraction": 0.5,
        "latency_us": {"ttft": latency},
        "hits_device": 0,
        "hits_host": 1,
        "lookups": 1,
        "token_hit_rate": 0.5,
        "bytes_device_to_host": 2515464192,
        "bytes_host_to_device": 700,
        "offloads": 1,
        "reloads": 1,
        "drops": 0,
    }
    document = {
        "totals": totals,
        "requests": {"r": {"selected_tokens": 4}},
        "engine": {"compiled_programs": 2, "compile_wall_us": 1e6, "compiles_during_run": 0},
    }
    assert "moved: 2.34 GiB to host (1 offloads), 700 B to device (1 reloads)" in summary(document)
