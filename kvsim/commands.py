"""`jgpt kvsim ...` (and `python -m kvsim ...`): run, replay, plot, perfetto, import-trace, synthesize,
calibrate, predict."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jgpt.foundation import progress
from jgpt.foundation.command_line import ArgumentParser
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes, write_atomically
from jgpt.foundation.output_paths import output_directory, output_file
from jgpt.foundation.validation import LIMIT
from kvsim import analytic, traces, workload_shape
from kvsim.analytic_documents import (
    DIMENSION_LIMIT,
    MODEL_SIZES,
    PRECISION_BYTES_LIMIT,
    Naming,
    bounded_model,
    document_bytes,
    sized_model,
    trace_field,
)
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
from kvsim.cache_run_plots import TIMELINE_LIMIT
from kvsim.compute_service import SPREAD_REPEATS
from kvsim.inputs import compose_input, load_input
from kvsim.model_config import config_file, read_model_config
from kvsim.perfetto import trace_chunks
from kvsim.record_lines import StreamedRun, is_streamed, pulled, streamed_view, whole_view, write_lines
from kvsim.record_view import check_viewable
from kvsim.recorded import RecordedComputations
from kvsim.streamed_replay import replay_lines
from kvsim.summary import summary_table
from kvsim.synthetic import REQUEST_LIMIT, shape_summary, synthesize

# Simulated runs `predict --seeds` takes the median of (each a whole simulation; bench/fidelity.py uses 5).
SEEDS_LIMIT = 1000
# Every numeric option's range (the name as argparse stores it): checked before anything is read or
# allocated. --block-tokens is also at most --context.
OPTION_RANGES = {
    "requests": (1, REQUEST_LIMIT),
    "max_new_tokens": (1, DIMENSION_LIMIT),
    "system_prompts": (0, workload_shape.SYSTEMS_LIMIT),
    "system_tokens": (0, DIMENSION_LIMIT),
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


@dataclass(frozen=True)
class Action:
    """One `jgpt kvsim ACTION`: its line in the action list, what adds its arguments, and what runs it."""

    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None  # the action's --help text above its arguments


def _parser(command: str) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=f"jgpt {command}",
        description="KV residency and service simulator: deterministic, causal, replayable (see docs/kvsim.md)",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, action in ACTIONS.items():
        action.add_arguments(actions.add_parser(name, help=action.summary, description=action.description))
    return parser


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "input",
        type=Path,
        nargs="?",
        metavar="INPUT.json",
        help="a kvsim input: system, computations, workload in one file (or give the parts below)",
    )
    parts = parser.add_argument_group("the input's parts, instead of INPUT.json (the same run and record)")
    parts.add_argument(
        "--system", type=Path, metavar="SYSTEM.json", help="the system (KVResidencySystemConfig; jgpt serve --system)"
    )
    parts.add_argument(
        "--computations",
        type=Path,
        metavar="C.json",
        help="the recorded computation document (jgpt record, kvsim synthesize, kvsim import-trace)",
    )
    parts.add_argument(
        "--workload",
        type=Path,
        metavar="W.json",
        help="arrivals in place of the document's own: kvsim's Workload, or the Workload document of jgpt record "
        "and jgpt serve (its customer_interaction too)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="RECORD.json",
        help="where to write the CacheRun record: whole JSON, or streamed JSON Lines (written while the "
        "run goes, for large runs) if the name ends in .jsonl",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the run's id and outcomes as JSON instead of the summary"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on the terminal")


def _record_argument(parser: argparse.ArgumentParser) -> None:
    """The record that replay, plot and perfetto read."""
    parser.add_argument(
        "record", type=Path, metavar="RECORD.json", help="a record written by `kvsim run --out` (.json or .jsonl)"
    )


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    _record_argument(parser)
    parser.add_argument(
        "--json", action="store_true", help="print the verdict as JSON on stdout (the exit code is the same)"
    )


def _plot_arguments(parser: argparse.ArgumentParser) -> None:
    _record_argument(parser)
    parser.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help="directory for the PNGs (default: RECORD's name without .json, plus _plots)",
    )
    parser.add_argument(
        "--requests",
        dest="timeline_requests",
        default=str(TIMELINE_LIMIT),
        metavar="N|all",
        help=f"requests the timeline draws, the earliest arrivals (default {TIMELINE_LIMIT:,}, which takes seconds; "
        "all: every one). The occupancy and latency views always cover the whole run",
    )


def _perfetto_arguments(parser: argparse.ArgumentParser) -> None:
    _record_argument(parser)
    parser.add_argument(
        "--out",
        type=Path,
        metavar="TRACE.json",
        help="where to write the trace (default: RECORD's name with .perfetto.json)",
    )


def _import_trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path, metavar="TRACE", help="a Mooncake JSONL or Azure CSV trace file")
    parser.add_argument("--format", choices=traces.FORMATS, required=True, help="the trace's format")
    parser.add_argument(
        "--block-tokens", type=int, default=512, metavar="N", help="tokens per Mooncake hash block (at most --context)"
    )
    _computations_options(parser)


def _synthesize_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--requests",
        type=int,
        default=100,
        metavar="N",
        help=f"requests (turns of multi-turn conversations), at most {REQUEST_LIMIT:,}",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of the synthetic conversations (0 to 2^53)"
    )
    workload_shape.add_arguments(parser)
    _computations_options(parser)


def _computations_options(parser: argparse.ArgumentParser) -> None:
    """What import-trace and synthesize write, and the analytic model that counts its works."""
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="COMPUTATIONS.json",
        help="where to write the recorded computation document",
    )
    _model_options(parser)


def _calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "measured", type=Path, nargs="+", metavar="MEASURED.json", help="measured-run documents (jgpt serve --out)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, metavar="SERVICE.json", help="where to write the system fragment (JSON)"
    )
    parser.add_argument("--json", action="store_true", help="print the fragment as JSON instead of the fit table")
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        choices=("finish", "spread", "after_other"),
        help="leave an optional term out of the fit (repeatable): the host time after a request ends, the "
        "per-work spread, the cost of a work after another kind of work (docs/kvsim-calibration.md)",
    )


def _predict_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "measured", type=Path, metavar="MEASURED.json", help="a measured-run document (jgpt serve --out)"
    )
    parser.add_argument(
        "--service", type=Path, metavar="SERVICE.json", help="a fragment from calibrate (default: the run's own rates)"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=SPREAD_REPEATS,
        metavar="N",
        help="for a service with a spread: the prediction is each figure's median over N simulated "
        f"runs, the spread's seed counting up (default {SPREAD_REPEATS}, as bench/fidelity.py; at most {SEEDS_LIMIT})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="RECORD.json",
        help="write the record of one simulated run, the spread's own seed (.jsonl: streamed)",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def _model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "analytic model (counts only, no weights): --model-config, or the sizes of a GPT-2-shaped model"
    )
    group.add_argument(
        "--model-config",
        type=Path,
        metavar="PATH",
        help="the architecture to count: a jgpt artifact directory, a jgpt architecture JSON, or a Hugging Face "
        "config.json (or its directory) of a gpt2, llama, mistral or qwen2 model (docs/kvsim.md, analytic counts)",
    )
    limit = f"at most {DIMENSION_LIMIT:,}"
    sized = lambda name, help: f"{help} (default {MODEL_SIZES[name]}; {limit})"
    # No argparse default: a size given beside --model-config is refused rather than ignored (`_model`).
    quiet = argparse.SUPPRESS
    group.add_argument("--layers", type=int, default=quiet, metavar="N", help=sized("layers", "transformer blocks"))
    group.add_argument(
        "--width", type=int, default=quiet, metavar="N", help=sized("width", "channels of the residual stream")
    )
    group.add_argument(
        "--ffn", type=int, default=quiet, metavar="N", help=sized("ffn", "hidden units of each feed-forward block")
    )
    group.add_argument(
        "--vocabulary", type=int, default=quiet, metavar="N", help=sized("vocabulary", "token ids the model knows")
    )
    group.add_argument(
        "--precision-bytes",
        type=int,
        default=quiet,
        metavar="N",
        help=f"bytes per KV and weight-matrix element (default {MODEL_SIZES['precision_bytes']}; at most "
        f"{PRECISION_BYTES_LIMIT})",
    )
    group.add_argument(
        "--context",
        type=int,
        default=quiet,
        metavar="N",
        help=sized("context", "positions a request may use, prompt plus output"),
    )


def _check_ranges(args: argparse.Namespace) -> None:
    """Every numeric option the action has within OPTION_RANGES, before anything is read or allocated: an
    unbounded --seeds was a MemoryError traceback, model sizes made documents kvsim then refused."""
    for name, (minimum, maximum) in OPTION_RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not minimum <= value <= maximum:
            flag = "--" + name.replace("_", "-")
            raise ApiError(flag, f"must be at least {minimum} and at most {maximum}, got {value}")


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    _check_ranges(args)
    return ACTIONS[args.action].run(args)


def _run(args: argparse.Namespace) -> int:
    read = [args.input] if args.input else [args.system, args.computations, args.workload]
    if args.out:
        output_file(args.out, "--out", [path for path in read if path])
    with progress.shown(args.quiet):
        inputs = _inputs(args)
        if args.out and args.out.suffix == ".jsonl":
            summary = _streamed(inputs, args.out)
        else:
            with progress.stage("simulating"):
                run = simulate(**inputs)
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


def _inputs(args: argparse.Namespace) -> dict:
    """`simulate`'s arguments from INPUT.json or from the parts the flags name, never both."""
    parts = [f"--{name}" for name in ("system", "computations", "workload") if getattr(args, name)]
    if args.input and parts:
        raise ApiError(parts[0], "give INPUT.json or its parts (--system, --computations, --workload), not both")
    if args.input:
        return load_input(args.input, out=args.out)
    for name in ("system", "computations"):
        if not getattr(args, name):
            raise ApiError(f"--{name}", "needed: give INPUT.json, or --system and --computations")
    return compose_input(args.system, args.computations, args.workload)


def _replay(args: argparse.Namespace) -> int:
    if is_streamed(args.record, "RECORD"):
        return _replay_lines(args)
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


def _plot(args: argparse.Namespace) -> int:
    limit = None if args.timeline_requests == "all" else _count(args.timeline_requests, "--requests")
    directory = output_directory(args.out_dir or args.record.with_name(args.record.stem + "_plots"), "--out-dir")
    from kvsim.cache_run_plots import write_plots

    for plot in write_plots(_view(args.record), directory, limit):
        print(f"{plot.path}: {plot.note}")
    return 0


def _count(text: str, option: str) -> int:
    if not text.isdecimal() or not 1 <= int(text) <= LIMIT:
        raise ApiError(option, f"expected a whole number from 1 to 2^53, or all; got {text!r}")
    return int(text)


def _perfetto(args: argparse.Namespace) -> int:
    out = output_file(args.out or args.record.with_name(args.record.stem + ".perfetto.json"), "--out", [args.record])
    write_atomically(out, trace_chunks(_view(args.record)))
    print(f"{out} (open in https://ui.perfetto.dev)")
    return 0


def _import_trace(args: argparse.Namespace) -> int:
    output_file(args.out, "--out", [args.trace, *_model_files(args)])
    model = _model(args)
    if args.block_tokens > model.context:
        raise ApiError("--block-tokens", f"must be in [1, the context {model.context}], got {args.block_tokens}")
    text = read_bytes(args.trace, "TRACE").decode("utf-8", errors="replace")
    trace = traces.read_trace(args.format, text, args.block_tokens, model.context)
    if not trace.items:
        raise ApiError("TRACE", "no requests")
    source = f"{args.format} trace {args.trace.name}"
    computations = analytic.analytic_computations(model, trace.items, source)
    return _write_computations(args.out, computations, "TRACE", trace_field(trace, args.format))


def _synthesize(args: argparse.Namespace) -> int:
    output_file(args.out, "--out", _model_files(args))  # before the model config or any trace is read
    model = _model(args)
    mix, traces_read = workload_shape.mix(args, model.context)
    output_file(args.out, "--out", [*_model_files(args), *traces_read])
    made = synthesize(args.requests, args.seed, mix)
    source = workload_shape.command_line(args)
    _write_computations(args.out, analytic.analytic_computations(model, made.items, source), "--requests")
    print(shape_summary(made, mix, args.rate))
    return 0


def _model_files(args: argparse.Namespace) -> list[Path]:
    """The file --model-config reads, if given: an input --out must not be."""
    return [] if args.model_config is None else [config_file(args.model_config)]


def _model(args: argparse.Namespace) -> analytic.AnalyticModel:
    """The analytic model --model-config reads, or the one the size options (or their defaults) give."""
    given = [name for name in MODEL_SIZES if hasattr(args, name)]
    if args.model_config is not None:
        if given:
            raise ApiError(_flag(given[0]), "is read from --model-config; give one or the other")
        return bounded_model(read_model_config(args.model_config), f"--model-config {args.model_config}")
    sizes = {name: getattr(args, name, default) for name, default in MODEL_SIZES.items()}
    return bounded_model(sized_model(sizes), " ".join(f"{_flag(name)} {value}" for name, value in sizes.items()))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _write_computations(out: Path, computations: RecordedComputations, field: str, named: Naming | None = None) -> int:
    write_atomically(out, document_bytes(computations, field, named))
    print(f"{len(computations.requests)} requests written to {out}")
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


def _calibrate(args: argparse.Namespace) -> int:
    """calibrate (numpy fits the parameters, so it is imported only here)."""
    from kvsim.calibration import OPTIONAL_TERMS, fit, fit_table
    from kvsim.measured_run import load_measured_run

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


def _predict(args: argparse.Namespace) -> int:
    """predict (numpy draws the noise band and reads the service, so it is imported only here)."""
    from kvsim.calibration import read_service
    from kvsim.fidelity import compare, comparison_table, predicted_inputs, predicted_totals, spread_seeds
    from kvsim.measured_run import load_measured_run

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


# In the order `jgpt kvsim --help` lists them.
ACTIONS = {
    "run": Action(
        "simulate INPUT.json (or --system and --computations), print a summary, optionally write the record",
        _run_arguments,
        _run,
        "Simulate INPUT.json, or the parts --system S.json --computations C.json [--workload W.json] make, and "
        "print a summary (times and sizes in human units; --json and the record keep the exact numbers).",
    ),
    "replay": Action(
        "re-run a record's declaration; exit 0 only if the bytes are identical", _replay_arguments, _replay
    ),
    "plot": Action("write occupancy, timeline and latency-CDF PNGs", _plot_arguments, _plot),
    "perfetto": Action(
        "write Chrome/Perfetto trace JSON: KV occupancy counters, compute and link slices, every event an instant",
        _perfetto_arguments,
        _perfetto,
    ),
    "import-trace": Action(
        "recorded computations (analytic counts) from a Mooncake or Azure trace", _import_trace_arguments, _import_trace
    ),
    "synthesize": Action(
        "recorded computations (analytic counts) of multi-turn conversations", _synthesize_arguments, _synthesize
    ),
    "calibrate": Action(
        "fit the calibrated compute service and transfer to measured engine runs", _calibrate_arguments, _calibrate
    ),
    "predict": Action(
        "simulate a measured engine run and compare with it field by field", _predict_arguments, _predict
    ),
}
