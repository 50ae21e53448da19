"""ComputeService and StateTransfer service models: the hypothetical roofline and a calibrated latency model.

The roofline (`ComputeServiceConfig`, `StateTransferConfig`) is the spec's model
and the default: max(FLOPs / rate, bytes / rate), and latency + bytes / rate.
The calibrated model (`CalibratedComputeService`, `CalibratedTransfer`) is what
`jgpt kvsim calibrate` fits to an InferenceEngine's measured works: a fixed time
per work, a term per executed position (prefill) or a time per executed batch
size (decode), per slot of the engine's KV slot capacity, per FLOP and per byte,
a penalty for a work that starts after the engine was idle at least a fitted
time, optionally one for a work that follows a work or transfer of another kind
on the serving thread (`after_other_us`), a host step overhead before every
work, optionally host time after a request ends (`finish`), and per-direction
transfer latency plus time per byte
(docs/kvsim-calibration.md). Optionally (`spread`) each work's time
is that mean time times a multiplier drawn per work from the calibration's
own distribution of measured / fitted times, so simulated runs have the
engine's per-work spread (and its tails); the draw is a hash of a seed and the
work, so a record still replays byte for byte. A fragment without `finish`,
`spread` or `after_other_us` behaves, and is written, exactly as before they existed.
Every parameter is the exact rational of its JSON lexeme and every duration is
rounded up to a whole microsecond, so records stay deterministic.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from jgpt.foundation import validation
from jgpt.foundation.errors import ApiError

ROOFLINE, CALIBRATED = "roofline", "calibrated"
PREFILL, DECODE = "prefill", "decode"
TRANSFER = "transfer"  # what ran before a work on the serving thread, when it was not a work
DEVICE_TO_HOST, HOST_TO_DEVICE = "device_to_host", "host_to_device"
# Each kind of work's size term: per executed (bucketed) prefill position; per executed decode batch size.
SIZE_TERMS = {PREFILL: "per_position_us", DECODE: "per_batch_us"}
SPREAD_QUANTILES_MAX = 1001  # quantiles per kind of work a spread may give (a bound on what a system holds)
# Simulated runs a prediction with a spread takes each figure's median over (seeds counting up from the spread's);
# bench/fidelity.py takes as many per measured repeat. Another set of seeds moves a pooled prediction far less
# than the measurement's own noise (docs/kvsim-calibration.md, "Fidelity").
SPREAD_REPEATS = 5


def ceil_us(value: Fraction) -> int:
    return -(-value.numerator // value.denominator)


@dataclass(frozen=True)
class ComputeServiceConfig:
    compute_flops_per_us: Fraction
    memory_bytes_per_us: Fraction

    def duration_us(self, matmul_flops: int, memory_bytes: int) -> int:
        """max(FLOPs / compute rate, bytes / memory rate), rounded up to a whole microsecond."""
        flops_rate, bytes_rate = self.compute_flops_per_us, self.memory_bytes_per_us
        flops_us = -(-matmul_flops * flops_rate.denominator // flops_rate.numerator)
        bytes_us = -(-memory_bytes * bytes_rate.denominator // bytes_rate.numerator)
        return max(flops_us, bytes_us)

    def work_us(
        self,
        phase: str,
        positions: int,
        rows: int,
        matmul_flops: int,
        memory_bytes: int,
        idle_us: int,
        work: int = 0,
        previous: str | None = None,
    ) -> tuple[int, int]:
        """(time before the work, the work's time): the roofline has no step overhead and ignores shapes."""
        return 0, self.duration_us(matmul_flops, memory_bytes)

    def finish_us(self, retained_bytes: int) -> int:
        """Host time after a request ends: the roofline has none."""
        return 0


@dataclass(frozen=True)
class StateTransferConfig:
    link_bytes_per_us: Fraction
    link_latency_us: Fraction
    blocks_compute = False  # the spec's link runs concurrently with compute

    def duration_us(self, size: int) -> int:
        """Startup plus bytes over the rate, rounded up to a whole microsecond."""
        return ceil_us(self.link_latency_us + size / self.link_bytes_per_us)

    def transfer_us(self, direction: str, size: int) -> int:
        return self.duration_us(size)


@dataclass(frozen=True)
class WorkTerms:
    """t = fixed_us + size time + per_slot_us * slot capacity + per_flop_us * matmul_flops
    + per_byte_us * memory bytes + after_idle_us if the work woke an idle engine
    + after_other_us if what ran before it on the serving thread was another kind of work or a transfer.

    A prefill's size time is size_us per executed position. A decode step's is what its executed rows
    add to a one-row step, measured per batch size: size_us holds (rows, time) pairs, ascending, and a
    batch size not listed takes the time of the largest listed size below it (0 if none). A step's
    time is far from linear in its rows (an 8-row step can take what a 4-row step takes).
    """

    fixed_us: Fraction
    size_us: Fraction | tuple[tuple[int, Fraction], ...]  # prefill: per executed position; decode: per batch size
    per_slot_us: Fraction  # per KV slot every row of the work attends over (padded, so not in the FLOPs)
    per_flop_us: Fraction
    per_byte_us: Fraction
    after_idle_us: Fraction  # a work that wakes an idle engine runs slower (caches and thread gone cold)
    # A work after another program ran on the thread runs slower (a one-row decode step right after a prefill or a
    # transfer takes markedly longer than one right after a decode step). None: a fragment without it.
    after_other_us: Fraction | None = None

    def time(
        self, size: int, slots: int, matmul_flops: int, memory_bytes: int, after_idle: bool, after_other: bool = False
    ) -> Fraction:
        return (
            self.fixed_us
            + self.size_time(size)
            + self.per_slot_us * slots
            + self.per_flop_us * matmul_flops
            + self.per_byte_us * memory_bytes
            + (self.after_idle_us if after_idle else 0)
            + (self.after_other_us if after_other and self.after_other_us is not None else 0)
        )

    def size_time(self, size: int) -> Fraction:
        if isinstance(self.size_us, Fraction):
            return self.size_us * size
        return next((time for rows, time in reversed(self.size_us) if rows <= size), Fraction(0))


@dataclass(frozen=True)
class FinishTerms:
    """Host time on the serving thread when a request that ran ends: fixed_us + per_byte_us * the bytes of
    the state it retains (0 when nothing is retained) + per_slot_us * the slot capacity. The engine then copies
    the request's whole slot row out of the slot state, compacts the active rows and admits the next request:
    the time delays whatever the thread runs next and busies no compute (far more than the host time before
    other works: docs/kvsim-calibration.md)."""

    fixed_us: Fraction
    per_byte_us: Fraction
    per_slot_us: Fraction | None = None  # None: a fragment without it (fitted only over two slot capacities)


@dataclass(frozen=True)
class Spread:
    """The per-work spread around the model's mean time: a work takes its mean time times a multiplier drawn
    from a distribution given, per kind of work, by its quantiles at evenly spaced probabilities (the first at
    0, the last at 1, linear between: the inverse of a piecewise-linear distribution function). The draw for
    a work is a hash of the seed, its kind and the work's name in the run (kvsim's engine passes the id of its first
    compute_start event), an exact rational, so a record
    replays byte for byte and another seed is another simulated repeat (a deterministic model predicts
    every work's mean, so tails made of slow works were short: docs/kvsim-calibration.md)."""

    seed: int
    prefill: tuple[Fraction, ...]  # ascending, at least two
    decode: tuple[Fraction, ...]

    def multiplier(self, phase: str, work: int) -> Fraction:
        quantiles = self.prefill if phase == PREFILL else self.decode
        digest = hashlib.blake2b(f"{self.seed}/{phase == PREFILL}/{work}".encode(), digest_size=8).digest()
        at = Fraction(int.from_bytes(digest, "big") * (len(quantiles) - 1), 1 << 64)  # in [0, len - 1)
        below = at.numerator // at.denominator
        return quantiles[below] + (quantiles[below + 1] - quantiles[below]) * (at - below)


@dataclass(frozen=True)
class CalibratedComputeService:
    prefill: WorkTerms
    decode: WorkTerms
    step_overhead_us: Fraction  # host time before each compute work (scheduling, bookkeeping)
    after_idle_min_us: Fraction  # a work wakes an idle engine when the engine was idle at least this long
    slot_capacity: int  # KV slots per row of the engine's compiled programs
    prefill_window_buckets: tuple[int, ...]  # the engine's compiled prefill windows, ascending
    decode_batch_buckets: tuple[int, ...]  # the engine's compiled decode batch sizes, ascending
    finish: FinishTerms | None = None  # None: a fragment without it (no host time after a request ends)
    spread: Spread | None = None  # None: every work takes its mean time

    def work_us(
        self,
        phase: str,
        positions: int,
        rows: int,
        matmul_flops: int,
        memory_bytes: int,
        idle_us: int,
        work: int = 0,
        previous: str | None = None,
    ) -> tuple[int, int]:
        """(step overhead, the work's time), each rounded up to a whole microsecond.

        The engine runs compiled shapes: a prefill of `positions` new ids executes the
        smallest window bucket that holds them, a decode step of `rows` requests the
        smallest batch bucket; beyond the largest bucket the size itself. `idle_us` is how
        long the engine had been idle when the work started (0: it was busy); `work` names
        the work, uniquely in the run (what a spread draws its multiplier from); `previous` is
        what the serving thread started last before it (PREFILL, DECODE or TRANSFER; None: nothing).
        """
        after_idle = idle_us > 0 and idle_us >= self.after_idle_min_us
        after_other = previous is not None and previous != phase
        if phase == PREFILL:
            size, terms = executed(self.prefill_window_buckets, positions), self.prefill
        else:
            size, terms = executed(self.decode_batch_buckets, rows), self.decode
        time = terms.time(size, self.slot_capacity, matmul_flops, memory_bytes, after_idle, after_other)
        if self.spread is not None:
            time *= self.spread.multiplier(phase, work)
        return ceil_us(self.step_overhead_us), ceil_us(time)

    def finish_us(self, retained_bytes: int) -> int:
        """Host time after a request that ran ends, rounded up to a whole microsecond."""
        if self.finish is None:
            return 0
        finish = self.finish
        per_slot = finish.per_slot_us * self.slot_capacity if finish.per_slot_us is not None else 0
        return ceil_us(finish.fixed_us + finish.per_byte_us * retained_bytes + per_slot)


@dataclass(frozen=True)
class LinkTerms:
    latency_us: Fraction
    per_byte_us: Fraction


@dataclass(frozen=True)
class CalibratedTransfer:
    device_to_host: LinkTerms
    host_to_device: LinkTerms
    blocks_compute: bool = False  # the engine runs transfers and works on one thread, one after another

    def transfer_us(self, direction: str, size: int) -> int:
        terms = self.device_to_host if direction == DEVICE_TO_HOST else self.host_to_device
        return ceil_us(terms.latency_us + terms.per_byte_us * size)


def executed(buckets: tuple[int, ...], n: int) -> int:
    return next((b for b in buckets if b >= n), n)


# -- JSON ------------------------------------------------------------------------------------------------------


def parse_compute_service(value: Any, field: str) -> ComputeServiceConfig | CalibratedComputeService:
    model = _model(value, field)
    if model == ROOFLINE:
        compute = validation.mapping(value, field, {"compute_flops_per_us", "memory_bytes_per_us"}, {"model"})
        return ComputeServiceConfig(
            compute_flops_per_us=validation.positive_rate(
                compute["compute_flops_per_us"], f"{field}.compute_flops_per_us"
            ),
            memory_bytes_per_us=validation.positive_rate(
                compute["memory_bytes_per_us"], f"{field}.memory_bytes_per_us"
            ),
        )
    top = validation.mapping(
        value,
        field,
        {"model", "prefill", "decode", "step_overhead_us", "after_idle_min_us", "slot_capacity",
         "prefill_window_buckets", "decode_batch_buckets"},
        {"finish", "spread"},
    )  # fmt: skip
    return CalibratedComputeService(
        prefill=_work_terms(top["prefill"], f"{field}.prefill", PREFILL),
        decode=_work_terms(top["decode"], f"{field}.decode", DECODE),
        step_overhead_us=validation.number(top["step_overhead_us"], f"{field}.step_overhead_us"),
        after_idle_min_us=validation.number(top["after_idle_min_us"], f"{field}.after_idle_min_us"),
        slot_capacity=validation.integer(top["slot_capacity"], f"{field}.slot_capacity", 1),
        prefill_window_buckets=_buckets(top["prefill_window_buckets"], f"{field}.prefill_window_buckets"),
        decode_batch_buckets=_buckets(top["decode_batch_buckets"], f"{field}.decode_batch_buckets"),
        finish=_finish_terms(top["finish"], f"{field}.finish") if "finish" in top else None,
        spread=_spread(top["spread"], f"{field}.spread") if "spread" in top else None,
    )


def parse_transfer(value: Any, field: str) -> StateTransferConfig | CalibratedTransfer:
    if _model(value, field) == ROOFLINE:
        transfer = validation.mapping(value, field, {"link_bytes_per_us", "link_latency_us"}, {"model"})
        return StateTransferConfig(
            link_bytes_per_us=validation.positive_rate(transfer["link_bytes_per_us"], f"{field}.link_bytes_per_us"),
            link_latency_us=validation.number(transfer["link_latency_us"], f"{field}.link_latency_us"),
        )
    top = validation.mapping(value, field, {"model", DEVICE_TO_HOST, HOST_TO_DEVICE}, {"blocks_compute"})
    blocks = top.get("blocks_compute", False)
    if not isinstance(blocks, bool):
        raise ApiError(f"{field}.blocks_compute", f"expected true or false, got {blocks!r}")
    device_to_host, host_to_device = (_link_terms(top[d], f"{field}.{d}") for d in (DEVICE_TO_HOST, HOST_TO_DEVICE))
    return CalibratedTransfer(device_to_host, host_to_device, blocks)


def compute_service_json(config: ComputeServiceConfig | CalibratedComputeService) -> dict:
    """The normalized form; a roofline is written exactly as before the calibrated model existed."""
    if isinstance(config, ComputeServiceConfig):
        return {
            "compute_flops_per_us": validation.json_number(config.compute_flops_per_us),
            "memory_bytes_per_us": validation.json_number(config.memory_bytes_per_us),
        }
    written = {
        "model": CALIBRATED,
        "prefill": _work_terms_json(config.prefill, PREFILL),
        "decode": _work_terms_json(config.decode, DECODE),
        "step_overhead_us": validation.json_number(config.step_overhead_us),
        "after_idle_min_us": validation.json_number(config.after_idle_min_us),
        "slot_capacity": config.slot_capacity,
        "prefill_window_buckets": list(config.prefill_window_buckets),
        "decode_batch_buckets": list(config.decode_batch_buckets),
    }
    if config.finish is not None:  # written only when given, so an older fragment's records keep their bytes
        finish = config.finish
        finish_terms = {
            "fixed_us": validation.json_number(finish.fixed_us),
            "per_byte_us": validation.json_number(finish.per_byte_us),
        }
        if finish.per_slot_us is not None:  # likewise
            finish_terms["per_slot_us"] = validation.json_number(finish.per_slot_us)
        written["finish"] = finish_terms
    if config.spread is not None:  # likewise
        spread = config.spread
        written["spread"] = {"seed": spread.seed} | {
            phase: [validation.json_number(q) for q in quantiles]
            for phase, quantiles in ((PREFILL, spread.prefill), (DECODE, spread.decode))
        }
    return written


def transfer_json(config: StateTransferConfig | CalibratedTransfer) -> dict:
    if isinstance(config, StateTransferConfig):
        return {
            "link_bytes_per_us": validation.json_number(config.link_bytes_per_us),
            "link_latency_us": validation.json_number(config.link_latency_us),
        }
    return (
        {"model": CALIBRATED}
        | {
            direction: {
                "latency_us": validation.json_number(t.latency_us),
                "per_byte_us": validation.json_number(t.per_byte_us),
            }
            for direction, t in ((DEVICE_TO_HOST, config.device_to_host), (HOST_TO_DEVICE, config.host_to_device))
        }
        | {"blocks_compute": config.blocks_compute}
    )


def _model(value: Any, field: str) -> str:
    if not isinstance(value, dict):
        validation.mapping(value, field, set())
    return validation.string(value.get("model", ROOFLINE), f"{field}.model", (ROOFLINE, CALIBRATED))


AFTER_OTHER_US = "after_other_us"  # a kind of work's optional term (a fragment may leave it out)


def term_names(phase: str) -> tuple[str, ...]:
    """The JSON names of a kind of work's required terms, in WorkTerms order."""
    return ("fixed_us", SIZE_TERMS[phase], "per_slot_us", "per_flop_us", "per_byte_us", "after_idle_us")


def _work_terms(value: Any, field: str, phase: str) -> WorkTerms:
    names = term_names(phase)
    terms = validation.mapping(value, field, set(names), {AFTER_OTHER_US})

    def read(name: str) -> Fraction:
        return validation.number(terms[name], f"{field}.{name}")

    fixed, size, slot, flop, byte, idle = names
    per_size = _batch_times(terms[size], f"{field}.{size}") if phase == DECODE else read(size)
    other = read(AFTER_OTHER_US) if AFTER_OTHER_US in terms else None
    return WorkTerms(read(fixed), per_size, read(slot), read(flop), read(byte), read(idle), other)


def _work_terms_json(terms: WorkTerms, phase: str) -> dict:
    values = (
        terms.fixed_us,
        terms.size_us,
        terms.per_slot_us,
        terms.per_flop_us,
        terms.per_byte_us,
        terms.after_idle_us,
    )
    written = {
        name: {str(rows): validation.json_number(t) for rows, t in v}
        if isinstance(v, tuple)
        else validation.json_number(v)
        for name, v in zip(term_names(phase), values, strict=True)
    }
    if terms.after_other_us is not None:  # written only when given, so an older fragment's records keep their bytes
        written[AFTER_OTHER_US] = validation.json_number(terms.after_other_us)
    return written


def _finish_terms(value: Any, field: str) -> FinishTerms:
    terms = validation.mapping(value, field, {"fixed_us", "per_byte_us"}, {"per_slot_us"})
    fixed, per_byte = (validation.number(terms[name], f"{field}.{name}") for name in ("fixed_us", "per_byte_us"))
    per_slot = validation.number(terms["per_slot_us"], f"{field}.per_slot_us") if "per_slot_us" in terms else None
    return FinishTerms(fixed, per_byte, per_slot)


def _spread(value: Any, field: str) -> Spread:
    spread = validation.mapping(value, field, {"seed", PREFILL, DECODE})
    return Spread(
        validation.integer(spread["seed"], f"{field}.seed"),
        *(_quantiles(spread[p], f"{field}.{p}") for p in (PREFILL, DECODE)),
    )


def _quantiles(value: Any, field: str) -> tuple[Fraction, ...]:
    """Quantiles of a multiplier: numbers >= 0, ascending, at least two (the distribution's least and greatest)."""
    items = validation.array(value, field)
    if not 2 <= len(items) <= SPREAD_QUANTILES_MAX:
        raise ApiError(field, f"expected 2 to {SPREAD_QUANTILES_MAX} quantiles, got {len(items)}")
    quantiles = tuple(validation.number(q, f"{field}[{i}]") for i, q in enumerate(items))
    if any(a > b for a, b in zip(quantiles, quantiles[1:])):
        raise ApiError(field, "quantiles must be ascending")
    return quantiles


def _batch_times(value: Any, field: str) -> tuple[tuple[int, Fraction], ...]:
    """{"rows": time, ...}: rows a decimal integer >= 2 (a one-row step is the fixed time), written ascending."""
    times = validation.loose_mapping(value, field, set())
    rows = []
    for key in times:
        if not (key.isascii() and key.isdigit() and not key.startswith("0") and int(key) >= 2):
            raise ApiError(f"{field}.{key}", "expected a batch size: a decimal integer >= 2")
        rows.append(int(key))
    if rows != sorted(rows):
        raise ApiError(field, f"batch sizes must be ascending, got {list(times)}")
    return tuple((int(key), validation.number(time, f"{field}.{key}")) for key, time in times.items())


def _link_terms(value: Any, field: str) -> LinkTerms:
    terms = validation.mapping(value, field, {"latency_us", "per_byte_us"})
    return LinkTerms(
        validation.number(terms["latency_us"], f"{field}.latency_us"),
        validation.number(terms["per_byte_us"], f"{field}.per_byte_us"),
    )


def _buckets(value: Any, field: str) -> tuple[int, ...]:
    buckets = validation.integers(value, field, minimum=1)
    if not buckets:
        raise ApiError(field, "needs at least one bucket")
    if any(a >= b for a, b in zip(buckets, buckets[1:])):
        raise ApiError(field, f"must be strictly ascending, got {buckets}")
    return tuple(buckets)
