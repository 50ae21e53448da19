"""`jgpt lab list | show LAB | run LAB --out DIR | sweep LAB --grid ... --out DIR | replay RECORD` and
`jgpt report RECORD --out report.html`. LAB is a built-in lab id or the path of a lab file."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from experiments.arm_pool import RAY_EXTRA, ArmPool
from experiments.experiment_design import ExperimentCatalog, ExperimentDesign, default_catalog, find_lab
from jgpt.foundation import progress
from jgpt.foundation.command_line import ArgumentParser
from jgpt.foundation.errors import ApiError
from jgpt.foundation.output_paths import output_directory, output_file
from jgpt.foundation.units import byte_size, duration_us


def main(command: str, argv: list[str]) -> int:
    return {"lab": _lab, "report": _report}[command](command, argv)


def _lab(command: str, argv: list[str]) -> int:
    args = _lab_parser(command).parse_args(argv)
    if args.action == "replay":
        return _replay(args.record, as_json=args.json)
    if args.action == "list":
        return _list(_catalog_in(args.dir), as_json=args.json)
    lab = find_lab(args.lab)
    if args.action == "show":
        print(json.dumps(lab.to_json(), indent=1) if args.json else describe(lab))
        return 0
    if args.action == "sweep":
        lab = _swept(lab, args.grid)
    return _run(lab, args)


def _catalog_in(directory: Path | None) -> ExperimentCatalog:
    """The built-in labs, or every lab file in `directory` (errors name each file by its path)."""
    if directory is None:
        return default_catalog()
    if not directory.is_dir():
        raise ApiError("--dir", f"{directory} is not a directory")
    catalog = default_catalog(directory, shown=str)
    if not catalog.experiments:
        raise ApiError("--dir", f"{directory} holds no lab file (*.json)")
    return catalog


def _swept(lab: ExperimentDesign, grid: list[str]) -> ExperimentDesign:
    from experiments.lab_grid import gridded, parse_axis

    swept, notes = gridded(lab, [parse_axis(text) for text in grid])
    for note in notes:
        print(note, file=sys.stderr)
    return swept


def _lab_parser(command: str) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=f"jgpt {command}",
        description="List, explain, run and sweep labs: the built-in catalog's (by id) or lab files of your own\n"
        "(by path: " + LAB_REFERENCE + ").",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for add in (_add_list, _add_show, _add_run, _add_sweep, _add_replay):  # the order `jgpt lab --help` lists them in
        add(actions)
    return parser


def _add_list(actions) -> None:
    listed = actions.add_parser("list", help="every lab: id, status and question")
    listed.add_argument("--json", action="store_true", help="print every lab's id, status and question as JSON")
    listed.add_argument(
        "--dir", type=Path, metavar="DIR", help="list the lab files (*.json) in DIR, each validated, instead"
    )


def _add_show(actions) -> None:
    show = actions.add_parser("show", help="one lab's question, controls, contract and sources")
    show.add_argument("lab", metavar="LAB", help=LAB_HELP)
    show.add_argument("--json", action="store_true", help="print the lab file's validated JSON")


def _add_run(actions) -> None:
    run = actions.add_parser(
        "run",
        help="run a lab end to end and write its record, summary and plots",
        description="Run a lab end to end; print each arm's figures (times and sizes in human\n"
        "units; --json and summary.json keep the exact numbers).",
    )
    _add_run_options(run)


def _add_sweep(actions) -> None:
    sweep = actions.add_parser(
        "sweep",
        help="run a lab over a grid of control values (each --grid one more sweep axis)",
        description=SWEEP_HELP,
    )
    _add_run_options(sweep)
    sweep.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="CONTROL=V1,V2,...",
        help="one axis: a control of `jgpt lab show` and its values, written as in a lab file",
    )


def _add_run_options(run) -> None:
    run.add_argument("lab", metavar="LAB", help=LAB_HELP)
    run.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="directory for record.json, summary.json and plots"
    )
    run.add_argument(
        "--kernels",
        choices=("auto", "xla"),
        default="auto",
        help="auto: jgpt's decode kernels where this CPU runs them (AVX-512F); xla: the pure-JAX reference "
        "(the plan each recording ran with is recorded as recordings[].kernels)",
    )
    run.add_argument("--no-report", action="store_true", help="skip writing report.html")
    run.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    run.add_argument("--quiet", action="store_true", help="no progress on the terminal")
    run.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="simulate the kvsim arms in N local worker processes (default 1: one after another, here); "
        "engine and generate arms are always measured here, one at a time. The record is the same bytes",
    )
    run.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="simulate the kvsim arms as tasks on the Ray cluster at ADDRESS, or on a local Ray instance started "
        "for the run with 'local' (of --workers CPUs if given); needs " + RAY_EXTRA,
    )


def _add_replay(actions) -> None:
    replayed = actions.add_parser(
        "replay", help="check a record against its files and simulate every arm again", description=REPLAY_PROVES
    )
    replayed.add_argument("record", type=Path, metavar="RECORD.json", help="record.json written by `jgpt lab run`")
    replayed.add_argument("--json", action="store_true", help="print what was checked as JSON")


def _replay(record_path: Path, *, as_json: bool) -> int:
    # Start-up cost only: `lab list` and `lab show` load none of what a replay reads records with.
    from experiments.experiment_replay import replay
    from experiments.record_integrity import model_bindings

    record = replay(record_path)
    notes = model_bindings(record)
    measured = sum("measured_run" in arm for arm in record["arms"])
    if as_json:
        checked = {
            "id": record["id"],
            "arms_replayed": len(record["arms"]) - measured,
            "measured_runs_checked": measured,
            "notes": notes,
        }
        print(json.dumps(checked, indent=1))
        return 0
    simulated = f"{len(record['arms']) - measured} arms replayed byte for byte"
    checked_runs = f", {measured} engine arms' measured runs checked (not re-measured)" if measured else ""
    print(
        f"{record['id']}: {simulated}{checked_runs}; id, bindings, provenance and "
        f"observed sequences derive from the recorded computations"
    )
    for note in notes:
        print(note)
    return 0


def _list(catalog: ExperimentCatalog, *, as_json: bool) -> int:
    if as_json:
        labs = [
            {
                "id": lab.id,
                "planned": lab.planned,
                "arms": 0 if lab.planned else len(lab.arms()),
                "question": lab.question,
            }
            for lab in catalog.experiments
        ]
        print(json.dumps(labs, indent=1))
        return 0
    width = max(len(lab.id) for lab in catalog.experiments)
    for lab in catalog.experiments:
        status = "planned" if lab.planned else f"{len(lab.arms())} arm{'s' * (len(lab.arms()) > 1)}"
        print(f"{lab.id:<{width}}  {status:<8}  {lab.question}")
    return 0


def _run(lab: ExperimentDesign, args: argparse.Namespace) -> int:
    lab.refuse_if_planned()
    pool = ArmPool(args.workers, args.ray)
    output_directory(args.out, "--out")
    with progress.shown(args.quiet):
        with progress.stage("starting jax"):  # the run's first seconds, before it records anything
            import jax  # noqa: F401

            from experiments.experiment_execution import run_lab
            from experiments.record_summary import summary
            from jgpt.kernels.plan import Kernels

        outcome = run_lab(lab, args.out, report=not args.no_report, kernels=Kernels.named(args.kernels), pool=pool)
    figures = summary(outcome.record)
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    print(summary_text(figures))
    plans = (f"  kernels of {r['model']['model_id']}: {Kernels(**r['kernels'])}" for r in outcome.record["recordings"])
    print("\n".join(dict.fromkeys(plans)))
    print(f"{len(outcome.written)} files in {outcome.directory}: {', '.join(p.name for p in outcome.written)}")
    return 0


def summary_text(figures: dict) -> str:
    """summary.json as a table a person reads: one row per arm, times and sizes in human units."""
    if all("decode_tokens_per_s" in arm for arm in figures["arms"]):  # generate arms (experiments/decoding_arms.py)
        columns: tuple[str, ...] = ("arm", "accepted", "ids/round", "decode tok/s", "vs greedy", "ids")
        rows = [columns] + [
            (
                arm["label"],
                _rate(arm["acceptance_rate"]),
                _number(arm["ids_per_round"], ".2f"),
                _number(arm["decode_tokens_per_s"], ".1f"),
                _number(arm["vs_greedy"], ".2f", "x"),
                "same as greedy" if arm["same_ids_as_greedy"] else "DIFFER FROM GREEDY",
            )
            for arm in figures["arms"]
        ]
    else:
        columns = (
            "arm",
            "completed",
            "rejected",
            "TTFT p50",
            "TTFT p90",
            "e2e p50",
            "per token p50",
            "queueing p90",
            "token hits",
            "host->device",
        )
        rows = [columns] + [
            (
                arm["label"],
                str(arm["completed"]),
                str(arm["rejected"]),
                duration_us(arm["ttft_p50_us"]),
                duration_us(arm["ttft_p90_us"]),
                duration_us(arm["e2e_p50_us"]),
                duration_us(arm["tpot_p50_us"]),
                duration_us(arm["queueing_p90_us"]),
                _rate(arm["token_hit_rate"]),
                byte_size(arm["bytes_host_to_device"]),
            )
            for arm in figures["arms"]
        ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = [f"{figures['lab']} ({figures['record']}): {figures['question']}"]
    if "answer" in figures:
        lines.append(f"  answer: {figures['answer']['text']}")
    lines += [
        "  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    sources = {arm["label"]: arm["source"] for arm in figures["arms"] if "source" in arm}
    if len(sources) > 1 and len(set(sources.values())) == 1:  # one line says it for every arm
        sources = {"every arm": next(iter(sources.values()))}
    lines += [f"  {label}: {source}" for label, source in sources.items()]
    return "\n".join(lines)


def _rate(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _number(value, form: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{form}}{unit}"


LAB_REFERENCE = "one with a '/' or ending in .json; an id never has either"
LAB_HELP = f"a lab id from `jgpt lab list`, or the path of a lab file ({LAB_REFERENCE})"
SWEEP_HELP = """\
Run a lab over a grid: each --grid CONTROL=V1,V2,... is one more axis of the lab's sweep, and
the arms are the product of the lab's axes and the grid's. Values are written as in a lab file
(numbers for numeric controls); one value sets the control in every arm. A grid over a control
the lab already assigns replaces that assignment (it says which on stderr); the record holds
the lab as swept and replays like any other.

  jgpt lab sweep host-tier-vs-recompute --out runs/grid \\
      --grid kv_cache.device_kv_bytes=262144,524288 --workers 2

The kvsim arms run in --workers local processes or on --ray; the record is the same bytes as a
serial run's."""

REPLAY_PROVES = """\
Replay proves: every file the record names lies in its directory and has the size and
SHA-256 the record gives; the record's id is the identity of the lab, arms and recorded
computations it consumed; its model bindings, each recording's kernel plan, provenance,
workload, inference controls, arm labels and architecture walkthrough are those its lab
and recorded computations give;
the inspected observations are of the sequences they hold, in the shape the report reads; every
arm's cache run, system and outcomes are what kvsim computes again, byte for byte; each
bound model's checkpoint_sha256 and tokenizer_sha256 match this machine's catalog entry
or artifact manifest when it has one (otherwise it says so).

Engine arms (execution.runner=engine) and calibration runs cannot be measured again.
For each measured-run file replay proves: it is the file the record names (confined,
size and SHA-256); kvsim reads it as a measured run; its totals are what its own
per-request outcomes and works give (saved_matmul_flops and drops are taken as
written); it is of the system the arm's controls resolve to, served the lab's workload
at its declared arrivals with the prompts of the arm's recorded computations; and the
arm's outcomes are its totals. A calibrated arm's service is fitted again from the
recorded calibration runs (the runs its arms plan), must equal the recorded fragment,
and the arm is simulated again byte for byte.

Generate arms (execution.runner=generate) cannot be decoded again either. For each
decoding-run file replay proves: it is the file the record names; it is of the model of
the arm's recorded computations and of the decoding (rule, draft, K) the arm's controls
choose; it decoded the recording's requests with their prompts; and its totals, whether
every request selected the greedy recording's ids included, are what its requests give.

Replay does not prove that the model produced the recorded computations (nothing is
generated again), the recorded probabilities and attention weights (no forward pass
runs), nor that measured wall times happened (nothing is served again): a record
edited consistently everywhere, file hashes included, passes."""


def describe(lab: ExperimentDesign) -> str:
    wrap = lambda text, indent="  ": textwrap.fill(text, 96, initial_indent=indent, subsequent_indent=indent)  # noqa: E731
    binding = lab.ontology_binding
    lines = [
        f"{lab.id}: {lab.name}" + ("  [planned]" if lab.planned else ""),
        wrap(lab.question),
        *(
            [wrap(f"answer: {lab.answer['kind']} " + json.dumps({k: v for k, v in lab.answer.items() if k != "kind"}))]
            if lab.answer
            else []
        ),
        f"  ontology: {binding.primary}" + (f" (related: {', '.join(binding.related)})" if binding.related else ""),
        "settings:",
        *(f"  {s.control} = {json.dumps(s.value)}" for s in lab.settings.experiments),
        *(["  (none: defaults for every control)"] if not lab.settings.experiments else []),
    ]
    if lab.sweep:
        lines += [
            "sweep:",
            *(
                f"  {axis.control} in {json.dumps(list(axis.values))}"
                if axis.control
                else f"  one of {json.dumps(list(axis.values))}"
                for axis in lab.sweep
            ),
        ]
    if lab.planned:
        lines += ["missing controls (the lab cannot run until they exist):", *(f"  {m}" for m in lab.missing_controls)]
    if lab.workload is not None:
        lines.append(f"workload: {lab.workload.kind}, {len(lab.workload.requests)} requests")
    if lab.calibration_workload is not None:
        lines.append(
            f"calibration workload (served on the engine to fit kvsim's service): "
            f"{lab.calibration_workload.kind}, {len(lab.calibration_workload.requests)} requests"
        )
    lines.append("abstraction contract:")
    for name, text in vars(lab.contract).items():
        lines += [f"  {name}:", wrap(text, "    ")]
    lines += ["sources:", *(f"  {s.title}\n    {s.url}" for s in lab.sources)]
    if lab.evidence:
        lines += ["evidence:", *(f"  {path}" for path in lab.evidence)]
    return "\n".join(lines)


def _report(command: str, argv: list[str]) -> int:
    parser = ArgumentParser(
        prog=f"jgpt {command}",
        description="Write one self-contained HTML page explaining an experiment record: a lab's record.json "
        "(opening with the answer to the lab's question) or a kvsim record from `jgpt kvsim run --out` "
        "(a page for one run). Either must replay byte for byte first.",
    )
    parser.add_argument(
        "record",
        type=Path,
        metavar="RECORD.json",
        help="record.json written by `jgpt lab run`, or a whole kvsim record written by `jgpt kvsim run --out`",
    )
    parser.add_argument("--out", required=True, type=Path, metavar="REPORT.html", help="the HTML file to write")
    args = parser.parse_args(argv)
    from experiments.run_report import is_kvsim_record, write_run_report
    from jgpt.foundation.errors import ApiError
    from jgpt.foundation.json_input import read_json

    if args.record.suffix == ".jsonl":
        raise ApiError(
            "record",
            f"{args.record} is a streamed kvsim record; the report reads a whole one "
            "(`jgpt kvsim run INPUT.json --out RECORD.json`)",
        )
    # --out before any reading, so a bad one is named whatever the record holds; a lab's report reads the record
    # and the JSON files beside it, none of which --out may be.
    output_file(args.out, "--out", [args.record, *args.record.parent.glob("*.json")])
    if is_kvsim_record(read_json(args.record, "record")):
        print(write_run_report(args.record, args.out))
        return 0
    from experiments.html_report import write_report

    print(write_report(args.record, args.out))
    return 0
