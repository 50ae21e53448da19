"""ExperimentExecution: run a lab end to end, write its record, and replay it.

The flow for one lab:

    settings (+ sweep arm) over GenerationDefaults -> one resolved ExecutionSpec per arm
    model.model_id + generation.*  -> inference.record -> recorded computations (once per distinct pair)
    system controls -> KVResidencySystemConfig -> kvsim.simulate -> CacheRun per arm

    execution.runner=engine -> InferenceEngine.serve -> measured run per arm (outcomes: its totals)
    execution.runner=generate -> greedy or speculative decoding, one request at a time -> decoding run per arm
    compute_service.model=calibrated -> engine runs of the calibration workload -> kvsim.calibration.fit -> kvsim

The record joins the consumed lab, the resolved model / system / workload
bindings, provenance and outcomes. Recorded computations and each CacheRun are
written as their own files (kvsim's canonical bytes) and named in the record by
SHA-256. Replay reads only the record and those files, simulates every arm again
and rebuilds the record: both must come back byte for byte. Inference is not
re-run by a replay (its wall times are measurements, not reproducible values).

What replay proves, and what not: the files are the ones the record names (each
path inside the record's directory, at most RECORD_FILE_LIMIT bytes, SHA-256 equal);
the record's `id` is the identity of what it says it consumed; its model bindings,
each recording's kernel plan, provenance, workload, inference controls, arm labels and walkthrough are those its lab
and recorded computations give; the inspected observations are of the sequences those
computations hold, in the shape the report reads; every arm's cache run,
system and outcomes are what kvsim computes from them. It does not prove that the
named model produced the computations (nothing is re-generated), nor the predicted
probabilities or attention weights (no forward pass is run): a record edited
consistently everywhere, hashes included, passes. `record_integrity.model_bindings`
additionally compares the model identities with this machine's catalog or artifact.
Measured runs (engine arms, calibration runs) are checked, not measured again: see
`experiments/measured_arms.py` and docs/security.md for what that proves.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.controls import CONTROLS, chosen
from experiments.experiment_design import ExperimentDesign
from experiments.experiment_spec import ExecutionSpec
from experiments.generation_defaults import GenerationDefaults, generation_defaults
from experiments.lab_workload import LabWorkload
from experiments.record_integrity import check_recording
from jgpt.foundation import progress
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import output_mode, read_bytes
from jgpt.foundation.json_input import parse_json
from jgpt.foundation.paths import confined
from jgpt.foundation.validation import is_integer
from jgpt.model.architecture import architecture_from_json
from jgpt.model.walkthrough import walkthrough
from kvsim import compare, merge_service, parse_document, parse_system, record_json, simulate

if TYPE_CHECKING:  # the plan's module imports jax, which a replay never needs
    from jgpt.kernels.plan import Kernels

FORMAT = "jgpt-experiment-execution"
VERSION = 1
RECORD = "record.json"
RECORD_FILE_LIMIT = 1 << 28  # bytes of one file a record names: far above any lab's, far below a machine's memory
INFERENCE_CONTROLS = tuple(name for name, c in CONTROLS.items() if c.system_path is None and c.default is None)


@dataclasses.dataclass(frozen=True)
class LabRun:
    record: dict[str, Any]
    directory: Path
    written: tuple[Path, ...]


@dataclasses.dataclass(frozen=True)
class Recording:
    """Recorded computations of the workload under one model and generation policy."""

    inference: dict[str, Any]  # the inference controls that produced it
    model: dict[str, Any]  # model_id and the ModelArtifactReference
    document: dict[str, Any]  # the recorded computation document
    walkthrough: dict[str, Any]  # ArchitectureWalkthrough of the model
    observations: dict[str, Any]  # inspection data: tokens, predictions, attention


def run_lab(
    lab: ExperimentDesign,
    out: Path,
    *,
    report: bool = True,
    plots: bool = True,
    defaults: GenerationDefaults | None = None,
    recordings: dict | None = None,
    kernels: Kernels | None = None,
) -> LabRun:
    """Run every arm of `lab` and write record, computations, cache runs, summary, plots and report under `out`.

    Every execution the lab creates (recordings, engine and generate arms) runs under the kernel plan
    `kernels` (default `Kernels.auto()`, as `jgpt lab run --kernels auto`); each recording's entry
    in the record names the plan its computations ran with. `recordings` may carry recorded computations
    between calls (keyed by model, generation policy, workload and plan), so labs sharing them record
    inference once.
    """
    from jgpt.kernels.plan import Kernels  # jax: a lab run always runs the model

    kernels = Kernels.auto() if kernels is None else kernels
    lab.refuse_if_planned()
    out = Path(out)
    _check_replaceable(out)
    defaults = defaults or generation_defaults()
    workload = lab.workload or defaults.workload
    arms = [(arm.label, resolve(arm.execution, defaults.execution)) for arm in lab.arms()]
    recordings = {} if recordings is None else recordings
    keys = []
    for _, execution in arms:
        key = recording_key(execution, workload, kernels)
        if key not in recordings:
            from experiments.lab_recording import record_workload  # jax: only when something runs

            recordings[key] = record_workload(execution, workload, kernels)
        keys.append(key)
    distinct = list(dict.fromkeys(keys))
    files: dict[str, bytes] = {}
    recording_entries = []
    for n, key in enumerate(distinct):
        recording = recordings[key]
        name = f"computations-{n}.json"
        files[name] = dumps(recording.document)
        observations = f"observations-{n}.json"
        files[observations] = dumps(recording.observations)
        recording_entries.append(
            {
                "inference": recording.inference,
                "model": recording.model,
                # the plan as this model's execution ran it (`record_integrity.check_recording` ties it to them)
                "kernels": recording.document["execution"]["kernels"],
                "computations": file_entry(name, files[name]),
                "observations": file_entry(observations, files[observations]),
                "walkthrough": recording.walkthrough,
            }
        )
    from experiments.measured_arms import calibrate, engine_arm  # they read this module's helpers

    calibration = calibrate(lab, arms, recordings, files, kernels) if lab.calibration_workload is not None else None
    fragment = None if calibration is None else calibration["fragment"]
    arm_entries = []
    for i, ((label, execution), key) in enumerate(progress.tracked(list(zip(arms, keys)), "running arms", unit="arm")):
        n = distinct.index(key)
        if chosen(execution.assignments, "execution.runner") == "engine":
            arm_entries.append(engine_arm(i, label, execution, n, recordings[key], workload, files, kernels))
            continue
        if chosen(execution.assignments, "execution.runner") == "generate":
            from experiments.decoding_arms import decoding_arm

            arm_entries.append(decoding_arm(i, label, execution, n, recordings[key], workload, files, kernels))
            continue
        try:
            run = _simulate(execution, recordings[key].document, workload, lab, fragment)
        except ApiError as error:
            raise ApiError(f"arm {label!r}: {error.field}", error.reason) from None
        name = f"cache-run-{i}.json"
        files[name] = record_json(run)
        arm_entries.append(
            {
                "label": label,
                "execution": execution.to_json(),
                "system": run.declaration["system"],
                "recording": n,
                "cache_run": file_entry(name, files[name]) | {"id": json.loads(files[name])["id"]},
                "outcomes": run.outcomes["totals"],
            }
        )
    first = recordings[distinct[0]].document
    record = {
        "format": FORMAT,
        "version": VERSION,
        "id": _execution_id(lab, arm_entries, recording_entries, workload, calibration),
        "lab": lab.to_json(),
        "bindings": {
            "workload": workload.to_json(generation_of(arms[0][1])),
            "models": [r["model"] for r in recording_entries],
        },
        "provenance": first["execution"]["provenance"] | {"backend": first["execution"]["backend"]},
        "recordings": recording_entries,
        "arms": arm_entries,
    } | ({} if calibration is None else {"calibration": calibration})
    files[RECORD] = dumps(record)
    files["summary.json"] = dumps(summary(record))
    out.parent.mkdir(parents=True, exist_ok=True)
    # Everything is written into a staging directory that replaces `out` only when complete.
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as staging:
        stage = Path(staging)
        for name, data in files.items():
            (stage / name).write_bytes(data)
        if plots or report:  # the report embeds the plots
            from experiments.report_figures import draw_plots

            with progress.stage("drawing plots"):
                draw_plots(record, stage)
        if report:
            from experiments.html_report import write_report

            with progress.stage("writing report.html"):
                write_report(stage / RECORD, stage / "report.html")
        if out.exists():
            shutil.rmtree(out)
        stage.chmod(output_mode(out, directory=True))  # mkdtemp makes it private whatever the umask
        stage.rename(out)
        stage.mkdir()  # for the context manager to remove
    written = sorted(path for path in out.rglob("*") if path.is_file())
    return LabRun(record, out, tuple(written))


def _check_replaceable(out: Path) -> None:
    """`out` may be missing, empty, or an earlier run's directory holding only what a run writes (its record,
    the files the record names, summary, report, plots), which the new run replaces whole. Anything else there
    (a foreign record.json, a person's own file beside a run's) would be deleted with it: refused."""
    if not out.exists() or (out.is_dir() and not out.is_symlink() and not any(out.iterdir())):
        return
    refused = ApiError(
        "out", f"{out} is a non-empty directory that is not a lab run's (or holds other files); choose another"
    )
    if out.is_symlink() or not (out / RECORD).is_file():
        raise refused
    try:
        record = parse_json(read_bytes(out / RECORD, "out"), "out")
    except ApiError:
        raise refused from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise refused
    written = {RECORD, "summary.json", "report.html", *named_paths(record)}
    for entry in out.iterdir():
        plots = entry.name == "plots" and entry.is_dir() and not entry.is_symlink()
        if not (
            plots
            and all(p.suffix == ".png" and p.is_file() for p in entry.iterdir())
            or entry.name in written
            and entry.is_file()
            and not entry.is_symlink()
        ):
            raise refused


def named_paths(value: Any) -> list[str]:
    """Every file entry's `path` in a record (recordings, cache runs, measured runs, calibration runs)."""
    if isinstance(value, dict):
        own = [value["path"]] if isinstance(value.get("path"), str) else []
        return own + [path for child in value.values() for path in named_paths(child)]
    return [path for child in value for path in named_paths(child)] if isinstance(value, list) else []


def resolve(execution: ExecutionSpec, defaults: ExecutionSpec) -> ExecutionSpec:
    """The arm's settings completed with the defaults; a control that chooses how the arm runs is written only
    where the lab assigns it (`chosen` gives its default), so kvsim-only records keep their bytes."""
    return execution.over(ExecutionSpec(tuple(s for s in defaults.experiments if CONTROLS[s.control].default is None)))


def replay(record_path: Path) -> dict[str, Any]:
    """Check a record against its own files and simulate every arm again; ApiError on the first difference."""
    record_path = Path(record_path)
    data = read_bytes(record_path, "record")
    record = parse_json(data, "record", source=str(record_path))
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("version") != VERSION:
        raise ApiError("record.format", f"not a {FORMAT} version {VERSION} record")
    lab = ExperimentDesign.from_json(record.get("lab"), "record.lab")
    workload = lab.workload or generation_defaults().workload
    recordings, arms = _list(record, "recordings"), _list(record, "arms")
    documents = []
    for n, entry in enumerate(recordings):
        field = f"record.recordings[{n}]"
        document = parse_json(
            verified_file(record_path.parent, entry.get("computations"), f"{field}.computations"),
            f"{field}.computations",
        )
        observations = parse_json(
            verified_file(record_path.parent, entry.get("observations"), f"{field}.observations"),
            f"{field}.observations",
        )
        for name in ("computations", "observations"):
            if set(entry[name]) != {"path", "sha256", "bytes"}:
                raise ApiError(f"{field}.{name}", "must be a file entry {path, sha256, bytes}")
        check_recording(entry, document, observations, field)
        documents.append(document)
    from experiments.measured_arms import replay_calibration, replay_engine_arm  # they read this module's helpers

    executions = [
        ExecutionSpec.from_json(arm.get("execution"), f"record.arms[{i}].execution") for i, arm in enumerate(arms)
    ]
    if ("calibration" in record) != (lab.calibration_workload is not None):
        raise ApiError(
            "record.calibration", "a record holds a calibration exactly when its lab declares a calibration_workload"
        )
    fragment = (
        None
        if lab.calibration_workload is None
        else replay_calibration(
            record_path.parent,
            record["calibration"],
            lab,
            executions,
            [document.get("model") for document in documents],
        )
    )
    declared = lab.arms()
    if len(arms) != len(declared):
        raise ApiError("record.arms", f"must be the {len(declared)} arms of its lab")
    for i, (arm, execution) in enumerate(zip(arms, executions)):
        field = f"record.arms[{i}]"
        if any(execution.assignments.get(k) != v for k, v in declared[i].execution.assignments.items()):
            raise ApiError(f"{field}.execution", "does not hold the settings of its lab's arm")
        if not is_integer(arm.get("recording")) or arm["recording"] not in range(len(documents)):
            raise ApiError(f"{field}.recording", f"must be the index of one of the {len(documents)} recordings")
        if chosen(execution.assignments, "execution.runner") == "engine":
            replay_engine_arm(record_path.parent, arm, field, execution, documents[arm["recording"]], workload)
            continue
        if chosen(execution.assignments, "execution.runner") == "generate":
            from experiments.decoding_arms import replay_decoding_arm

            replay_decoding_arm(record_path.parent, arm, field, execution, documents[arm["recording"]])
            continue
        recorded = verified_file(record_path.parent, arm.get("cache_run"), f"{field}.cache_run")
        try:
            run = _simulate(execution, documents[arm["recording"]], workload, lab, fragment)
        except ApiError as error:
            raise ApiError(f"{field}.{error.field}", error.reason) from None
        if record_json(run) != recorded:
            raise ApiError(f"{field}.cache_run", f"replaying arm {arm.get('label')!r} gave different bytes")
        if arm["cache_run"] != file_entry(arm["cache_run"]["path"], recorded) | {"id": json.loads(recorded)["id"]}:
            raise ApiError(f"{field}.cache_run", "must be {path, sha256, bytes, id} of the cache run it names")
        if run.declaration["system"] != arm.get("system"):
            raise ApiError(f"{field}.system", "is not the system its controls resolve to")
        if run.outcomes["totals"] != arm.get("outcomes"):
            raise ApiError(f"{field}.outcomes", "differ from the replayed cache run")
    _check_derived(record, lab, workload, executions, documents)
    if dumps(record) != data:
        raise ApiError("record", "is not in canonical form: its bytes differ from the values they hold")
    return record


def _list(record: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    value = record.get(name)
    if not isinstance(value, list) or not value or not all(isinstance(entry, dict) for entry in value):
        raise ApiError(f"record.{name}", "must be a non-empty list of objects")
    return value


def _check_derived(
    record: Mapping[str, Any],
    lab: ExperimentDesign,
    workload: LabWorkload,
    executions: list[ExecutionSpec],
    documents: list[dict],
) -> None:
    """Every field the run derived from what it consumed must be derived again, so none can be edited alone."""
    recordings, arms = record["recordings"], record["arms"]
    execution = documents[0].get("execution")
    execution = execution if isinstance(execution, dict) else {}
    provenance = execution.get("provenance")
    generations = []
    for i, (arm, spec) in enumerate(zip(arms, executions)):
        try:
            generations.append(generation_of(spec))
            named = spec.value("model.model_id")
        except ApiError as error:
            raise ApiError(f"record.arms[{i}].execution.{error.field}", error.reason) from None
        model_id = recordings[arm["recording"]]["model"].get("model_id")
        inference = {"model.model_id": model_id} | {f"generation.{k}": v for k, v in generations[-1].items()}
        # "default" is resolved to the catalog's default model when the lab runs
        if recordings[arm["recording"]].get("inference") != inference or named not in (model_id, "default"):
            raise ApiError(
                f"record.recordings[{arm['recording']}].inference", f"is not what arm {i}'s controls resolve to"
            )
    expected = {
        "id": _execution_id(lab, arms, recordings, workload, record.get("calibration")),
        "bindings": {"workload": workload.to_json(generations[0]), "models": [r["model"] for r in recordings]},
        "provenance": {**(provenance if isinstance(provenance, dict) else {}), "backend": execution.get("backend")},
    }
    for name, value in expected.items():
        if record.get(name) != value:
            raise ApiError(f"record.{name}", "is not what the record's lab, arms and recorded computations give")
    if [arm.get("label") for arm in arms] != [arm.label for arm in lab.arms()]:
        raise ApiError("record.arms.label", "are not the labels of the lab's arms")
    for n, (entry, document) in enumerate(zip(recordings, documents)):
        try:
            architecture = architecture_from_json(document["model"].get("architecture"))
        except ApiError as error:
            raise ApiError(f"record.recordings[{n}].model.architecture.{error.field}", error.reason) from None
        if entry.get("walkthrough") != walkthrough(architecture).to_json():
            raise ApiError(
                f"record.recordings[{n}].walkthrough", "is not the walkthrough of the recorded model's architecture"
            )


def summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers a reader compares across arms, one row per arm."""
    from experiments.decoding_arms import greedy_rate, summary_row

    rows = []
    for arm in record["arms"]:
        if "decoding_run" in arm:  # a generate arm: decoding figures, no serving latencies
            rows.append(summary_row(arm, greedy_rate(record["arms"])))
            continue
        totals = arm["outcomes"]
        latency = totals["latency_us"]
        rows.append(
            {
                "label": arm["label"],
                "completed": totals["completed"],
                "cancelled": totals["cancelled"],
                "rejected": totals["rejected"],
                "ttft_p50_us": latency["ttft"]["p50"],
                "ttft_p90_us": latency["ttft"]["p90"],
                "e2e_p50_us": latency["e2e"]["p50"],
                "e2e_p90_us": latency["e2e"]["p90"],
                "tpot_p50_us": latency["tpot"]["p50"],
                "queueing_p90_us": latency["queueing"]["p90"],
                "token_hit_rate": totals["token_hit_rate"],
                "saved_matmul_flops": totals["saved_matmul_flops"],
                "offloads": totals["offloads"],
                "reloads": totals["reloads"],
                "bytes_host_to_device": totals["bytes_host_to_device"],
                "compute_busy_us": totals["compute_busy_us"],
                "end_us": totals["end_us"],
            }
        )
    lab = record["lab"]
    models = [{k: m[k] for k in ("model_id", "checkpoint_sha256")} for m in record["bindings"]["models"]]
    table = {"lab": lab["id"], "question": lab["question"], "record": record["id"], "models": models, "arms": rows}
    modes = [_modes(arm) for arm in record["arms"]]
    if all(mode == ("kvsim", "roofline") for mode, _ in modes):
        return table  # a kvsim-only lab's summary is what it always was
    for row, ((runner, service), _) in zip(rows, modes):
        row["source"] = {
            "engine": "measured on the engine",
            "generate": "measured with generate, one request at a time",
        }.get(runner, f"simulated by kvsim ({service})")
    return table | {"fidelity": _fidelity(record["arms"], modes)}


def _modes(arm: Mapping[str, Any]) -> tuple[tuple[str, str], dict[str, Any]]:
    """((runner, service), the arm's other controls): arms equal in the latter ran the same system."""
    assignments = {spec["control"]: spec["value"] for spec in arm["execution"]}
    mode = (chosen(assignments, "execution.runner"), chosen(assignments, "compute_service.model"))
    return mode, {k: v for k, v in assignments.items() if CONTROLS[k].default is None}


def _fidelity(arms: list, modes: list) -> list[dict[str, Any]]:
    """Per engine arm and kvsim arm of the same system: measured against predicted, field by field."""
    pairs = []
    for engine, ((runner, _), controls) in zip(arms, modes):
        if runner != "engine":
            continue
        for arm, ((other, service), same) in zip(arms, modes):
            if other == "kvsim" and same == controls:
                rows = [row.to_json() for row in compare(engine["outcomes"], arm["outcomes"])]
                pairs.append({"measured": engine["label"], "predicted": arm["label"], "service": service, "rows": rows})
    return pairs


def _simulate(
    execution: ExecutionSpec, document: dict, workload: LabWorkload, lab: ExperimentDesign, fragment: dict | None = None
):
    computations = parse_document(document)  # checked before the engine's shapes are read from it
    system = execution.system_config_json()
    if chosen(execution.assignments, "compute_service.model") == "calibrated":
        from experiments.engine_serving import engine_shapes  # jax: EnginePlan lives with the engine

        if fragment is None:
            raise ApiError("compute_service.model", "a calibrated arm needs its lab's calibration_workload")
        system = merge_service(system, fragment)
        system = system | {
            "compute_service": system["compute_service"] | engine_shapes(document, system, generation_of(execution))
        }
    system = parse_system(system, "system")
    return simulate(
        system,
        computations,
        workload.arrivals(),
        workload.interaction,
        None,
        lab.ontology_binding.to_json(),
    )


def generation_of(execution: ExecutionSpec) -> dict[str, Any]:
    return {name.split(".")[1]: execution.value(name) for name in INFERENCE_CONTROLS if name.startswith("generation.")}


def recording_key(execution: ExecutionSpec, workload: LabWorkload, kernels: Kernels) -> str:
    inference = {name: execution.value(name) for name in INFERENCE_CONTROLS}
    return json.dumps([inference, workload.to_json({}), kernels.to_json()], sort_keys=True)


def _execution_id(
    lab: ExperimentDesign,
    arms: list,
    recordings: list,
    workload: LabWorkload,
    calibration: Mapping[str, Any] | None = None,
) -> str:
    """Names what was consumed: the lab, every arm's controls, the recorded computations' identity and any
    measured runs (engine arms', then the calibration's)."""
    consumed = {
        "lab": lab.to_json(),
        "arms": [arm["execution"] for arm in arms],
        "computations": [r["computations"]["sha256"] for r in recordings],
        "workload": workload.to_json({}),
    }
    measured = [arm[kind]["sha256"] for arm in arms for kind in ("measured_run", "decoding_run") if kind in arm]
    measured += [run["measured_run"]["sha256"] for run in (calibration or {}).get("runs", [])]
    if measured:  # absent for kvsim-only labs, whose ids stay what they were
        consumed["measured_runs"] = measured
    return f"lab-{hashlib.sha256(dumps(consumed)).hexdigest()[:16]}"


def file_entry(name: str, data: bytes) -> dict[str, Any]:
    return {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def verified_file(directory: Path, entry: Any, field: str) -> bytes:
    """The bytes of the file a record's entry names, checked before use."""
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("sha256"), str)
        or not is_integer(entry.get("bytes"))
        or not 0 <= entry["bytes"] <= RECORD_FILE_LIMIT
        or set(entry) - {"path", "sha256", "bytes", "id"}
    ):
        raise ApiError(field, f"must be a file entry {{path, sha256, bytes}} of at most {RECORD_FILE_LIMIT} bytes")
    path = confined(directory, entry.get("path"), f"{field}.path")
    if path.is_file() and path.stat().st_size != entry["bytes"]:  # refused before a byte is read
        raise ApiError(field, f"{entry['path']} does not have the size the record names")
    data = read_bytes(path, field)
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ApiError(field, f"{entry['path']} does not have the SHA-256 the record names")
    return data


def dumps(value: Any) -> bytes:
    return (json.dumps(value, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode()
