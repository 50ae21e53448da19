"""ServingMetrics: what a live server has served, in the Prometheus text exposition format (GET /metrics).

Counts and latencies come from the engine's own outcomes (kvsim's fields: the times it measured, the
positions it reused), folded in as each request ends, so the metrics and the recorded run agree; the
queue and the KV bytes are the engine's gauges after its last happening. Hit rates are kvsim's: a lookup
per admitted request, a hit where it reused a retained state on that tier, and the token hit rate the
reused share of the admitted prompts' positions.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Any

from inference.live_traffic import Ended, Gauges, Publication, Selected

OUTCOMES = ("completed", "stopped", "cancelled", "rejected")
# Upper bounds in seconds, from a decode step on a small model to a long queue.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_HISTOGRAMS = {
    "ttft_us": ("jgpt_time_to_first_token_seconds", "From arrival to the first selected id."),
    "tpot_us": ("jgpt_time_per_output_token_seconds", "Mean time between selected ids after the first."),
    "e2e_us": ("jgpt_e2e_request_latency_seconds", "From arrival to the end of the request."),
    "queueing_us": ("jgpt_queue_time_seconds", "From arrival to admission."),
}


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last: above every bound
        self.sum = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds

    def lines(self, name: str) -> list[str]:
        lines, running = [], 0
        for bound, count in zip((*map(repr, LATENCY_BUCKETS), "+Inf"), self.counts):
            running += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {running}')
        return [*lines, f"{name}_sum {self.sum!r}", f"{name}_count {running}"]


class ServingMetrics:
    """Folds in the engine's publications (`observe`) and the endpoint's responses (`responded`)."""

    def __init__(self, gauges: Callable[[], Gauges], device_kv_capacity: int, host_kv_capacity: int):
        self.gauges = gauges
        self.capacity = {"device": device_kv_capacity, "host": host_kv_capacity}
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.responses: dict[tuple[str, int], int] = {}
        self.disconnects = 0
        self.selected = self.prompt = self.reused = self.admitted = 0
        self.hits = {"device": 0, "host": 0}
        self.histograms = {key: Histogram() for key in _HISTOGRAMS}

    def observe(self, request_id: str, publication: Publication) -> None:
        if isinstance(publication, Selected):
            self.selected += 1
        elif isinstance(publication, Ended):
            self.ended(publication.outcome)

    def ended(self, outcome: Mapping[str, Any]) -> None:
        self.outcomes[outcome["status"]] += 1
        if outcome["admitted_us"] is None:
            return
        self.admitted += 1
        self.prompt += outcome["prompt_positions"]
        self.reused += outcome["reuse_positions"]
        if outcome["reuse_tier"] in self.hits:
            self.hits[outcome["reuse_tier"]] += 1
        for key, histogram in self.histograms.items():
            if outcome[key] is not None:
                histogram.add(outcome[key] / 1e6)

    def responded(self, endpoint: str, status: int) -> None:
        self.responses[endpoint, status] = self.responses.get((endpoint, status), 0) + 1

    def disconnected(self) -> None:
        self.disconnects += 1

    def text(self) -> str:
        gauges = self.gauges()
        lines: list[str] = []

        def metric(name: str, kind: str, about: str, samples: list[tuple[str, Any]]) -> None:
            lines.extend([f"# HELP {name} {about}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{labels} {value}" for labels, value in samples)

        metric("jgpt_requests_total", "counter", "Requests the engine ended, by outcome.",
               [(f'{{outcome="{o}"}}', n) for o, n in self.outcomes.items()])  # fmt: skip
        metric("jgpt_http_responses_total", "counter", "HTTP responses, by endpoint and status code.",
               [(f'{{endpoint="{e}",code="{c}"}}', n) for (e, c), n in sorted(self.responses.items())])  # fmt: skip
        metric("jgpt_client_disconnects_total", "counter", "Requests cancelled because the client went away.",
               [("", self.disconnects)])  # fmt: skip
        metric("jgpt_prompt_tokens_total", "counter", "Prompt positions of admitted requests.", [("", self.prompt)])
        metric("jgpt_reused_prompt_tokens_total", "counter", "Prompt positions reused from retained KV states.",
               [("", self.reused)])  # fmt: skip
        metric("jgpt_generation_tokens_total", "counter", "Ids selected (the end of a turn included).",
               [("", self.selected)])  # fmt: skip
        metric("jgpt_prefix_lookups_total", "counter", "Retained-state lookups: one per admitted request.",
               [("", self.admitted)])  # fmt: skip
        metric("jgpt_prefix_hits_total", "counter", "Lookups that reused a retained state, by its tier.",
               [(f'{{tier="{t}"}}', n) for t, n in self.hits.items()])  # fmt: skip
        metric("jgpt_prefix_hit_rate", "gauge", "Hits per lookup, by tier.",
               [(f'{{tier="{t}"}}', _rate(n, self.admitted)) for t, n in self.hits.items()])  # fmt: skip
        metric("jgpt_token_hit_rate", "gauge", "Reused prompt positions per admitted prompt position.",
               [("", _rate(self.reused, self.prompt))])  # fmt: skip
        metric("jgpt_requests_waiting", "gauge", "Requests in the system waiting for admission.",
               [("", gauges.waiting)])  # fmt: skip
        metric("jgpt_requests_running", "gauge", "Admitted requests not yet ended.", [("", gauges.running)])
        metric("jgpt_kv_bytes", "gauge", "KV bytes held (reserved and retained), by tier.",
               [('{tier="device"}', gauges.device_kv_bytes), ('{tier="host"}', gauges.host_kv_bytes)])  # fmt: skip
        metric("jgpt_kv_capacity_bytes", "gauge", "The system's KV byte budget, by tier.",
               [(f'{{tier="{t}"}}', n) for t, n in self.capacity.items()])  # fmt: skip
        for key, (name, about) in _HISTOGRAMS.items():
            lines.extend([f"# HELP {name} {about}", f"# TYPE {name} histogram", *self.histograms[key].lines(name)])
        return "\n".join(lines) + "\n"


def _rate(part: int, whole: int) -> float:
    return part / whole if whole else 0.0
