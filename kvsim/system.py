"""InferenceSystem: the KVResidencySystemConfig and the mechanism configs it composes.

RequestSchedulingConfig, KVCacheConfig, StateTransferConfig and
ComputeServiceConfig are frozen values validated from JSON. Rates are kept as
exact rationals of the lexeme the JSON wrote, so every duration derived from
them is an exact integer of virtual microseconds (see `docs/kvsim.md`). The
transfer and compute services are either the hypothetical roofline or a model
calibrated on an engine's measurements (`kvsim.compute_service`); a calibrated
system also says where its parameters came from (`calibration`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from jgpt.foundation.validation import Integer, ListOf, Object, String
from kvsim.compute_service import (
    CalibratedComputeService,
    CalibratedTransfer,
    ComputeServiceConfig,
    StateTransferConfig,
    compute_service_json,
    parse_compute_service,
    parse_transfer,
    transfer_json,
)


class SchedulingPolicy(StrEnum):
    SERIALIZED = "serialized"  # one request's work at a time, round-robin over ready requests
    CONTINUOUS_BATCHING = "continuous_batching"  # kvsim extension: ready decode steps run as one batch


class RetentionPolicy(StrEnum):
    LRU = "lru"  # finished requests' states are retained and evicted least recently used first
    NONE = "none"  # kvsim extension: the no-reuse baseline


SERIALIZED, CONTINUOUS_BATCHING = SchedulingPolicy.SERIALIZED, SchedulingPolicy.CONTINUOUS_BATCHING
SCHEDULING_POLICIES, RETENTION_POLICIES = tuple(SchedulingPolicy), tuple(RetentionPolicy)

_OPEN = Object({}, open=True)
SCHEDULING = Object({"max_active_requests": Integer(1)}, {"policy": String(SCHEDULING_POLICIES)})
KV_CACHE = Object(
    {"device_kv_bytes": Integer(1), "host_kv_bytes": Integer(0)}, {"retention_policy": String(RETENTION_POLICIES)}
)
CALIBRATION = Object({"backend": _OPEN, "machine": _OPEN, "sources": ListOf(String()), "works": Integer()})
# kvsim.compute_service reads transfer and compute_service with its own readers, not yet from a description.
_SERVICE = Object({}, open=True, about="a roofline or calibrated model: see docs/kvsim.md (kvsim.compute_service)")
SYSTEM = Object(
    {"max_requests": Integer(1), "max_new_tokens_cap": Integer(1), "scheduling": SCHEDULING, "kv_cache": KV_CACHE,
     "transfer": _SERVICE, "compute_service": _SERVICE},
    {"calibration": CALIBRATION},
    about="KVResidencySystemConfig: the mechanisms kvsim simulates and the InferenceEngine runs.",
)  # fmt: skip


@dataclass(frozen=True)
class RequestSchedulingConfig:
    max_active_requests: int
    policy: SchedulingPolicy = SERIALIZED


@dataclass(frozen=True)
class KVCacheConfig:
    device_kv_bytes: int
    host_kv_bytes: int
    retention_policy: RetentionPolicy = RetentionPolicy.LRU


@dataclass(frozen=True)
class KVResidencySystemConfig:
    max_requests: int
    max_new_tokens_cap: int
    scheduling: RequestSchedulingConfig
    kv_cache: KVCacheConfig
    transfer: StateTransferConfig | CalibratedTransfer
    compute_service: ComputeServiceConfig | CalibratedComputeService
    calibration: dict | None = None  # where calibrated parameters came from (jgpt kvsim calibrate)


def parse_system(value: Any, field: str = "system") -> KVResidencySystemConfig:
    top = SYSTEM.read(value, field)
    scheduling, cache = top["scheduling"], top["kv_cache"]
    return KVResidencySystemConfig(
        max_requests=top["max_requests"],
        max_new_tokens_cap=top["max_new_tokens_cap"],
        scheduling=RequestSchedulingConfig(
            scheduling["max_active_requests"], SchedulingPolicy(scheduling.get("policy", SERIALIZED))
        ),
        kv_cache=KVCacheConfig(
            cache["device_kv_bytes"], cache["host_kv_bytes"], RetentionPolicy(cache.get("retention_policy", "lru"))
        ),
        transfer=parse_transfer(top["transfer"], f"{field}.transfer"),
        compute_service=parse_compute_service(top["compute_service"], f"{field}.compute_service"),
        # Recorded as given: the measured runs' backend, machine and sha256 digests, and the works fitted.
        calibration=value["calibration"] if "calibration" in top else None,
    )


def system_json(config: KVResidencySystemConfig) -> dict:
    """The normalized JSON form (defaults filled in) that records carry and replays read back."""
    normalized = {
        "max_requests": config.max_requests,
        "max_new_tokens_cap": config.max_new_tokens_cap,
        "scheduling": {
            "max_active_requests": config.scheduling.max_active_requests,
            "policy": config.scheduling.policy,
        },
        "kv_cache": {
            "device_kv_bytes": config.kv_cache.device_kv_bytes,
            "host_kv_bytes": config.kv_cache.host_kv_bytes,
            "retention_policy": config.kv_cache.retention_policy,
        },
        "transfer": transfer_json(config.transfer),
        "compute_service": compute_service_json(config.compute_service),
    }
    return normalized if config.calibration is None else normalized | {"calibration": config.calibration}
