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
from typing import Any

from kvsim import fields
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

SERIALIZED = "serialized"
CONTINUOUS_BATCHING = "continuous_batching"
SCHEDULING_POLICIES = (SERIALIZED, CONTINUOUS_BATCHING)
RETENTION_POLICIES = ("lru", "none")


@dataclass(frozen=True)
class RequestSchedulingConfig:
    max_active_requests: int
    policy: str = SERIALIZED  # kvsim extension: the serialized baseline or continuous batching


@dataclass(frozen=True)
class KVCacheConfig:
    device_kv_bytes: int
    host_kv_bytes: int
    retention_policy: str = "lru"


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
    top = fields.mapping(
        value,
        field,
        {"max_requests", "max_new_tokens_cap", "scheduling", "kv_cache", "transfer", "compute_service"},
        {"calibration"},
    )
    scheduling = fields.mapping(top["scheduling"], f"{field}.scheduling", {"max_active_requests"}, {"policy"})
    cache = fields.mapping(
        top["kv_cache"], f"{field}.kv_cache", {"device_kv_bytes", "host_kv_bytes"}, {"retention_policy"}
    )
    return KVResidencySystemConfig(
        max_requests=fields.integer(top["max_requests"], f"{field}.max_requests", 1),
        max_new_tokens_cap=fields.integer(top["max_new_tokens_cap"], f"{field}.max_new_tokens_cap", 1),
        scheduling=RequestSchedulingConfig(
            max_active_requests=fields.integer(
                scheduling["max_active_requests"], f"{field}.scheduling.max_active_requests", 1
            ),
            policy=fields.string(
                scheduling.get("policy", SERIALIZED), f"{field}.scheduling.policy", SCHEDULING_POLICIES
            ),
        ),
        kv_cache=KVCacheConfig(
            device_kv_bytes=fields.integer(cache["device_kv_bytes"], f"{field}.kv_cache.device_kv_bytes", 1),
            host_kv_bytes=fields.integer(cache["host_kv_bytes"], f"{field}.kv_cache.host_kv_bytes", 0),
            retention_policy=fields.string(
                cache.get("retention_policy", "lru"), f"{field}.kv_cache.retention_policy", RETENTION_POLICIES
            ),
        ),
        transfer=parse_transfer(top["transfer"], f"{field}.transfer"),
        compute_service=parse_compute_service(top["compute_service"], f"{field}.compute_service"),
        calibration=_calibration(top["calibration"], f"{field}.calibration") if "calibration" in top else None,
    )


def _calibration(value: Any, field: str) -> dict:
    """Recorded as given: the measured runs' backend, machine and sha256 digests, and the works fitted."""
    calibration = fields.mapping(value, field, {"backend", "machine", "sources", "works"})
    fields.loose_mapping(calibration["backend"], f"{field}.backend", set())
    fields.loose_mapping(calibration["machine"], f"{field}.machine", set())
    for index, source in enumerate(fields.array(calibration["sources"], f"{field}.sources")):
        fields.string(source, f"{field}.sources[{index}]")
    fields.integer(calibration["works"], f"{field}.works")
    return calibration


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
