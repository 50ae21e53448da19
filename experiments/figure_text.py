"""How the figures of a record read to a person: each summary field and control value in its human unit.

summary.json and the record keep the exact numbers; these are the words a report and a printed
summary show for them, each beside its exact value (a report puts the exact value in a `title`
attribute, so it shows on hover). A field's unit follows from what it measures: virtual or wall
microseconds, bytes, fractions, FLOPs, counts, decode rates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jgpt.foundation.units import byte_rate, byte_size, count, duration_us, flop_count, flop_rate, percent


def _number(form: str, unit: str = "") -> Callable[[Any], str]:
    return lambda value: "-" if value is None else f"{value:{form}}{unit}"


def _yes_no(value: Any) -> str:
    return "-" if value is None else "yes" if value else "no"


def _whole(value: Any) -> str:
    return "-" if value is None else count(value)


# Summary fields a lab's answer may name: (short caption for a table column, how its value reads).
METRICS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "completed": ("completed", _whole),
    "cancelled": ("cancelled", _whole),
    "rejected": ("rejected", _whole),
    "ttft_p50_us": ("TTFT p50", duration_us),
    "ttft_p90_us": ("TTFT p90", duration_us),
    "e2e_p50_us": ("e2e p50", duration_us),
    "e2e_p90_us": ("e2e p90", duration_us),
    "tpot_p50_us": ("per token p50", duration_us),
    "queueing_p90_us": ("queueing p90", duration_us),
    "token_hit_rate": ("token hits", percent),
    "saved_matmul_flops": ("saved FLOPs", flop_count),
    "offloads": ("offloads", _whole),
    "reloads": ("reloads", _whole),
    "bytes_host_to_device": ("host->device", byte_size),
    "compute_busy_us": ("compute busy", duration_us),
    "end_us": ("end", duration_us),
    # a generate arm's row (experiments/decoding_arms.py)
    "requests": ("requests", _whole),
    "decode_ids": ("decode ids", _whole),
    "rounds": ("rounds", _whole),
    "acceptance_rate": ("accepted", percent),
    "ids_per_round": ("ids/round", _number(".2f")),
    "decode_tokens_per_s": ("decode tok/s", _number(".1f", " tok/s")),
    "vs_greedy": ("vs greedy", _number(".2f", "x")),
    "same_ids_as_greedy": ("greedy's ids", _yes_no),
}
# What a fidelity row's field reads as (kvsim.fidelity.compare's field names).
FIDELITY_FIELDS = {"hit_rate_device": percent, "hit_rate_host": percent, "token_hit_rate": percent}


def metric_caption(key: str) -> str:
    return METRICS[key][0] if key in METRICS else key


def metric_text(key: str, value: Any) -> str:
    """`value` of summary field `key` in its unit; a field this module does not know reads as it is."""
    if key in METRICS:
        return METRICS[key][1](value)
    if isinstance(value, bool) or value is None:
        return _yes_no(value)
    return str(value)


def fidelity_text(field: str, value: Any) -> str:
    """A measured or predicted value of a fidelity row: latencies and busy time in microseconds, hit rates."""
    return FIDELITY_FIELDS.get(field, duration_us)(value)


def control_text(name: str, value: Any) -> str:
    """A control's value in its unit, read from the control's name: sizes, bandwidths, rates, times."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if name.endswith("_bytes_per_us"):
        return byte_rate(value)
    if name.endswith("_flops_per_us"):
        return flop_rate(value)
    if name.endswith("_bytes"):
        return byte_size(value)
    if name.endswith("_us"):
        return duration_us(value)
    return str(value)


# A control's unit suffix, and the noun its caption ends with instead (the value shows the unit).
_SUFFIXES = (("_bytes_per_us", " bandwidth"), ("_flops_per_us", " rate"), ("_bytes", " budget"), ("_us", ""))


def control_caption(name: str) -> str:
    """A control's last dotted part in words, its unit left to the value: kv_cache.host_kv_bytes -> 'host kv
    budget', transfer.link_bytes_per_us -> 'link bandwidth'."""
    last = name.rsplit(".", 1)[-1]
    for suffix, noun in _SUFFIXES:
        if last.endswith(suffix):
            last = last[: -len(suffix)] + noun
            break
    return last.replace("_", " ")


def arm_caption(assignments: Mapping[str, Any]) -> str:
    """An arm's swept controls in a few words: {'kv_cache.host_kv_bytes': 0, ...} -> 'host kv bytes 0 B, ...'."""
    return ", ".join(f"{control_caption(name)} {control_text(name, value)}" for name, value in assignments.items())


def cell(text: str, exact: Any) -> dict[str, Any]:
    """A table cell: what it shows, and the exact value a title attribute and the JSON keep."""
    return {"text": text, "exact": exact}
