"""`jgpt kvsim ...` (and `python -m kvsim ...`): run, replay, plot, perfetto, import-trace, synthesize,
calibrate, predict."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jgpt import progress
from jgpt.command_line import ArgumentParser
from jgpt.errors import ApiError
from jgpt.identity import read_bytes, write_atomically
from jgpt.output_paths import output_directory, output_file
from kvsim import analytic, traces
from kvsim.cache_run import (
    first_difference,
    load_json,
    read_record,
    record_chunks,
    record_json,
    rerun,
    run_id,
    simulate,
)
from kvsim.compute_service import SPREAD_REPEATS
from kvsim.inputs import load_input
from kvsim.perfetto import trace_chunks
from kvsim.record_lines import StreamedRun, is_streamed, pulled, replay_lines, streamed_view, whole_view, write_lines
from kvsim.record_view import check_viewable
from kvsim.recorded import document_json
from kvsim.summary import summary_table
from kvsim.synthetic import REQUEST_LIMIT, conversations


def _parser(command: str) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=f"jgpt {command}",
        description="KV residency and service simulator: deterministic, causal, replayable (see docs/kvsim.md)",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    run = sub.add_parser(
        "run",
        help="simulate INPUT.json, print a summary, optionally write the record",
        description="Simulate INPUT.json and print a summary (times and sizes in human units; "
        "--json and the record keep the exact numbers).",
    )
    run.add_argument("input", type=Path, metavar="INPUT.json", help="a kvsim input: system, computations, workload")
    run.add_argument(
        "--out",
        type=Path,
        metavar="RECORD.json",
        help="where to write the CacheRun record: whole JSON, or streamed JSON Lines (written while the "
        "run goes, for large runs) if the name ends in .jsonl",
    )
    run.add_argument(
        "--json", action="store_true", help="print the run's id and outcomes as JSON instead of the summary"
    )
    run.add_argument("--quiet", action="store_true", help="no progress on the terminal")
    replay = sub.add_parser("replay", help="re-run a record's declaration; exit 0 only if the bytes are identical")
    replay.add_argument(
        "record", type=Path, metavar="RECORD.json", help="a record written by `kvsim run --out` (.json or .jsonl)"
    )
    replay.add_argument(
        "--json", action="store_true", help="print the verdict as JSON on stdout (the exit code is the same)"
    )
    plot = sub.add_parser("plot", help="write occupancy, timeline and latency-CDF PNGs")
    plot.add_argument(
        "record", type=Path, metavar="RECORD.json", help="a record written by `kvsim run --out` (.json or .jsonl)"
    )
    plot.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help="directory for the PNGs (default: RECORD's name without .json, plus _plots)",
    )
    perfetto = sub.add_parser(
        "perfetto",
        help="write Chrome/Perfetto trace JSON: KV occupancy counters, compute and link slices, every event an instant",
    )
    perfetto.add_argument(
        "record", type=Path, metavar="RECORD.json", help="a record written by `kvsim run --out` (.json or .jsonl)"
    )
    perfetto.add_argument(
        "--out",
        type=Path,
        metavar="TRACE.json",
        help="where to write the trace (default: RECORD's name with .perfetto.json)",
    )
    trace = sub.add_parser(
        "import-trace", help="recorded computations (analytic counts) from a Mooncake or Azure trace"
    )
    trace.add_argument("trace", type=Path, metavar="TRACE", help="a Mooncake JSONL or Azure CSV trace file")
    trace.add_argument("--format", choices=traces.FORMATS, required=True, help="the trace's format")
    trace.add_argument(
        "--block-tokens", type=int, default=512, metavar="N", help="tokens per Mooncake hash block (at most --context)"
    )
    trace.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="COMPUTATIONS.json",
        help="where to write the recorded computation document",
    )
    _model_options(trace)
    synth = sub.add_parser("synthesize", help="recorded computations (analytic counts) of multi-turn conversations")
    synth.add_argument(
        "--requests",
        type=int,
        default=100,
        metavar="N",
        help=f"requests (turns of multi-turn conversations), at most {REQUEST_LIMIT:,}",
    )
    synth.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the synthetic conversations (>= 0)")
    synth.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="COMPUTATIONS.json",
        help="where to write the recorded computation document",
    )
    _model_options(synth)
    calibrate = sub.add_parser(
        "calibrate", help="fit the calibrated compute service and transfer to measured engine runs"
    )
    calibrate.add_argument(
        "measured", type=Path, nargs="+", metavar="MEASURED.json", help="measured-run documents (jgpt serve --out)"
    )
    calibrate.add_argument(
        "--out", type=Path, required=True, metavar="SERVICE.json", help="where to write the system fragment (JSON)"
    )
    calibrate.add_argument("--json", action="store_true", help="print the fragment as JSON instead of the fit table")
    calibrate.add_argument(
        "--without",
        action="append",
        default=[],
        choices=("finish", "spread", "after_other"),
        help="leave an optional term out of the fit (repeatable): the host time after a request ends, the "
        "per-work spread, the cost of a work after another kind of work (docs/kvsim.md, Calibrated service)",
    )
    forecast = sub.add_parser("predict", help="simulate a measured engine run and compare with it field by field")
    forecast.add_argument(
        "measured", type=Path, metavar="MEASURED.json", help="a measured-run document (jgpt serve --out)"
    )
    forecast.add_argument(
        "--service", type=Path, metavar="SERVICE.json", help="a fragment from calibrate (default: the run's own rates)"
    )
    forecast.add_argument(
        "--seeds",
        type=int,
        default=SPREAD_REPEATS,
        metavar="N",
        help="for a service with a spread: the prediction is each figure's median over N simulated "
        f"runs, the spread's seed counting up (default {SPREAD_REPEATS}, as bench/fidelity.py)",
    )
    forecast.add_argument(
        "--out",
        type=Path,
        metavar="RECORD.json",
        help="write the record of one simulated run, the spread's own seed (.jsonl: streamed)",
    )
    forecast.add_argument("--json", action="store_true", help="print the comparison as JSON")
    return parser


def _model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("analytic model (counts only, no weights)")
    group.add_argument("--layers", type=int, default=4, metavar="N", help="transformer blocks")
    group.add_argument("--width", type=int, default=128, metavar="N", help="channels of the residual stream")
    group.add_argument("--ffn", type=int, default=512, metavar="N", help="hidden units of each feed-forward block")
    group.add_argument("--vocabulary", type=int, default=260, metavar="N", help="token ids the model knows")
    group.add_argument("--precision-bytes", type=int, default=4, metavar="N", help="bytes per KV element")
    group.add_argument(
        "--context", type=int, default=4096, metavar="N", help="positions a request may use (prompt plus output)"
    )


def _model(args: argparse.Namespace) -> analytic.AnalyticModel:
    for name in ("layers", "width", "ffn", "vocabulary", "precision_bytes", "context"):
        if getattr(args, name) < 1:
            raise ApiError(f"--{name.replace('_', '-')}", "must be positive")
    return analytic.AnalyticModel(
        args.layers, args.width, args.ffn, args.vocabulary, args.precision_bytes, args.context
    )


def _json_bytes(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    if args.action == "run":
        if args.out:
            output_file(args.out, "--out", [args.input])
        with progress.shown(args.quiet):
            if args.out and args.out.suffix == ".jsonl":
                summary = _streamed(load_input(args.input, out=args.out), args.out)
            else:
                with progress.stage("simulating"):
                    run = simulate(**load_input(args.input, out=args.out))
                if args.out:
                    with progress.stage(f"writing {args.out}"):
                        write_atomically(args.out, record_chunks(run))
                summary = {"id": run_id(run), "outcomes": run.outcomes}
        if args.json:
            print(json.dumps(summary | {"record": None if args.out is None else str(args.out)}, indent=1))
            return 0
        print(summary_table(summary))
        if args.out:
            print(f"record written to {args.out}")
        return 0
    if args.action == "replay" and is_streamed(args.record, "RECORD"):
        return _replay_lines(args)
    if args.action == "replay":
        data = read_bytes(args.record, "RECORD")
        recorded = read_record(data)
        replayed = record_json(rerun(recorded))
        difference = None if replayed == data else first_difference(recorded, json.loads(replayed))
        if args.json:
            print(
                json.dumps(
                    {
                        "id": recorded["id"],
                        "identical": difference is None,
                        "bytes": len(data),
                        "events": len(recorded["events"]),
                        "difference": difference,
                    },
                    indent=1,
                )
            )
        elif difference is None:
            print(f"replay of {recorded['id']}: byte-identical ({len(data)} bytes, {len(recorded['events'])} events)")
        else:
            print(f"replay of {recorded['id']} differs: {difference}", file=sys.stderr)
        return 0 if difference is None else 1
    if args.action == "plot":
        directory = output_directory(args.out_dir or args.record.with_name(args.record.stem + "_plots"), "--out-dir")
        from kvsim.cache_run_plots import write_plots

        for path in write_plots(_view(args.record), directory):
            print(path)
        return 0
    if args.action == "perfetto":
        out = output_file(
            args.out or args.record.with_name(args.record.stem + ".perfetto.json"), "--out", [args.record]
        )
        write_atomically(out, trace_chunks(_view(args.record)))
        print(f"{out} (open in https://ui.perfetto.dev)")
        return 0
    if args.action in ("calibrate", "predict"):
        return _fidelity(args)
    model = _model(args)
    output_file(args.out, "--out", [getattr(args, "trace", None)])
    if args.action == "import-trace":
        if not 1 <= args.block_tokens <= model.context:
            raise ApiError("--block-tokens", f"must be in [1, --context {model.context}], got {args.block_tokens}")
        text = read_bytes(args.trace, "TRACE").decode("utf-8", errors="replace")
        items = (
            traces.mooncake(text, args.block_tokens, model.context)
            if args.format == "mooncake"
            else traces.azure(text, model.context)
        )
        source = f"{args.format} trace {args.trace.name}"
    else:
        if not 1 <= args.requests <= REQUEST_LIMIT:
            raise ApiError("--requests", f"must be in [1, {REQUEST_LIMIT}], got {args.requests}")
        if args.seed < 0:  # random.Random(-n) is random.Random(n): two seeds, one workload
            raise ApiError("--seed", f"must be >= 0, got {args.seed}")
        items = conversations(args.requests, args.seed)
        source = f"kvsim.synthetic conversations(requests={args.requests}, seed={args.seed})"
    if not items:
        raise ApiError("TRACE", "no requests")
    write_atomically(args.out, _json_bytes(document_json(analytic.analytic_computations(model, items, source))))
    print(f"{len(items)} requests written to {args.out}")
    return 0


def _streamed(inputs: dict, out: Path) -> dict:
    """Simulate while the streamed record is written (kvsim.record_lines); the summary's id and totals."""
    done: list[StreamedRun] = []
    with progress.stage(f"simulating, writing {out}"):
        write_atomically(out, pulled(lambda write: done.append(write_lines(write, **inputs))))
    return {"id": done[0].id, "outcomes": done[0].outcomes}


def _replay_lines(args: argparse.Namespace) -> int:
    replay = replay_lines(args.record)
    if args.json:
        print(json.dumps({"id": replay.id, "identical": replay.identical, "bytes": replay.bytes, "lines": replay.lines,
                          "difference": replay.difference}, indent=1))  # fmt: skip
    elif replay.identical:
        print(f"replay of {replay.id}: byte-identical ({replay.bytes} bytes, {replay.lines} lines)")
    else:
        print(f"replay of {args.record} differs: {replay.difference}", file=sys.stderr)
    return 0 if replay.identical else 1


def _view(path: Path) -> Iterator[tuple[str, Any]]:
    """The entries plot and perfetto draw: a streamed record read line by line, or a whole one read and checked."""
    if is_streamed(path, "RECORD"):
        return streamed_view(path)
    return whole_view(check_viewable(read_record(read_bytes(path, "RECORD"))))


def _fidelity(args: argparse.Namespace) -> int:
    """calibrate and predict (numpy fits the parameters, so it is imported only here)."""
    from kvsim.calibration import OPTIONAL_TERMS, fit, fit_table, load_measured_run, read_service
    from kvsim.fidelity import compare, comparison_table, predicted_inputs, predicted_totals, spread_seeds

    if args.action == "calibrate":
        output_file(args.out, "--out", args.measured)
        measured = [load_measured_run(path, f"MEASURED[{i}]") for i, path in enumerate(args.measured)]
        fragment, fits, notes = fit(measured, tuple(term for term in OPTIONAL_TERMS if term not in args.without))
        write_atomically(args.out, (json.dumps(fragment, indent=1) + "\n").encode())
        if args.json:
            print(json.dumps(fragment, indent=1))
            return 0
        print(fit_table(fits, notes))
        print(f"service fragment written to {args.out}")
        return 0
    if args.seeds < 1:
        raise ApiError("--seeds", f"must be at least 1, got {args.seeds}")
    if args.out:
        output_file(args.out, "--out", [args.measured, args.service])
    run = load_measured_run(args.measured, "MEASURED")
    service = (
        None if args.service is None else read_service(load_json(read_bytes(args.service, "--service"), "--service"))
    )
    seeds = spread_seeds(run, service, args.seeds)
    rows = compare(run.document["totals"], predicted_totals(run, service, args.seeds))
    if args.out and args.out.suffix == ".jsonl":
        _streamed(predicted_inputs(run, service), args.out)
    elif args.out:
        write_atomically(args.out, record_chunks(simulate(**predicted_inputs(run, service))))
    if args.json:
        print(json.dumps([row.to_json() for row in rows], indent=1))
        return 0
    runs = (
        f"median over {len(seeds)} simulated runs, spread seeds {seeds[0]}-{seeds[-1]}"
        if seeds
        else "one simulated run"
    )
    print(
        f"{args.measured}: measured vs kvsim ({'calibrated: ' + str(args.service) if service else 'own rates'}; {runs})"
    )
    print(comparison_table(rows))
    if args.out:
        print(f"record written to {args.out}: one simulated run" + (f", spread seed {seeds[0]}" if seeds else ""))
    return 0
