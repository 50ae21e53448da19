"""ExperimentExecution: run a lab end to end and write its record.

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
SHA-256. This module orchestrates: each kind of arm is run by its own module
(`kvsim_arms`, `measured_arms`, `decoding_arms`), and `experiment_replay` checks the
record a run writes against its files, byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

from experiments.arm_pool import ArmPool, SharedInput, SimulatedArm
from experiments.arm_pool import simulated as simulated_arms
from experiments.arm_recording import Recording, generation_of, recording_key
from experiments.controls import CONTROLS, chosen
from experiments.decoding_arms import decoding_arm
from experiments.experiment_design import ExperimentDesign
from experiments.experiment_record import FORMAT, RECORD, VERSION, execution_id
from experiments.experiment_spec import ExecutionSpec
from experiments.generation_defaults import GenerationDefaults, generation_defaults
from experiments.html_report import write_report
from experiments.kvsim_arms import kvsim_arm
from experiments.lab_recording import record_workload
from experiments.lab_workload import LabWorkload
from experiments.measured_arms import calibrate, engine_arm
from experiments.record_files import dumps, file_entry, named_paths
from experiments.record_summary import summary
from experiments.report_figures import draw_plots
from jgpt.foundation import progress
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import output_mode, read_bytes
from jgpt.foundation.json_input import parse_json
from jgpt.kernels.plan import Kernels


@dataclasses.dataclass(frozen=True)
class LabRun:
    record: dict[str, Any]
    directory: Path
    written: tuple[Path, ...]


def run_lab(
    lab: ExperimentDesign,
    out: Path,
    *,
    report: bool = True,
    plots: bool = True,
    defaults: GenerationDefaults | None = None,
    recordings: dict | None = None,
    kernels: Kernels | None = None,
    pool: ArmPool | None = None,
) -> LabRun:
    """Run every arm of `lab` and write record, computations, cache runs, summary, plots and report under `out`.

    Every execution the lab creates (recordings, engine and generate arms) runs under the kernel plan
    `kernels` (default `Kernels.auto()`, as `jgpt lab run --kernels auto`); each recording's entry
    in the record names the plan its computations ran with. `recordings` may carry recorded computations
    between calls (keyed by model, generation policy, workload and plan), so labs sharing them record
    inference once. `pool` says where the simulated arms run (default: here, one after another); the record's
    bytes are the same wherever they do.
    """
    kernels = Kernels.auto() if kernels is None else kernels
    lab.refuse_if_planned()
    out = Path(out)
    _check_replaceable(out)
    defaults = defaults or generation_defaults()
    workload = lab.workload or defaults.workload
    arms = [(arm.label, resolve(arm.execution, defaults.execution)) for arm in lab.arms()]
    recordings = {} if recordings is None else recordings
    keys = [_recorded(execution, workload, kernels, recordings) for _, execution in arms]
    distinct = list(dict.fromkeys(keys))
    files: dict[str, bytes] = {}
    recording_entries = [_recording_entry(n, recordings[key], files) for n, key in enumerate(distinct)]
    calibration = (
        calibrate(lab.calibration_workload, arms, recordings, files, kernels)
        if lab.calibration_workload is not None
        else None
    )
    fragment = None if calibration is None else calibration["fragment"]
    pool = ArmPool() if pool is None else pool
    if pool.serial:
        arm_entries = [
            _arm_entry(
                i, label, execution, distinct.index(key), recordings[key], workload, lab, fragment, files, kernels
            )
            for i, ((label, execution), key) in enumerate(
                progress.tracked(list(zip(arms, keys)), "running arms", unit="arm")
            )
        ]
    else:
        shared = SharedInput(lab, workload, tuple(recordings[key].document for key in distinct), fragment)
        arm_entries = _arms_in_pool(pool, shared, arms, [distinct.index(key) for key in keys], recordings, keys, files,
                                    kernels)  # fmt: skip
    first = recordings[distinct[0]].document
    record = {
        "format": FORMAT,
        "version": VERSION,
        "id": execution_id(lab, arm_entries, recording_entries, workload, calibration),
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
    _write(out, files, record, plots=plots, report=report)
    written = sorted(path for path in out.rglob("*") if path.is_file())
    return LabRun(record, out, tuple(written))


def _recorded(execution: ExecutionSpec, workload: LabWorkload, kernels: Kernels, recordings: dict) -> str:
    """The key of the arm's Recording in `recordings`, recorded first unless an earlier arm or lab has."""
    key = recording_key(execution, workload, kernels)
    if key not in recordings:
        recordings[key] = record_workload(execution, workload, kernels)
    return key


def _recording_entry(n: int, recording: Recording, files: dict[str, bytes]) -> dict[str, Any]:
    """The record's entry of its `n`th recording; its computations and observations join `files`."""
    name = f"computations-{n}.json"
    files[name] = dumps(recording.document)
    observations = f"observations-{n}.json"
    files[observations] = dumps(recording.observations)
    return {
        "inference": recording.inference,
        "model": recording.model,
        # the plan as this model's execution ran it (`record_integrity.check_recording` ties it to them)
        "kernels": recording.document["execution"]["kernels"],
        "computations": file_entry(name, files[name]),
        "observations": file_entry(observations, files[observations]),
        "walkthrough": recording.walkthrough,
    }


def _arms_in_pool(
    pool: ArmPool,
    shared: SharedInput,
    arms: list[tuple[str, ExecutionSpec]],
    indices: list[int],
    recordings: dict,
    keys: list[str],
    files: dict[str, bytes],
    kernels: Kernels,
) -> list[dict[str, Any]]:
    """Every arm's entry, in arm order: the measured ones (engine, generate) here, one at a time, before the pool
    starts (their wall times must not share the CPUs with other arms); the simulated ones in `pool`."""
    entries: dict[int, dict[str, Any]] = {}
    measured = [
        i for i, (_, execution) in enumerate(arms) if chosen(execution.assignments, "execution.runner") != "kvsim"
    ]
    simulated = [
        SimulatedArm(i, label, execution, indices[i]) for i, (label, execution) in enumerate(arms) if i not in measured
    ]

    def finished():
        for i in measured:
            label, execution = arms[i]
            entries[i] = _arm_entry(
                i, label, execution, indices[i], recordings[keys[i]], shared.workload, shared.lab, shared.fragment,
                files, kernels,
            )  # fmt: skip
            yield i
        with contextlib.closing(simulated_arms(pool, shared, simulated)) as results:  # closing stops the workers
            for result in results:
                entries[result.index] = result.entry
                files.update(result.files)
                yield result.index

    for _ in progress.tracked(finished(), f"running arms on {pool.describe()}", total=len(arms), unit="arm"):
        pass
    return [entries[i] for i in range(len(arms))]


def _arm_entry(
    i: int,
    label: str,
    execution: ExecutionSpec,
    n: int,
    recording: Recording,
    workload: LabWorkload,
    lab: ExperimentDesign,
    fragment: dict | None,
    files: dict[str, bytes],
    kernels: Kernels,
) -> dict[str, Any]:
    """The record's entry of arm `i`, run as its `execution.runner` says; its file joins `files`."""
    runner = chosen(execution.assignments, "execution.runner")
    if runner == "engine":
        return engine_arm(i, label, execution, n, recording, workload, files, kernels)
    if runner == "generate":
        return decoding_arm(i, label, execution, n, recording, workload, files, kernels)
    return kvsim_arm(i, label, execution, n, recording.document, workload, lab, fragment, files)


def _write(out: Path, files: dict[str, bytes], record: dict[str, Any], *, plots: bool, report: bool) -> None:
    """Write `files`, the plots and the report into a staging directory that replaces `out` only when complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as staging:
        stage = Path(staging)
        for name, data in files.items():
            (stage / name).write_bytes(data)
        if plots or report:  # the report embeds the plots
            with progress.stage("drawing plots"):
                draw_plots(record, stage)
        if report:
            with progress.stage("writing report.html"):
                write_report(stage / RECORD, stage / "report.html")
        if out.exists():
            shutil.rmtree(out)
        stage.chmod(output_mode(out, directory=True))  # mkdtemp makes it private whatever the umask
        stage.rename(out)
        stage.mkdir()  # for the context manager to remove


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


def resolve(execution: ExecutionSpec, defaults: ExecutionSpec) -> ExecutionSpec:
    """The arm's settings completed with the defaults; a control that chooses how the arm runs is written only
    where the lab assigns it (`chosen` gives its default), so kvsim-only records keep their bytes."""
    return execution.over(ExecutionSpec(tuple(s for s in defaults.experiments if CONTROLS[s.control].default is None)))
