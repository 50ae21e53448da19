"""Where a lab's simulated arms run: here one after another, in local worker processes, or on a Ray cluster.

A simulated arm (`execution.runner=kvsim`) is a pure function of its resolved controls, the
recorded computations it reads, the lab's workload, its ontology binding and the calibrated
fragment (`kvsim_arms.kvsim_arm`): nothing else, no clock and no shared mutable state. So the
arms of one lab run anywhere and in any order and each still writes the bytes a serial run
writes; the record puts them back in arm order, whatever order they finish in.

* Local workers are `spawn`ed, never forked: the parent has usually started JAX (the lab's
  recording), whose threads a fork would copy half-held. They import only jax-free modules and
  receive everything the arms share once, when they start. They ignore SIGINT, which a terminal
  sends to the whole process group: the parent alone decides, and on Ctrl-C or SIGTERM
  terminates them before anything is written.
* Ray (`pip install 'jgpt[ray]'`) runs each arm as one task of one CPU; what the arms share is
  put in Ray's object store once. `ArmPool(ray="local")` starts a local Ray instance for the
  run and stops it afterwards; an address joins a running cluster, whose nodes must have this
  version of jgpt importable (the arms' bytes are this code's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import signal
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from experiments.experiment_design import ExperimentDesign
from experiments.experiment_spec import ExecutionSpec
from experiments.kvsim_arms import kvsim_arm
from experiments.lab_workload import LabWorkload
from jgpt.foundation.errors import ApiError, raise_if_terminated

RAY_LOCAL = "local"
RAY_EXTRA = "pip install 'jgpt[ray]' (ray==2.60.0)"
RAY_WAIT_S = 0.2  # how long a wait for the next finished arm runs before it looks for a Ctrl-C


@dataclasses.dataclass(frozen=True)
class ArmPool:
    """How many simulated arms run at once, and where: `workers` local processes (1: in this process, in
    order), or tasks on the Ray cluster at `ray` ('local': a local instance with `workers` CPUs, or all)."""

    workers: int | None = None
    ray: str | None = None

    def __post_init__(self):
        if self.workers is not None and (isinstance(self.workers, bool) or self.workers < 1):
            raise ApiError("--workers", f"must be a whole number of processes >= 1, got {self.workers!r}")
        if self.ray is not None and not self.ray.strip():
            raise ApiError("--ray", f"must be 'local' or a Ray cluster's address, got {self.ray!r}")
        if self.ray not in (None, RAY_LOCAL) and self.workers is not None:
            raise ApiError("--workers", "a Ray cluster's own CPUs decide how many arms run at once on it")

    @property
    def serial(self) -> bool:
        """Every arm in this process, one after another: the default."""
        return self.ray is None and (self.workers or 1) == 1

    def describe(self) -> str:
        if self.ray is not None:
            where = "a local Ray instance" if self.ray == RAY_LOCAL else f"the Ray cluster at {self.ray}"
            return where + (f" of {self.workers} CPUs" if self.workers else "")
        return "this process" if self.serial else f"{self.workers} worker processes"


@dataclasses.dataclass(frozen=True)
class SharedInput:
    """What every simulated arm of one lab run reads: sent to each worker once."""

    lab: ExperimentDesign
    workload: LabWorkload
    documents: tuple[dict[str, Any], ...]  # each recording's computations, by the record's recording index
    fragment: dict[str, Any] | None  # the calibrated service, when the lab calibrates


@dataclasses.dataclass(frozen=True)
class SimulatedArm:
    index: int
    label: str
    execution: ExecutionSpec
    recording: int


@dataclasses.dataclass(frozen=True)
class ArmResult:
    """A simulated arm's record entry and files, or the refusal (field, reason) it ended in."""

    index: int
    entry: dict[str, Any] | None
    files: dict[str, bytes]
    refusal: tuple[str, str] | None = None

    def checked(self) -> ArmResult:
        if self.refusal is not None:  # an ApiError does not survive pickling (two arguments), so it travels apart
            raise ApiError(*self.refusal)
        return self


def simulate(shared: SharedInput, arm: SimulatedArm) -> ArmResult:
    """One simulated arm, as `kvsim_arms.kvsim_arm` writes it."""
    files: dict[str, bytes] = {}
    try:
        entry = kvsim_arm(
            arm.index,
            arm.label,
            arm.execution,
            arm.recording,
            shared.documents[arm.recording],
            shared.workload,
            shared.lab,
            shared.fragment,
            files,
        )
    except ApiError as error:
        return ArmResult(arm.index, None, {}, (error.field, error.reason))
    return ArmResult(arm.index, entry, files)


def simulated(pool: ArmPool, shared: SharedInput, arms: list[SimulatedArm]) -> Iterator[ArmResult]:
    """Each arm's result as it finishes (in order when serial); an arm's refusal is raised as its ApiError."""
    if not arms:
        return
    if pool.serial:
        for arm in arms:
            yield simulate(shared, arm).checked()
    elif pool.ray is not None:
        yield from _on_ray(pool, shared, arms)
    else:
        yield from _on_workers(pool.workers or 1, shared, arms)


_shared: SharedInput | None = None  # a worker process's copy, set once as it starts


def _receive(shared: SharedInput) -> None:
    global _shared
    _shared = shared


def _simulate_received(arm: SimulatedArm) -> ArmResult:
    assert _shared is not None, "the pool's initializer gave this worker its input"
    return simulate(_shared, arm)


def _on_workers(workers: int, shared: SharedInput, arms: list[SimulatedArm]) -> Iterator[ArmResult]:
    context = multiprocessing.get_context("spawn")
    with _interrupts_ignored_by_children():
        pool = context.Pool(min(workers, len(arms)), initializer=_receive, initargs=(shared,))
    with pool:  # leaving it, normally or on KeyboardInterrupt / Terminated, terminates every worker
        for result in pool.imap_unordered(_simulate_received, arms):
            yield result.checked()


@contextlib.contextmanager
def _interrupts_ignored_by_children() -> Iterator[None]:
    """SIGINT ignored while the workers start: an ignored signal stays ignored across exec, and Python then
    installs no KeyboardInterrupt handler, so a Ctrl-C reaches only this process, which ends the workers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _sigint_handler_kept() -> Iterator[None]:
    """The command's SIGINT handler put back after the block: Ray's driver installs its own when it connects,
    and a Ctrl-C would then never reach the command."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _on_ray(pool: ArmPool, shared: SharedInput, arms: list[SimulatedArm]) -> Iterator[ArmResult]:
    try:
        import ray
    except ImportError:
        raise ApiError("--ray", f"running arms on Ray needs the ray extra: {RAY_EXTRA}") from None
    local = pool.ray == RAY_LOCAL
    try:
        with warnings.catch_warnings(), _sigint_handler_kept():
            # JAX warns at every fork; Ray's fork is subprocess's fork-then-exec, whose child runs no JAX code.
            warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
            ray.init(
                address=pool.ray,  # Ray's own "local" starts a new instance, whatever RAY_ADDRESS says
                num_cpus=pool.workers if local else None,
                include_dashboard=False,
                logging_level=logging.ERROR,
                log_to_driver=False,
            )
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise ApiError("--ray", f"cannot start or reach Ray at {pool.ray!r}: {error}") from None
    pending: list = []
    try:
        task = ray.remote(num_cpus=1)(simulate)
        shared_ref = ray.put(shared)
        # A few tasks per CPU in flight, not the whole sweep: the cluster's queue stays short, and stopping
        # (Ctrl-C, a refused arm) cancels a handful of tasks, not thousands one call each.
        window = max(1, 2 * int(ray.cluster_resources().get("CPU", 1)))
        waiting = iter(arms)
        pending = [task.remote(shared_ref, arm) for arm in itertools.islice(waiting, window)]
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=RAY_WAIT_S)
            raise_if_terminated()  # a Ctrl-C whose KeyboardInterrupt was raised and dropped in a callback of Ray's
            if done:
                pending += [task.remote(shared_ref, arm) for arm in itertools.islice(waiting, 1)]
                yield ray.get(done[0]).checked()
    finally:
        for ref in pending:  # an interruption or a refused arm: the others stop
            ray.cancel(ref, force=True)
        ray.shutdown()
