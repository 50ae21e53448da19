"""The training run: prepare, step, evaluate, checkpoint, select, write the artifact.

A run directory holds `run.json` (the config), `checkpoints/` (orbax, periodic and
final, written atomically), `metrics.jsonl`, `loss.png` and `model/` (the final
ModelArtifact). Everything that can reject the input runs before the directory
is touched, so a rejected run leaves nothing `--resume` could pick up.

Over several processes (`jax.distributed`) every process runs the same steps;
process 0 alone writes run.json, the metrics, the plot and the artifact, and
every process writes its own shards of each checkpoint into `checkpoints/`,
which all of them must see (a shared file system across hosts).
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from tqdm import tqdm

from jgpt.foundation.errors import ApiError, raise_if_terminated, termination_deferred
from jgpt.foundation.identity import canonical_json, system_refusal, write_atomically
from jgpt.foundation.json_input import read_json
from jgpt.foundation.output_paths import library_write
from jgpt.model.weights import ModelWeights, initialize
from training import corpus as corpora
from training import metrics, optimizer, sharding
from training.batches import TokenRows, TokenStream
from training.config import TrainingConfig, from_json
from training.evaluation import DEVELOPMENT_BATCH, development_loss
from training.parent import load_parent
from training.provenance import TrainingProvenance, learning_rate_schedule, source_sha256
from training.resume import Extension, check_resume
from training.run_lock import LOCK
from training.step import (
    TrainState,
    check_training_kernels,
    make_development_step,
    make_train_step,
    start,
    training_kernels,
)

# run.json's key for the run's kernel plan (`jgpt.kernels.plan.Kernels`, made from `products` and `attention`).
RUN_KERNELS = "kernels"
# Mixed into the run seed so the data stream and the initialization draw independent keys.
DATA_STREAM = 1


@dataclass(frozen=True)
class RunDirectory:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "run.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def loss_curve(self) -> Path:
        return self.root / "loss.png"

    @property
    def model(self) -> Path:
        return self.root / "model"


@dataclass(frozen=True)
class TrainingResult:
    weights: ModelWeights
    provenance: TrainingProvenance
    corpus: corpora.PreparedCorpus
    run: RunDirectory
    devices: int


def _check_run_directory(run: RunDirectory, config: TrainingConfig, resume: bool) -> tuple[int, Extension | None]:
    """(the steps done, the extension) of a resume of `run` with `config`, or (0, None) for a new run."""
    has_checkpoints = run.checkpoints.is_dir() and any(run.checkpoints.iterdir())
    if resume:
        if not has_checkpoints:
            raise ApiError("resume", f"{run.root} holds no checkpoint to resume from")
        done = max((int(path.name) for path in run.checkpoints.iterdir() if path.name.isdigit()), default=0)
        return done, check_resume(recorded_config(run, "resume"), config, run.root, done)
    if has_checkpoints or run.model.exists():
        raise ApiError("out", f"{run.root} already holds a run; pass --resume or choose another directory")
    return 0, None


def recorded_config(run: RunDirectory, field: str) -> TrainingConfig:
    """The TrainingConfig of run.json (its kernel plan is made from the config's fields again, not read)."""
    document = read_json(run.config, field)
    if isinstance(document, dict):
        document.pop(RUN_KERNELS, None)
    return from_json(document)


def _check_only_a_run(run: RunDirectory) -> None:
    """A new run replaces run.json, metrics.jsonl and loss.png and sweeps stale temporaries: the directory
    may hold nothing else, and those only beside an earlier run's run.json, so that no file of a person's is
    replaced or swept (`--out ~/notes` used to replace notes/run.json and delete every *.tmp.png there)."""
    entries = {path.name for path in run.root.iterdir()} - {LOCK} if run.root.is_dir() else set()
    if not entries:
        return
    try:
        recorded_config(run, "out")
    except ApiError:
        raise ApiError(
            "out", f"{run.root} is not empty and holds no earlier run's run.json; choose another directory"
        ) from None
    stale = {path.name for path in (*run.root.glob(".model.*"), *run.root.glob(".*.tmp"), *run.root.glob("*.tmp.png"))}
    others = sorted(entries - stale - {run.config.name, run.metrics.name, run.loss_curve.name, run.checkpoints.name})
    if others:
        raise ApiError(
            "out", f"{run.root} holds {others[0]!r}, which a training run does not write; choose another directory"
        )


def _sweep_staging(run: RunDirectory) -> None:
    """Remove what a killed run left half-written (SIGKILL runs no cleanup): the artifact's
    staging directories (`.model.*`) and temporaries (`.*.tmp`, the loss curve's `*.tmp.png`). Runs under the lock."""
    for path in run.root.glob(".model.*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    for path in (*run.root.glob(".*.tmp"), *run.root.glob("*.tmp.png")):
        path.unlink()


def _write_json(path: Path, value) -> None:
    write_atomically(path, canonical_json(value))


def _checkpoint_manager(run: RunDirectory) -> ocp.CheckpointManager:
    # cleanup_tmp_directories: a save killed half-way (SIGKILL) leaves orbax's tmp directory; the next run removes it.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=2, enable_async_checkpointing=False, create=True, cleanup_tmp_directories=True
    )
    return ocp.CheckpointManager(run.checkpoints.absolute(), options=options, item_names=("state", "best"))


def _save_checkpoint(manager: ocp.CheckpointManager, run: RunDirectory, step: int, state, best: dict) -> None:
    """Write checkpoint `step` whole, or leave none: SIGTERM waits for the save, and a save that fails
    (a full disk, which orbax reports in a traceback) removes its temporary directory, keeps the earlier
    checkpoints and is one ApiError naming the directory."""
    try:
        with termination_deferred(), library_write():
            manager.save(
                step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), best=ocp.args.StandardSave(best))
            )
    except BaseException as error:
        for unfinished in run.checkpoints.glob("*.orbax-checkpoint-tmp*"):
            shutil.rmtree(unfinished, ignore_errors=True)
        if reason := system_refusal(error):
            raise ApiError("out", f"cannot write checkpoint {run.checkpoints / str(step)}: {reason}") from None
        raise


@dataclass(frozen=True)
class StartedRun:
    """A configured run at step 0, before anything is written: what `train` steps through and what
    tests/test_training_recipe.py reproduces the shipped recipe's first steps with.

    `train_step(state, data) -> (state, metrics)` donates `state`; `data` is the corpus's training split
    placed on every device.
    """

    state: TrainState
    state_sharding: TrainState
    train_step: Callable[[TrainState, TokenRows | TokenStream], tuple[TrainState, dict[str, jax.Array]]]
    development_step: Callable
    data: TokenRows | TokenStream


def start_run(
    config: TrainingConfig, corpus: corpora.PreparedCorpus, mesh, weights: ModelWeights | None = None
) -> StartedRun:
    """The initial state and the jitted steps of `config` on `mesh` (the config's checks passed); the state
    holds `weights` (a parent's) or, without them, the weights initialized from the config's seed."""
    optimizer_ = optimizer.adamw(config)
    key = jax.random.key(config.seed)
    batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    if weights is None:
        weights, _ = initialize(config.architecture, config.seed)
    state = start(weights, optimizer_)
    state_sharding = sharding.state_shardings(state, mesh)
    train_step = make_train_step(
        config.architecture,
        optimizer_,
        jax.random.fold_in(key, DATA_STREAM),
        config.batch_size,
        batch_sharding,
        config.unroll,
        state_sharding,
        training_kernels(config.products, config.attention),
    )
    development_step = make_development_step(config.architecture, batch_sharding, config.unroll)
    return StartedRun(
        jax.device_put(state, state_sharding),
        state_sharding,
        train_step,
        development_step,
        jax.device_put(corpus.train, replicated),
    )


def _best_record(weights, loss: float, step: int) -> dict:
    return {"weights": sharding.to_host(weights), "development_loss": np.array(loss), "step": np.array(step)}


def train(
    config: TrainingConfig, *, resume: bool = False, progress: bool = True, model_axis: int = 1
) -> TrainingResult:
    """`model_axis` devices split each weight's heads and hidden units (`training.sharding`); the rest split the batch."""
    main = sharding.main_process()
    mesh = sharding.mesh(model_axis)
    sharding.check_batch_size(config.batch_size, mesh)
    kernels = training_kernels(config.products, config.attention)
    check_training_kernels(kernels, sharding.batch_sharding(mesh))
    run = RunDirectory(Path(config.out))
    done, extension = _check_run_directory(run, config, resume)
    parent = None if config.parent is None else load_parent(config.parent)
    corpus = corpora.prepare(config, None if parent is None else parent.tokenizer())
    if main and not resume:  # process 0 holds the lock: no other process has written here yet
        _check_only_a_run(run)
    say = _say if progress and main else _silent
    if resume:
        say(f"resuming {run.root} at step {done} with the configuration of {run.config}")
        if extension is not None:
            say(extension.describe(run.root))
    elif parent is not None:
        say(f"starting from {config.init_from} ({parent.path}): {parent.parameters:,} parameters, "
            f"checkpoint {parent.checkpoint_sha256[:12]}, tokenizer {str(parent.tokenizer_sha256)[:12]}")  # fmt: skip

    if main:
        run.root.mkdir(parents=True, exist_ok=True)
        _sweep_staging(run)
        # The kernel plan beside the config that makes it: what the train step computes by kernels.
        _write_json(run.config, config.to_json() | {RUN_KERNELS: kernels.to_json()})
    started = start_run(config, corpus, mesh, None if parent is None else parent.weights)
    development_batch = DEVELOPMENT_BATCH - DEVELOPMENT_BATCH % mesh.size

    def evaluate(weights) -> tuple[float, float]:
        return development_loss(
            started.development_step, weights, corpus.development, corpus.development_bytes, development_batch
        )

    best = _best_record(started.state.weights, math.inf, 0)
    manager = _checkpoint_manager(run)
    try:
        if resume:
            state, best = _restored(manager, run, started, best, main)
        else:
            state = started.state
            if main and run.metrics.exists():
                run.metrics.unlink()
            if parent is not None:
                _record_parent(run, evaluate(state.weights), main=main, say=say)
        state, best = _steps(config, run, manager, started, state, best, evaluate, main=main, progress=progress)
    finally:
        manager.close()  # waits for orbax's threads: exiting under them logs tracebacks

    if config.selection == "final":
        selected, selected_step = state.weights, int(state.step)
        selected_loss = evaluate(selected)[0]
    else:
        selected, selected_step, selected_loss = best["weights"], int(best["step"]), float(best["development_loss"])
    provenance = TrainingProvenance(
        kind=corpus.kind,
        seed=config.seed,
        step=selected_step,
        selection=config.selection,
        development_loss=selected_loss,
        data_sha256=corpus.data_sha256,
        source_sha256=source_sha256(),
        preparation_run_sha256=config.preparation_run_sha256,
        init_from=None if config.parent is None else config.parent.identity(),
        learning_rate_schedule=learning_rate_schedule(config),
    )
    weights = sharding.to_host(selected)
    if main:
        metrics.plot(run.metrics, run.loss_curve)
    return TrainingResult(weights, provenance, corpus, run, mesh.size)


def _say(line: str) -> None:
    """One line for the person at the terminal, beside the progress bar (stdout holds the summary)."""
    print(line, file=sys.stderr)


def _silent(line: str) -> None:
    """In place of `_say` where progress is off (--quiet) or on a process other than the first."""


def _record_parent(run: RunDirectory, losses: tuple[float, float], *, main: bool, say: Callable[[str], None]) -> None:
    """The parent's development loss on this run's data, as step 0: where the run's curve starts from."""
    loss, bits = losses
    say(f"the parent's development loss on this data: {loss:.6g} nats/token, {bits:.6g} bits/byte")
    if main:
        metrics.append(run.metrics, {"step": 0, "development_loss": loss, "development_bits_per_byte": bits})


def _restored(
    manager: ocp.CheckpointManager, run: RunDirectory, started: StartedRun, best: dict, main: bool
) -> tuple[TrainState, dict]:
    """The state and best record of the latest checkpoint; process 0 drops the metrics written after it."""
    with termination_deferred():
        restored = manager.restore(
            manager.latest_step(),
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(started.state),
                best=ocp.args.StandardRestore(best),
            ),
        )
    state = jax.device_put(restored.state, started.state_sharding)
    if main:
        metrics.truncate_after(run.metrics, int(state.step))
    return state, restored.best


def _steps(
    config: TrainingConfig,
    run: RunDirectory,
    manager: ocp.CheckpointManager,
    started: StartedRun,
    state: TrainState,
    best: dict,
    evaluate: Callable[[ModelWeights], tuple[float, float]],
    *,
    main: bool,
    progress: bool,
) -> tuple[TrainState, dict]:
    """Train from `state` to config.steps: log, evaluate (keeping the best weights) and checkpoint on the
    config's schedule; process 0 appends the metrics. Returns the last state and the best record."""
    tokens_per_step = config.batch_size * config.window
    bar = tqdm(total=config.steps, initial=int(state.step), disable=not (progress and main), unit="step",
               dynamic_ncols=True)  # fmt: skip
    clock, clock_step = time.perf_counter(), int(state.step)
    while (step := int(state.step)) < config.steps:
        raise_if_terminated()
        state, step_metrics = started.train_step(state, started.data)
        step += 1
        record: dict[str, float] = {"step": step}
        if step % config.log_every == 0 or step == config.steps:
            elapsed = time.perf_counter() - clock
            record |= {k: float(v) for k, v in step_metrics.items()}
            record |= _rates(config, step, tokens_per_step * (step - clock_step) / elapsed)
            clock, clock_step = time.perf_counter(), step
            bar.set_postfix(loss=f"{record['loss']:.4g}", tokens_per_s=f"{record['tokens_per_second']:,.0f}")
        if step % config.eval_every == 0 or step == config.steps:
            loss, bits = evaluate(state.weights)
            record |= {"development_loss": loss, "development_bits_per_byte": bits}
            if loss < best["development_loss"]:
                best = _best_record(state.weights, loss, step)
        if main and len(record) > 1:
            metrics.append(run.metrics, record)
        if step % config.checkpoint_every == 0 or step == config.steps:
            _save_checkpoint(manager, run, step, state, best)
        bar.update(1)
    bar.close()
    return state, best


def _rates(config: TrainingConfig, step: int, tokens_per_second: float) -> dict[str, float]:
    """A logged step's rates beside its metrics: the learning rate it ran at, the tokens per second since the
    last logged step, and the CPU seconds used."""
    assert config.warmup_steps is not None and config.schedule_steps is not None, "__post_init__ sets them"
    return {
        "learning_rate": float(optimizer.schedule(config.learning_rate, config.warmup_steps, config.schedule_steps,
                                                  config.final_learning_rate_fraction)(step - 1)),
        "tokens_per_second": tokens_per_second,
        # CPU seconds this process has used: on a shared machine, a fairer cost than wall time.
        "process_cpu_seconds": time.process_time(),
    }  # fmt: skip
