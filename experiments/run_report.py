"""`jgpt report RECORD` for a plain kvsim record (what `jgpt kvsim run --out` writes): a page for one run.

The record must replay byte for byte (kvsim's `rerun`) before anything is written. The page opens with
the run's totals in human units (exact values on hover), then its timeline and KV occupancy, then every
request's outcome. Like a lab's report it embeds everything it shows and loads nothing; it has no
script at all, and its Content-Security-Policy admits only its own style by SHA-256. Every recorded
string is escaped before it becomes markup.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
from pathlib import Path
from typing import Any

from experiments.figure_text import cell
from experiments.report_figures import timeline_figure
from experiments.report_tables import html_table
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes, write_atomically
from jgpt.foundation.units import byte_size, count, duration_us, flop_count, percent
from kvsim import read_record, record_json, rerun

# Drawn one row per request: past this many the timeline would be taller than a browser draws a picture.
TIMELINE_REQUEST_LIMIT = 200
_TOTALS = (
    ("completed", count),
    ("cancelled", count),
    ("rejected", count),
    ("token_hit_rate", percent),
    ("saved_matmul_flops", flop_count),
    ("bytes_device_to_host", byte_size),
    ("bytes_host_to_device", byte_size),
    ("compute_busy_us", duration_us),
    ("compute_busy_fraction", percent),
    ("end_us", duration_us),
)
_OUTCOMES = (
    ("arrival_us", duration_us),
    ("queueing_us", duration_us),
    ("ttft_us", duration_us),
    ("tpot_us", duration_us),
    ("e2e_us", duration_us),
    ("prompt_positions", count),
    ("reuse_positions", count),
)


def is_kvsim_record(document: Any) -> bool:
    """A kvsim record (a CacheRun) rather than a lab's record.json: it declares its run and lists its events."""
    return isinstance(document, dict) and "declaration" in document and "events" in document


def write_run_report(record_path: Path, out: Path) -> Path:
    """Check the record replays byte for byte, then write its page to `out` (atomically)."""
    data = read_bytes(record_path, "record")
    recorded = read_record(data)
    replayed = record_json(rerun(recorded))
    if replayed != data:
        raise ApiError(
            "RECORD", "does not replay byte for byte (`jgpt kvsim replay RECORD` names the first difference)"
        )
    write_atomically(Path(out), _page(recorded).encode())
    return Path(out)


def _page(run: dict[str, Any]) -> str:
    totals = run["outcomes"]["totals"]
    requests = run["outcomes"]["requests"]
    latency = totals["latency_us"]
    summary = {
        "columns": ["figure", "value"],
        "rows": [
            [cell(name.removesuffix("_us").replace("_", " "), name), cell(show(totals[name]), totals[name])]
            for name, show in _TOTALS
        ]
        + [
            [cell(f"{name} {p}", f"latency_us.{name}.{p}"), cell(duration_us(latency[name][p]), latency[name][p])]
            for name in ("ttft", "tpot", "e2e", "queueing")
            for p in ("p50", "p90", "p99")
        ],
    }
    outcomes = {
        "columns": ["request", "status", *(name.replace("_us", "").replace("_", " ") for name, _ in _OUTCOMES)],
        "rows": [
            [cell(request_id, request_id), cell(outcome["status"], outcome["status"])]
            + [cell(show(outcome[name]), outcome[name]) for name, show in _OUTCOMES]
            for request_id, outcome in requests.items()
        ],
    }
    if len(requests) <= TIMELINE_REQUEST_LIMIT:
        picture = io.BytesIO()
        timeline_figure(run, run["id"]).savefig(picture, format="png", dpi=100)
        timeline = (
            f'<img alt="kvsim timeline" src="data:image/png;base64,{base64.b64encode(picture.getvalue()).decode()}">'
        )
    else:
        timeline = (
            f"<p>The timeline draws one row per request and is drawn for runs of at most {TIMELINE_REQUEST_LIMIT} "
            f"requests; this run has {len(requests)}, every one of them in the table below "
            "(<code>jgpt kvsim plot</code> draws its aggregate views).</p>"
        )
    system = run["declaration"]["system"]
    headline = (
        f"{totals['completed']} of {totals['arrived']} requests completed by {duration_us(totals['end_us'])}; "
        f"TTFT p50 {duration_us(latency['ttft']['p50'])}, p90 {duration_us(latency['ttft']['p90'])}; "
        f"{percent(totals['token_hit_rate'])} of prompt positions reused; device KV budget "
        f"{byte_size(system['kv_cache']['device_kv_bytes'])}."
    )
    title = f"kvsim run {run['id']}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">
<title>{html.escape(title)}</title><style>{_CSS}</style></head>
<body><header><h1>{html.escape(title)}</h1></header><main>
<section id="answer-section"><h2>Outcome</h2><p class="answer">{html.escape(headline)}</p>
<div class="scroll">{html_table(summary, "totals")}</div></section>
<section id="kvsim-section"><h2>Timeline and KV occupancy</h2>{timeline}</section>
<section id="requests-section"><h2>Requests</h2><div class="scroll">{html_table(outcomes, "requests")}</div></section>
<section id="evidence-section"><h2>Evidence</h2><p>{html.escape(str(run.get("evidence", "")))}</p></section>
</main></body></html>
"""


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#111827;background:#f9fafb}
header{background:#1f2937;color:#f9fafb;padding:8px 24px} header h1{margin:0;font-size:19px}
main{padding:4px 24px} section{background:#fff;border:1px solid #e5e7eb;border-radius:6px;margin:10px 0;padding:8px 16px}
h2{font-size:16px;margin:4px 0 8px} img{max-width:100%} .scroll{overflow-x:auto;max-width:100%}
.answer{font-size:15px;background:#ecfdf5;border-left:4px solid #059669;padding:6px 10px}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #e5e7eb;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#f3f4f6;white-space:normal} td.l,th.l{text-align:left} td.l{white-space:normal;overflow-wrap:anywhere}
"""
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; img-src data:; style-src 'sha256-"
    + base64.b64encode(hashlib.sha256(_CSS.encode()).digest()).decode()
    + "'; base-uri 'none'; form-action 'none'"
)
