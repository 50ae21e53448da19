"""`jgpt kvsim ...` (and `python -m kvsim ...`): run, replay, plot, perfetto, import-trace, synthesize,
calibrate, predict."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jgpt.foundation import progress
from jgpt.foundation.command_line import ArgumentParser
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import READ_LIMIT, read_bytes, write_atomically
from jgpt.foundation.output_paths import output_directory, output_file
from jgpt.foundation.validation import LIMIT
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
from kvsim.record_lines import StreamedRun, is_streamed, pulled, streamed_view, whole_view, write_lines
from kvsim.record_view import check_viewable
from kvsim.recorded import RecordedComputations, document_json, parse_document
from kvsim.streamed_replay import replay_lines
from kvsim.summary import summary_table
from kvsim.synthetic import REQUEST_LIMIT, conversations

# The analytic model's sizes, as `import-hf` bounds a config's (jgpt.artifacts.hf_import.DIMENSION_LIMIT); their
# products are bounded too (`_model`).
DIMENSION_LIMIT = 1 << 20
PRECISION_BYTES_LIMIT = 8  # float64
# Simulated runs `predict --seeds` takes the median of (each a whole simulation; bench/fidelity.py uses 5).
SEEDS_LIMIT = 1000
# Every numeric option's range (the name as argparse stores it): checked before anything is read or
# allocated. --block-tokens is also at most --context.
OPTION_RANGES = {
    "requests": (1, REQUEST_LIMIT),
    "seed": (0, LIMIT),
    "seeds": (1, SEEDS_LIMIT),
    "block_tokens": (1, DIMENSION_LIMIT),
    "layers": (1, DIMENSION_LIMIT),
    "width": (1, DIMENSION_LIMIT),
    "ffn": (1, DIMENSION_LIMIT),
    "vocabulary": (1, DIMENSION_LIMIT),
    "context": (1, DIMENSION_LIMIT),
    "precision_bytes": (1, PRECISION_BYTES_LIMIT),
}


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
    synth.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of the synthetic conversations (0 to 2^53)"
    )
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
        f"runs, the spread's seed counting up (default {SPREAD_REPEATS}, as bench/fidelity.py; at most {SEEDS_LIMIT})",
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
    limit = f"at most {DIMENSION_LIMIT:,}"
    group.add_argument("--layers", type=int, default=4, metavar="N", help=f"transformer blocks ({limit})")
    group.add_argument("--width", type=int, default=128, metavar="N", help=f"channels of the residual stream ({limit})")
    group.add_argument(
        "--ffn", type=int, default=512, metavar="N", help=f"hidden units of each feed-forward block ({limit})"
    )
    group.add_argument("--vocabulary", type=int, default=260, metavar="N", help=f"token ids the model knows ({limit})")
    group.add_argument(
        "--precision-bytes",
        type=int,
        default=4,
        metavar="N",
        help=f"bytes per KV element (at most {PRECISION_BYTES_LIMIT})",
    )
    group.add_argument(
        "--context",
        type=int,
        default=4096,
        metavar="N",
        help=f"positions a request may use, prompt plus output ({limit})",
    )


def _check_ranges(args: argparse.Namespace) -> None:
    """Every numeric option the action has within OPTION_RANGES, before anything is read or allocated: an
    unbounded --seeds was a MemoryError traceback, model sizes made documents kvsim then refused."""
    for name, (minimum, maximum) in OPTION_RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not minimum <= value <= maximum:
            flag = "--" + name.replace("_", "-")
            raise ApiError(flag, f"must be at least {minimum} and at most {maximum}, got {value}")


def _model(args: argparse.Namespace) -> analytic.AnalyticModel:
    """The analytic model of the options; refused when a count it gives one request is past what kvsim reads."""
    model = analytic.AnalyticModel(
        args.layers, args.width, args.ffn, args.vocabulary, args.precision_bytes, args.context
    )
    # The largest counts: a whole context's prefill FLOPs (more than any one position's or decode step's; a
    # position's grow by the same step each) and a decode step's bytes at the last position (every weight and
    # the whole context's KV).
    context, first = model.context, model.position_flops(0)
    flops = first * context + (model.position_flops(1) - first) * context * (context - 1) // 2 + model.logits_flops
    memory = model.weight_bytes + model.context * model.kv_bytes_per_position
    if max(flops, memory) > LIMIT:
        options = " ".join(
            f"--{name.replace('_', '-')} {getattr(args, name)}"
            for name in ("layers", "width", "ffn", "vocabulary", "precision_bytes", "context")
        )
        raise ApiError(
            "analytic model",
            f"{options} give a request {flops} FLOPs and {memory} bytes, past the 2^53 kvsim reads; choose "
            "smaller sizes",
        )
    return model


def _json_bytes(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    _check_ranges(args)
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
    if args.action == "import-trace" and args.block_tokens > args.context:
        raise ApiError("--block-tokens", f"must be in [1, --context {args.context}], got {args.block_tokens}")
    model = _model(args)
    output_file(args.out, "--out", [getattr(args, "trace", None)])
    if args.action == "import-trace":
        text = read_bytes(args.trace, "TRACE").decode("utf-8", errors="replace")
        trace = traces.read_trace(args.format, text, args.block_tokens, model.context)
        if not trace.items:
            raise ApiError("TRACE", "no requests")
        items, field, named = trace.items, "TRACE", _trace_field(trace, args.format)
        source = f"{args.format} trace {args.trace.name}"
    else:
        items, field, named = conversations(args.requests, args.seed), "--requests", _unnamed
        source = f"kvsim.synthetic conversations(requests={args.requests}, seed={args.seed})"
    write_atomically(args.out, _readable(analytic.analytic_computations(model, items, source), field, named))
    print(f"{len(items)} requests written to {args.out}")
    return 0


def _readable(computations: RecordedComputations, field: str, named: Callable[[ApiError], ApiError | None]) -> bytes:
    """The document's bytes, once kvsim's own reader has accepted them (what an import writes, `kvsim run` must
    read): a refusal names where the refused value came from (`named(error)`), else `field`."""
    document = document_json(computations)
    try:
        parse_document(document)
    except ApiError as error:
        raise named(error) or ApiError(field, f"makes a document kvsim refuses: {error}") from None
    data = _json_bytes(document)
    if len(data) > READ_LIMIT:
        raise ApiError(field, f"makes a {len(data)}-byte document, more than the {READ_LIMIT} kvsim reads")
    return data


_REQUEST_MEMBER = re.compile(r"^computations\.requests\[(\d+)\]\.([a-z_]+)")


def _unnamed(error: ApiError) -> None:
    return None


def _trace_field(trace: traces.Trace, form: str) -> Callable[[ApiError], ApiError | None]:
    """A refusal of the converted document as the trace line and column the refused value came from."""

    def named(error: ApiError) -> ApiError | None:
        found = _REQUEST_MEMBER.match(error.field)
        if found is None:
            return None
        line, member = trace.lines[int(found[1])], found[2]
        column = traces.COLUMNS[form].get(member)
        return ApiError(
            line if column is None else f"{line}.{column}",
            f"converts to {error.field.removeprefix('computations.')}, which kvsim refuses: {error.reason}",
        )

    return named


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
    from kvsim.calibration import OPTIONAL_TERMS, fit, fit_table, read_service
    from kvsim.fidelity import compare, comparison_table, predicted_inputs, predicted_totals, spread_seeds
    from kvsim.measured_run import load_measured_run

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
