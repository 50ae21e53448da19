"""Hostile input, third round: the report's plots and --out, kvsim's numeric options, what import-trace
writes, and measured works whose wall time contradicts their start and end.

- `jgpt report` read plots/*.png whole and unchecked (an 8 GB sparse plot was killed by the OOM killer
  at 24 GB; a 300 MB one made a 420 MB page; any bytes were embedded as a PNG), and `--out plots/arms.png`
  replaced the plot it embeds. Each plot is now bounded by its size before it is read and must be a
  whole PNG of sane dimensions; --out is compared with every file the report reads.
- `jgpt kvsim predict --seeds 10**12` was a MemoryError traceback, and the analytic model's sizes were
  bounded only below: every numeric option of `jgpt kvsim` now has a range, refused naming the flag.
- `import-trace` (and `synthesize`) wrote documents kvsim's reader then refused (a Mooncake timestamp of
  2^53 ms, Azure rows 8,000 years apart, a model whose counts pass 2^53): the converted document is read
  back by kvsim's reader before it is written.
- `calibrate` fitted works whose wall_us contradicted end_us - start_us.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
import zlib
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from test_kvsim_calibration import TRUTH, conversation_system, measured_run

from experiments.html_report import PLOT_BYTE_LIMIT, PLOT_PIXEL_LIMIT, PLOT_SIDE_LIMIT
from experiments.report_figures import draw_plots, simulated_arms
from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import LIMIT
from kvsim import analytic_documents, commands, traces
from kvsim.cache_run import load_json
from kvsim.measured_run import WALL_TOLERANCE_US
from kvsim.recorded import parse_document

from hostile import FUZZ, assert_clean, assert_refused, extreme_numbers, mutated_json, run_jgpt

DATA = Path(__file__).parent / "data"
SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, depth: int = 8, colour: int = 2, rows: bytes | None = None) -> bytes:
    """A PNG written from its definition (not by the code under test): IHDR, one IDAT, IEND."""
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    data = rows if rows is not None else b"\0" * min(height, 4)
    return SIGNATURE + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(data)) + png_chunk(b"IEND", b"")


def sane_png(data: bytes) -> bool:
    """What the report may embed, judged independently: PNG signature, a well-formed IHDR first (CRC, a
    defined depth for its colour type, 1..PLOT_SIDE_LIMIT a side, PLOT_PIXEL_LIMIT in all), IEND last."""
    if len(data) > PLOT_BYTE_LIMIT or not data.startswith(SIGNATURE) or len(data) < 33:
        return False
    length, kind = struct.unpack(">I4s", data[8:16])
    body, crc = data[16:29], struct.unpack(">I", data[29:33])[0]
    if length != 13 or kind != b"IHDR" or zlib.crc32(kind + body) != crc:
        return False
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", body)
    allowed = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}.get(colour, ())
    return (
        0 < width <= PLOT_SIDE_LIMIT
        and 0 < height <= PLOT_SIDE_LIMIT
        and width * height <= PLOT_PIXEL_LIMIT
        and depth in allowed
        and (compression, filtering, interlace) in ((0, 0, 0), (0, 0, 1))
        and data.endswith(png_chunk(b"IEND", b""))
    )


# -- the report ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plotted_run(lab_run, tmp_path_factory):
    """The shared tiny lab run with its plots drawn (a run directory as `jgpt lab run` leaves it)."""
    directory = tmp_path_factory.mktemp("plotted") / "run"
    shutil.copytree(lab_run.directory, directory)
    draw_plots(lab_run.record, directory)
    names = ["arms.png", "inference-map.png", *(f"arm-{i}-timeline.png" for i, _ in simulated_arms(lab_run.record))]
    assert sorted(p.name for p in (directory / "plots").iterdir()) == sorted(names)
    return directory, names


def _copy(plotted_run, root: Path) -> Path:
    directory = Path(tempfile.mkdtemp(dir=root)) / "run"
    shutil.copytree(plotted_run[0], directory)
    return directory


def _run_files(directory: Path) -> list[Path]:
    """The run's regular files that are small enough to compare byte for byte."""
    return [p for p in directory.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_size < 1 << 24]


@pytest.mark.parametrize("size", [PLOT_BYTE_LIMIT + 1, 300 << 20, 1 << 40])
def test_report_refuses_a_plot_past_the_limit_before_reading_it(plotted_run, tmp_path, size):
    """A sparse 1 TB plot is refused by its size at once: read whole it was a MemoryError (8 GB: the OOM killer)."""
    directory = _copy(plotted_run, tmp_path)
    with open(directory / "plots" / "arms.png", "r+b") as plot:
        plot.truncate(size)
    out = tmp_path / "page.html"
    started = time.monotonic()
    line = assert_refused(["report", directory / "record.json", "--out", out], inputs=_run_files(directory),
                          watch=[tmp_path], field="plots/arms.png")  # fmt: skip
    assert f"is {size} bytes, more than the {PLOT_BYTE_LIMIT} a plot may be" in line, line
    assert time.monotonic() - started < 30 and (directory / "plots" / "arms.png").stat().st_size == size


BAD_PNGS = {
    "not a PNG": (b"not a png at all", "no PNG signature"),
    "empty": (b"", "no PNG signature"),
    "the signature alone": (SIGNATURE, "no IHDR chunk"),
    "a chunk other than IHDR first": (SIGNATURE + png_chunk(b"tEXt", b"x" * 13) + png(1, 1)[8:], "no IHDR chunk"),
    "a damaged IHDR": (png(4, 4)[:20] + b"\xff" + png(4, 4)[21:], "CRC does not match"),
    "zero width": (png(0, 4), "declares 0x4 pixels"),
    "2^31 wide": (png(1 << 31, 1), f"declares {1 << 31}x1 pixels"),
    "too many pixels": (png(PLOT_SIDE_LIMIT, PLOT_SIDE_LIMIT), "at most 67108864 in all"),
    "a depth PNG does not define": (png(4, 4, depth=3), "values PNG does not define"),
    "a colour type PNG does not define": (png(4, 4, colour=5), "values PNG does not define"),
    "cut short": (png(4, 4)[:-6], "does not end with an IEND chunk"),
    "HTML after IEND": (png(4, 4) + b"<script>alert(1)</script>", "does not end with an IEND chunk"),
}


@pytest.mark.parametrize("case", BAD_PNGS)
def test_report_refuses_a_plot_that_is_not_a_sane_png_naming_it(plotted_run, tmp_path, case):
    data, reason = BAD_PNGS[case]
    assert not sane_png(data)
    directory = _copy(plotted_run, tmp_path)
    (directory / "plots" / "inference-map.png").write_bytes(data)
    line = assert_refused(["report", directory / "record.json", "--out", tmp_path / "page.html"],
                          inputs=_run_files(directory), watch=[tmp_path], field="plots/inference-map.png")  # fmt: skip
    assert reason in line, line


def test_report_embeds_a_sane_png_it_did_not_draw(plotted_run, tmp_path):
    import base64

    directory = _copy(plotted_run, tmp_path)
    data = png(3, 2, colour=0, depth=1)
    assert sane_png(data)
    (directory / "plots" / "arms.png").write_bytes(data)
    code, _, stderr = run_jgpt(["report", directory / "record.json", "--out", tmp_path / "page.html"])
    assert code == 0, stderr
    assert base64.b64encode(data).decode() in (tmp_path / "page.html").read_text()


def test_report_refuses_a_fifo_as_a_plot_without_blocking(plotted_run, tmp_path):
    directory = _copy(plotted_run, tmp_path)
    (directory / "plots" / "arms.png").unlink()
    os.mkfifo(directory / "plots" / "arms.png")
    line = assert_refused(["report", directory / "record.json", "--out", tmp_path / "page.html"],
                          inputs=_run_files(directory), watch=[tmp_path], field="plots")  # fmt: skip
    assert "'plots/arms.png' is neither a file nor a directory" in line, line


def _out_targets(directory: Path, names: list[str]) -> dict[str, Path]:
    """Outputs that are, or link to, a file the report reads (made on demand)."""
    record = json.loads((directory / "record.json").read_text())
    observations = directory / record["recordings"][0]["observations"]["path"]
    cache_run = directory / next(arm["cache_run"]["path"] for arm in record["arms"] if "cache_run" in arm)
    return {
        "the record": directory / "record.json",
        "a plot": directory / "plots" / names[-1],
        "a symbolic link to a plot": ("symlink", directory / "plots" / names[0], directory / "page.html"),
        "a hard link to a plot": ("hardlink", directory / "plots" / names[1], directory / "page.html"),
        "a hard link to the observations": ("hardlink", observations, directory / "elsewhere.html"),
        "a symbolic link to a cache run": ("symlink", cache_run, directory / "cache.html"),
        "a hard link to the record": ("hardlink", directory / "record.json", directory / "r.html"),
    }


# --out targets refused before the record is replayed: a directory, a missing parent, the record or a JSON
# file beside it (or a link to one); a plot is compared once the replayed record names the plots.
EARLY = {"a directory", "a missing parent", "the record", "a hard link to the observations",
         "a symbolic link to a cache run", "a hard link to the record"}  # fmt: skip


def _made(target) -> Path:
    if isinstance(target, Path):
        return target
    how, source, link = target
    if how == "symlink":
        link.symlink_to(source)
    else:
        os.link(source, link)
    return link


def test_report_out_is_never_a_file_the_report_reads(plotted_run, tmp_path):
    """`report --out run/plots/arms.png` replaced the plot with the page (exit 0); a link to it too."""
    for what in _out_targets(plotted_run[0], plotted_run[1]):
        directory = _copy(plotted_run, tmp_path)
        out = _made(_out_targets(directory, plotted_run[1])[what])
        line = assert_refused(["report", directory / "record.json", "--out", out], inputs=_run_files(directory),
                              watch=[tmp_path], field="--out")  # fmt: skip
        assert "writing it would destroy the input" in line, (what, line)


def _plot_change(directory: Path, names: list[str], draw) -> tuple[str, str | None]:
    """Change one plot of `directory` in a hostile way; (its name, the field a refusal must name or None)."""
    name = draw(st.sampled_from(names))
    plot = directory / "plots" / name
    original = plot.read_bytes()
    changes = ["size", "bytes", "header", "cut", "link out", "link in", "directory"]
    change = draw(st.sampled_from(changes + ["kept"] * len(changes)))  # half of them
    if change == "size":  # sparse: a regression would be a MemoryError at once, not an exhausted machine
        size = draw(st.one_of(st.integers(PLOT_BYTE_LIMIT + 1, PLOT_BYTE_LIMIT + 4096), st.integers(1 << 36, 1 << 43)))
        with open(plot, "r+b") as file:
            file.truncate(size)
        return name, f"plots/{name}"
    if change == "bytes":
        data = draw(st.binary(max_size=64))
        data = draw(st.sampled_from([data, SIGNATURE + data, original[:33] + data]))
    elif change == "header":  # any IHDR values, the CRC made right so that the values themselves are judged
        values = draw(st.tuples(*[st.integers(0, 2**32 - 1)] * 2, *[st.integers(0, 255)] * 5))
        data = SIGNATURE + png_chunk(b"IHDR", struct.pack(">IIBBBBB", *values)) + original[33:]
    elif change == "cut":
        data = original[: draw(st.integers(0, len(original) - 1))]
    elif change == "link out":
        outside = directory.parent / "secret.txt"
        outside.write_text("not for the page")
        plot.unlink()
        plot.symlink_to(outside)
        return name, "plots"
    elif change == "link in":  # a link that stays inside the directory is a plot like any other
        (directory / "kept.png").write_bytes(original)
        plot.unlink()
        plot.symlink_to(directory / "kept.png")
        return name, None
    elif change == "directory":  # not a plot: the report draws its own for the page
        plot.unlink()
        plot.mkdir()
        return name, None
    else:
        return name, None
    plot.write_bytes(data)
    return name, None if sane_png(data) else f"plots/{name}"


@FUZZ
@given(data=st.data())
def test_report_on_hostile_plots_and_outputs_embeds_sane_pngs_or_refuses_naming_the_file(plotted_run, tmp_path, data):
    directory = _copy(plotted_run, tmp_path)
    name, field = _plot_change(directory, plotted_run[1], data.draw)
    targets = _out_targets(directory, [n for n in plotted_run[1] if n != name] + [name])
    hostile_outs = ["a directory", "a missing parent", *targets]
    what = data.draw(st.sampled_from(hostile_outs + ["a new file"] * 2 * len(hostile_outs)))  # a third hostile
    out = {"a new file": directory.parent / "page.html", "a directory": directory / "plots",
           "a missing parent": directory / "missing" / "page.html"}.get(what)  # fmt: skip
    out = out or _made(targets[what])
    if what in EARLY or what != "a new file" and field != "plots":  # a plot leading out is refused before a
        field = "--out"  # plot is compared with --out, --out before a plot is read
    event(f"refused naming {field}" if field else "embedded")
    argv = ["report", directory / "record.json", "--out", out]
    plot = directory / "plots" / name
    size = plot.stat().st_size if plot.is_file() else None
    if field is None:
        code, _, stderr = run_jgpt(argv)
        assert code == 0 and "Traceback" not in stderr, stderr
        page = out.read_text()
        assert page.count("data:image/png;base64,") == len(plotted_run[1]) and "<script>alert" not in page
    else:
        line = assert_refused(argv, inputs=_run_files(directory), watch=[directory.parent], field=field)
        assert (plot.stat().st_size if plot.is_file() else None) == size, line
        assert field != "--out" or "would destroy the input" in line or "directory" in line, line


# -- kvsim's numeric options ------------------------------------------------------------------------------

# Each numeric option of `jgpt kvsim`, with the other arguments of its action: an --out under a missing
# directory, so that a value in range is refused there, cheaply, and one out of range must be refused first.
MODEL_OPTIONS = ("--layers", "--width", "--ffn", "--vocabulary", "--precision-bytes", "--context")
OPTIONS = [
    ("--seeds", lambda tmp: ["predict", tmp / "measured.json", "--out", tmp / "missing" / "record.json"]),
    *((option, lambda tmp: ["synthesize", "--out", tmp / "missing" / "c.json"])
      for option in ("--requests", "--seed", *MODEL_OPTIONS)),
    *((option, lambda tmp: ["import-trace", DATA / "kvsim_mooncake_sample.jsonl", "--format", "mooncake",
                            "--out", tmp / "missing" / "c.json"])
      for option in ("--block-tokens", *MODEL_OPTIONS)),
]  # fmt: skip


def _in_range(option: str, value: int) -> bool:
    minimum, maximum = commands.OPTION_RANGES[option.removeprefix("--").replace("-", "_")]
    return minimum <= value <= maximum and (option != "--block-tokens" or value <= 4096)  # the default --context


@FUZZ
@given(choice=st.sampled_from(OPTIONS), number=extreme_numbers())
def test_kvsim_numeric_options_at_the_edges_are_refused_naming_the_flag(tmp_path, choice, number):
    option, arguments = choice
    argv = ["kvsim", *arguments(tmp_path), option, number.decode()]
    value = json.loads(number)
    if not isinstance(value, int):  # argparse's int refuses it (`-0.0`, `1e+308`, `0.5`)
        assert_refused(argv, watch=[tmp_path], field=f"argument {option}: ")
    elif _in_range(option, value):  # refused later: at --out, or a model whose counts pass 2^53, or a
        line = assert_refused(argv, watch=[tmp_path])  # --context below the default --block-tokens
        assert any(f"error: {field}: " in line for field in ("--out", "analytic model", "--block-tokens")), line
    else:
        line = assert_refused(argv, watch=[tmp_path], field=f"error: {option}: ")
        assert line.endswith(f"got {value}"), line


def test_predict_seeds_is_bounded_before_anything_is_read(tmp_path):
    """--seeds 10^12 built a tuple of 10^12 seeds: a MemoryError traceback."""
    line = assert_refused(["kvsim", "predict", tmp_path / "none.json", "--seeds", 10**12], watch=[tmp_path])
    assert f"--seeds: must be at least 1 and at most {commands.SEEDS_LIMIT}, got {10**12}" in line, line


@pytest.mark.parametrize("sizes", [["--width", "1048576"], ["--layers", "1048576", "--width", "65536"],
                                   ["--vocabulary", "1048576", "--width", "1048576"]])  # fmt: skip
def test_an_analytic_model_whose_counts_pass_2_53_is_refused_naming_its_options(tmp_path, sizes):
    """Each size within its range, their products not: synthesize wrote documents kvsim refused."""
    line = assert_refused(["kvsim", "synthesize", "--requests", "2", *sizes, "--out", tmp_path / "c.json"],
                          watch=[tmp_path], field="analytic model")  # fmt: skip
    assert " ".join(sizes[:2]) in line and "past the 2^53 kvsim reads" in line, line


# -- what import-trace writes -----------------------------------------------------------------------------


def _accepted(path: Path) -> None:
    """The document kvsim's own reader reads (as `kvsim run` does)."""
    parse_document(load_json(path.read_bytes(), "computations"))


@pytest.mark.parametrize(
    "trace, form, field",
    [
        (b'{"timestamp": 9007199254740992, "input_length": 3, "output_length": 2, "hash_ids": [1]}\n', "mooncake",
         "trace line 1.timestamp"),
        (b"TIMESTAMP,ContextTokens,GeneratedTokens\n0001-01-01 00:00:00,3,2\n9999-01-01 00:00:00,3,2\n", "azure",
         "trace line 3.TIMESTAMP"),
    ],
)  # fmt: skip
def test_import_trace_refuses_an_arrival_kvsim_would_refuse_naming_the_trace_field(tmp_path, trace, form, field):
    """Both were written (exit 0), and `kvsim run` then refused the document's arrival_us."""
    source = tmp_path / "trace"
    source.write_bytes(trace)
    line = assert_refused(["kvsim", "import-trace", source, "--format", form, "--out", tmp_path / "c.json"],
                          inputs=[source], watch=[tmp_path], field=field)  # fmt: skip
    assert "past the 2^53 us (285 years) kvsim reads" in line, line


def test_a_converted_document_kvsim_refuses_is_refused_naming_the_trace_line_and_column(tmp_path, monkeypatch):
    """The class, not the instance: whatever the converted document holds that kvsim's reader refuses is
    refused before writing, named by the line and column it came from (here with the arrival check gone)."""
    monkeypatch.setattr(traces, "_arrival", lambda arrival, field: arrival)
    source = tmp_path / "trace.jsonl"
    source.write_bytes((DATA / "kvsim_mooncake_sample.jsonl").read_bytes() + b'{"timestamp": 1e13, '
                       b'"input_length": 3, "output_length": 2, "hash_ids": [9]}\n')  # fmt: skip
    lines = len(source.read_bytes().splitlines())
    line = assert_refused(["kvsim", "import-trace", source, "--format", "mooncake", "--block-tokens", "4",
                           "--out", tmp_path / "c.json"], inputs=[source], watch=[tmp_path],
                          field=f"trace line {lines}.timestamp")  # fmt: skip
    assert f"converts to requests[{lines - 1}].arrival_us, which kvsim refuses" in line, line


def test_mooncake_blocks_count_against_the_token_limit(tmp_path):
    """Lines of one id each, every one a new block of --block-tokens ids: the blocks were materialized
    uncounted (100 such lines at --context and --block-tokens 2^20: 26 GB of tuples)."""
    rows = [{"timestamp": i, "input_length": 1, "output_length": 1, "hash_ids": [i]} for i in range(8)]
    source = tmp_path / "trace.jsonl"
    source.write_text("\n".join(map(json.dumps, rows)))
    line = assert_refused(["kvsim", "import-trace", source, "--format", "mooncake", "--context", 1 << 20,
                           "--block-tokens", 1 << 20, "--out", tmp_path / "c.json"], inputs=[source],
                          watch=[tmp_path], field="trace line 4")  # fmt: skip
    assert f"more than {traces.TOKEN_LIMIT} token ids" in line, line


MOONCAKE = [json.loads(line) for line in (DATA / "kvsim_mooncake_sample.jsonl").read_text().splitlines()]
NUMBERS = st.one_of(extreme_numbers(), st.integers(-(2**70), 2**70), st.integers(0, 40)).map(
    lambda n: n if isinstance(n, bytes) else json.dumps(n).encode()
)


@FUZZ
@given(data=st.data())
def test_import_trace_writes_a_document_kvsim_accepts_or_refuses_writing_nothing(tmp_path, data):
    form = data.draw(st.sampled_from(traces.FORMATS))
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    if form == "mooncake":
        lines = [json.dumps(row).encode() for row in MOONCAKE]
        index = data.draw(st.integers(0, len(lines) - 1))
        numeric = data.draw(st.booleans())  # a number at the edges where a number is, or any mutation
        lines[index] = data.draw(
            mutated_json(
                MOONCAKE[index], where=lambda path, value: isinstance(value, (int, float)), replacements=NUMBERS
            )
            if numeric
            else mutated_json(MOONCAKE[index])
        )
        trace = b"\n".join(lines)
        options = ["--block-tokens", "4"]
    else:
        trace = data.draw(_azure_trace())
        options = []
    context = data.draw(st.sampled_from([4096, 64, 1 << 20]))
    source, out = work / "trace", work / "c.json"
    source.write_bytes(trace)
    argv = ["kvsim", "import-trace", source, "--format", form, *options, "--context", context, "--out", out]
    code = assert_clean(argv, inputs=[source], watch=[work])
    event(f"{form}: {'written' if code == 0 else 'refused'}")
    if code == 0:
        _accepted(out)
    else:
        assert sorted(p.name for p in work.iterdir()) == ["trace"]


def _azure_trace() -> st.SearchStrategy[bytes]:
    day = st.datetimes(datetime(2024, 1, 1), datetime(2024, 1, 2))
    moment = st.one_of(day, st.datetimes()).map(lambda t: t.isoformat(sep=" "))
    tokens = st.one_of(st.integers(-2, 40), st.integers(-2, 5000), st.sampled_from([2**53, 2**63, 10**30]))
    row = st.tuples(moment, tokens, tokens).map(lambda r: ",".join(map(str, r)))
    return st.lists(row, min_size=1, max_size=6).map(
        lambda rows: ("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n").encode()
    )


# -- calibrate ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_measured():
    """A small measured run (kvsim playing the engine, as in test_kvsim_calibration): its works are exact."""
    from kvsim.analytic import AnalyticModel, analytic_computations
    from kvsim.recorded import document_json
    from kvsim.synthetic import conversations

    model = AnalyticModel(layers=2, width=64, ffn=256, vocabulary=260, precision_bytes=4)
    document = document_json(analytic_computations(model, conversations(12, seed=5), "test"))
    measured = measured_run(conversation_system("continuous_batching"), document, TRUTH)
    assert all(w["wall_us"] == w["end_us"] - w["start_us"] for w in measured["works"])
    return (measured,)


def _measured_with(small_measured, tmp_path: Path, index: int, changes: dict) -> Path:
    measured = json.loads(json.dumps(small_measured[0]))
    measured["works"][index].update(changes)
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "measured.json"
    path.write_text(json.dumps(measured))
    return path


@pytest.mark.parametrize("change", ["wall", "start", "end"])
def test_calibrate_refuses_a_work_whose_wall_contradicts_its_start_and_end(small_measured, tmp_path, change):
    """A work of wall_us 10^9 between start 0 and end 10 was fitted as it was (exit 0)."""
    work = small_measured[0]["works"][3]
    changes = {"wall": {"wall_us": work["wall_us"] + 10**9}, "start": {"start_us": work["end_us"] + 5},
               "end": {"end_us": work["start_us"] + work["wall_us"] + 2}}[change]  # fmt: skip
    path = _measured_with(small_measured, tmp_path, 3, changes)
    out = path.parent / "fragment.json"
    line = assert_refused(["kvsim", "calibrate", path, "--out", out], inputs=[path], watch=[path.parent],
                          field="MEASURED[0].works[3].wall_us")  # fmt: skip
    values = work | changes
    assert f"{values['wall_us']} contradicts start_us {values['start_us']} and end_us {values['end_us']}" in line
    assert_refused(["kvsim", "predict", path], inputs=[path], field="MEASURED.works[3].wall_us")


def test_calibrate_accepts_a_wall_within_the_tolerance(small_measured, tmp_path):
    work = small_measured[0]["works"][2]
    path = _measured_with(small_measured, tmp_path, 2, {"wall_us": work["wall_us"] + WALL_TOLERANCE_US})
    code, _, stderr = run_jgpt(["kvsim", "calibrate", path, "--out", path.parent / "fragment.json"])
    assert code == 0, stderr


@FUZZ
@given(data=st.data())
def test_calibrate_on_mutated_works_refuses_a_contradicting_wall_naming_the_work(small_measured, tmp_path, data):
    works = small_measured[0]["works"]
    index = data.draw(st.integers(0, len(works) - 1))
    names = data.draw(st.lists(st.sampled_from(["start_us", "end_us", "wall_us"]), min_size=1, max_size=3, unique=True))
    near = st.integers(-3, 3).map(lambda d: lambda v: v + d)
    far = st.one_of(st.integers(0, LIMIT), st.sampled_from([LIMIT, 0])).map(lambda n: lambda v: n)
    changes = {name: data.draw(st.one_of(near, far))(works[index][name]) for name in names}
    path = _measured_with(small_measured, tmp_path, index, changes)
    out = path.parent / "fragment.json"
    argv = ["kvsim", "calibrate", path, "--out", out]
    work = works[index] | changes
    start, end, wall = work["start_us"], work["end_us"], work["wall_us"]
    event("negative" if min(start, end, wall) < 0 else "consistent" if 0 <= wall - (end - start) <= 1 else "other")
    if min(start, end, wall) < 0:
        assert_refused(argv, inputs=[path], watch=[path.parent], field=f"works[{index}].")
    elif end < start or abs(wall - (end - start)) > WALL_TOLERANCE_US:
        line = assert_refused(argv, inputs=[path], watch=[path.parent], field=f"MEASURED[0].works[{index}].wall_us")
        assert f"{wall} contradicts start_us {start} and end_us {end}" in line, line
    else:
        assert_clean(argv, inputs=[path], watch=[path.parent])


def test_a_document_error_outside_a_request_is_named_by_the_option(tmp_path, monkeypatch):
    """A refusal of the converted document that no trace line holds names the option that made it."""

    def refuse(document, field="computations"):
        raise ApiError("computations.kv_bytes_per_position", "refused")

    monkeypatch.setattr(analytic_documents, "parse_document", refuse)
    line = assert_refused(["kvsim", "synthesize", "--requests", "2", "--out", tmp_path / "c.json"],
                          watch=[tmp_path], field="--requests")  # fmt: skip
    assert "makes a document kvsim refuses: computations.kv_bytes_per_position: refused" in line, line
