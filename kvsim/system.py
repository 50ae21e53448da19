"""InferenceSystem: the KVResidencySystemConfig and the mechanism configs it composes.

RequestSchedulingConfig, KVCacheConfig, StateTransferConfig and
ComputeServiceConfig are frozen values validated from JSON. Rates are kept as
exact rationals of the lexeme the JSON wrote, so every duration derived from
them is an exact integer of virtual microseconds (see `docs/kvsim.md`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kvsim import fields

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
class StateTransferConfig:
    link_bytes_per_us: Fraction
    link_latency_us: Fraction

    def duration_us(self, size: int) -> int:
        """Startup plus bytes over the rate, rounded up to a whole microsecond."""
        return _ceil(self.link_latency_us + size / self.link_bytes_per_us)


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


@dataclass(frozen=True)
class KVResidencySystemConfig:
    max_requests: int
    max_new_tokens_cap: int
    scheduling: RequestSchedulingConfig
    kv_cache: KVCacheConfig
    transfer: StateTransferConfig
    compute_service: ComputeServiceConfig


def parse_system(value: Any, field: str = "system") -> KVResidencySystemConfig:
    top = fields.mapping(
        value, field, {"max_requests", "max_new_tokens_cap", "scheduling", "kv_cache", "transfer", "compute_service"}
    )
    scheduling = fields.mapping(top["scheduling"], f"{field}.scheduling", {"max_active_requests"}, {"policy"})
    cache = fields.mapping(
        top["kv_cache"], f"{field}.kv_cache", {"device_kv_bytes", "host_kv_bytes"}, {"retention_policy"}
    )
    transfer = fields.mapping(top["transfer"], f"{field}.transfer", {"link_bytes_per_us", "link_latency_us"})
    compute = fields.mapping(
        top["compute_service"], f"{field}.compute_service", {"compute_flops_per_us", "memory_bytes_per_us"}
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
        transfer=StateTransferConfig(
            link_bytes_per_us=fields.positive_rate(
                transfer["link_bytes_per_us"], f"{field}.transfer.link_bytes_per_us"
            ),
            link_latency_us=fields.number(transfer["link_latency_us"], f"{field}.transfer.link_latency_us"),
        ),
        compute_service=ComputeServiceConfig(
            compute_flops_per_us=fields.positive_rate(
                compute["compute_flops_per_us"], f"{field}.compute_service.compute_flops_per_us"
            ),
            memory_bytes_per_us=fields.positive_rate(
                compute["memory_bytes_per_us"], f"{field}.compute_service.memory_bytes_per_us"
            ),
        ),
    )


def system_json(config: KVResidencySystemConfig) -> dict:
    """The normalized JSON form (defaults filled in) that records carry and replays read back."""
    return {
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
        "transfer": {
            "link_bytes_per_us": fields.json_number(config.transfer.link_bytes_per_us),
            "link_latency_us": fields.json_number(config.transfer.link_latency_us),
        },
        "compute_service": {
            "compute_flops_per_us": fields.json_number(config.compute_service.compute_flops_per_us),
            "memory_bytes_per_us": fields.json_number(config.compute_service.memory_bytes_per_us),
        },
    }


def _ceil(value: Fraction) -> int:
    return -(-value.numerator // value.denominator)
