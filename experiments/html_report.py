"""`jgpt report`: one self-contained HTML page that explains an experiment record.

The page embeds everything it shows (data as JSON, pictures as data: URIs, its
own CSS and script) and loads nothing from a network. Its script renders the
panels for an InspectionState and changes that state on clicks, or from the URL
fragment (`#position=7&surface=model`); it only reads the recorded values.

A record is input like any other, so nothing in it may become markup or script:
the server side escapes every recorded string it writes, the embedded JSON escapes
`<`, `>`, `&`, U+2028 and U+2029 (no `</script>` or `<!--` can end or change the
script element), the script builds every element with createElement and puts
recorded values only into text nodes and attribute values (never innerHTML), and
the Content-Security-Policy admits exactly the page's own script and style by their
SHA-256: no other inline script, event handler attribute or javascript: URL runs.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import shutil
import stat
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any

from experiments.experiment_replay import replay
from experiments.figure_text import fidelity_text
from experiments.inference_map import default_inference_map
from experiments.inspection import Inspectable
from experiments.record_files import named_paths, verified_file
from experiments.record_summary import summary
from experiments.report_figures import draw_plots, simulated_arms
from experiments.report_tables import answer_section, arms_table, html_table, same_in_every_arm
from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import write_atomically
from jgpt.foundation.json_input import parse_json
from jgpt.foundation.output_paths import output_file
from jgpt.foundation.paths import confined

SECTIONS = (
    ("answer", "Answer"),
    ("arms", "Outcomes by arm"),
    ("overview", "Record and bindings"),
    ("fidelity", "Measured on the engine vs predicted by kvsim"),
    ("architecture", "Architecture walkthrough"),
    ("tokens", "Token sequence"),
    ("prediction", "Prediction at the selected position"),
    ("attention", "Attention observations"),
    ("computations", "Recorded computations"),
    ("kvsim", "kvsim timeline and KV occupancy"),
    ("map", "Inference map"),
    ("contract", "Abstraction contract and sources"),
)

# Per plot: the largest jgpt draws is about 200 KB; base64 makes the page 4/3 of its plots.
PLOT_BYTE_LIMIT = 8 << 20
# Matplotlib's Agg cannot draw 2^16 pixels a side; the area bounds what a browser decodes (256 MiB as RGBA).
PLOT_SIDE_LIMIT = (1 << 16) - 1
PLOT_PIXEL_LIMIT = 1 << 26
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: no data, and its CRC
# Colour type -> the bit depths PNG allows for it (ISO/IEC 15948, 11.2.2).
_PNG_DEPTHS = {0: {1, 2, 4, 8, 16}, 2: {8, 16}, 3: {1, 2, 4, 8}, 4: {8, 16}, 6: {8, 16}}


def write_report(record_path: Path, out: Path) -> Path:
    """Check the record replays and that `out` is none of the files the page is made of, then write the page
    to `out` (atomically)."""
    record_path = Path(record_path)
    record = replay(record_path)
    directory = record_path.parent
    # Confined: a plot that links out of the directory would embed that file in the page (a key, a password file).
    plots = {name: confined(directory, f"plots/{name}", "plots") for name in _plot_names(record)}
    # Known once the record is: the page must not replace a file it reads (a plot, a file the record names).
    named = [confined(directory, path, "record") for path in named_paths(record)]
    out = output_file(out, "--out", [record_path, *named, *plots.values()])
    recording = record["recordings"][0]
    observations = _read(directory, recording["observations"], "observations")
    computations = _read(directory, recording["computations"], "computations")
    inspected = {r["request_id"] for r in observations["requests"]}
    inspectable = Inspectable(
        observations,
        recording["walkthrough"],
        {r["request_id"]: r["computations"] for r in computations["requests"] if r["request_id"] in inspected},
    )
    figures = summary(record)
    data = {
        "record": {k: record[k] for k in ("id", "lab", "provenance", "bindings")} | {"kernels": recording["kernels"]},
        "summary": figures,
        "fidelity_text": [
            [[fidelity_text(r["field"], r["measured"]), fidelity_text(r["field"], r["predicted"])] for r in p["rows"]]
            for p in figures.get("fidelity", [])
        ],
        "inspectable": {
            "observations": observations,
            "walkthrough": recording["walkthrough"],
            "computations": inspectable.computations,
        },
        "initial": inspectable.initial().to_json(),
        "map": default_inference_map().to_json(),
        "events": _events_of(record, directory, inspected),
    }
    with tempfile.TemporaryDirectory() as scratch:
        if not all(path.is_file() for path in plots.values()):
            # A record run without plots: draw them for the page only.
            for _, arm in simulated_arms(record):  # only the files the record names, verified by the replay above
                shutil.copyfile(
                    confined(directory, arm["cache_run"]["path"], "cache_run.path"),
                    confined(scratch, arm["cache_run"]["path"], "cache_run.path"),
                )
            draw_plots(record, Path(scratch))
            plots = {name: Path(scratch) / "plots" / name for name in plots}
        images = {name: embedded_png(path, f"plots/{name}") for name, path in plots.items()}
    write_atomically(out, _page(record, data, images).encode())
    return out


def embedded_png(path: Path, field: str) -> bytes:
    """A plot's bytes for the page: a regular file of at most PLOT_BYTE_LIMIT bytes (judged by its size before
    a byte is read) holding a PNG whose header declares at most PLOT_SIDE_LIMIT pixels a side and
    PLOT_PIXEL_LIMIT in all; anything else is an ApiError naming `field` (the plot's path in the record's
    directory). An 8 GB sparse file used to exhaust the memory, a 300 MB one made a 420 MB page."""
    try:
        # No link is followed (the path is resolved already) and a FIFO put there cannot block the open.
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise ApiError(field, f"cannot read the plot: {error.strerror}") from None
    with os.fdopen(descriptor, "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise ApiError(field, "is not a regular file")
        if status.st_size > PLOT_BYTE_LIMIT:
            raise ApiError(field, f"is {status.st_size} bytes, more than the {PLOT_BYTE_LIMIT} a plot may be")
        data = file.read(PLOT_BYTE_LIMIT + 1)  # a file that grows after the check is still read no further
    if len(data) > PLOT_BYTE_LIMIT:
        raise ApiError(field, f"grew past the {PLOT_BYTE_LIMIT} bytes a plot may be while it was read")
    _check_png(data, field)
    return data


def _check_png(data: bytes, field: str) -> None:
    """A whole PNG: its signature, an IHDR chunk first whose CRC and values are valid, and IEND last."""
    if not data.startswith(_PNG_SIGNATURE):
        raise ApiError(field, "is not a PNG (no PNG signature)")
    header = data[8:33]  # length, "IHDR", 13 bytes of values, CRC
    if len(header) < 25 or header[:8] != b"\x00\x00\x00\x0dIHDR":
        raise ApiError(field, "is not a PNG (no IHDR chunk after the signature)")
    if zlib.crc32(header[4:21]) != int.from_bytes(header[21:25], "big"):
        raise ApiError(field, "is not a PNG (the IHDR chunk's CRC does not match)")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", header[8:21])
    if not (1 <= width <= PLOT_SIDE_LIMIT and 1 <= height <= PLOT_SIDE_LIMIT and width * height <= PLOT_PIXEL_LIMIT):
        raise ApiError(
            field,
            f"declares {width}x{height} pixels; a plot has 1 to {PLOT_SIDE_LIMIT} a side "
            f"and at most {PLOT_PIXEL_LIMIT} in all",
        )
    if depth not in _PNG_DEPTHS.get(colour, ()) or compression or filtering or interlace > 1:
        raise ApiError(field, "is not a PNG (its IHDR chunk holds values PNG does not define)")
    if not data.endswith(_PNG_END):
        raise ApiError(field, "is not a whole PNG (it does not end with an IEND chunk)")


def _events_of(record: dict[str, Any], directory: Path, request_ids: set[str]) -> list[list[dict[str, Any]]]:
    """Per arm, the kvsim events of the inspected requests, with their causes (none for an engine arm)."""
    runs = (
        _read(directory, arm["cache_run"], "cache_run") if "cache_run" in arm else {"events": []}
        for arm in record["arms"]
    )
    return [[event for event in run["events"] if event["request_id"] in request_ids] for run in runs]


def _read(directory: Path, entry: dict[str, Any], field: str) -> Any:
    """A file the record names, confined to its directory and checked against the entry again."""
    return parse_json(verified_file(directory, entry, field), field)


def _image(data: bytes, alt: str) -> str:
    encoded = base64.b64encode(data).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}">'


def _plot_names(record: dict[str, Any]) -> list[str]:
    return ["arms.png", "inference-map.png", *(f"arm-{i}-timeline.png" for i, _ in simulated_arms(record))]


def _page(record: dict[str, Any], data: dict[str, Any], images: dict[str, bytes]) -> str:
    lab = record["lab"]
    timelines = "".join(
        f"<details{' open' if i == 0 else ''}><summary>{html.escape(arm['label'])}</summary>"
        f"{_image(images[f'arm-{i}-timeline.png'], 'kvsim timeline ' + arm['label'])}</details>"
        for i, arm in simulated_arms(record)
    )
    contract = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in lab["contract"].items())
    sources = "".join(
        f'<li><a href="{html.escape(s["url"])}">{html.escape(s["title"])}</a></li>' for s in lab["sources"]
    )
    nav = "".join(f'<a href="#{key}-section">{html.escape(title)}</a>' for key, title in SECTIONS)
    payload = json.dumps(data, separators=(",", ":")).translate(_SCRIPT_SAFE)
    arms = arms_table(record, data["summary"])
    bodies = {
        "answer": answer_section(record, data["summary"]),
        "arms": f'<div id="arms-table" class="scroll">{html_table(arms)}</div>{same_in_every_arm(arms)}'
        + _image(images["arms.png"], "arms compared"),
        "tokens": '<div id="state"></div><div id="tokens-panel"></div>',
        "kvsim": '<div id="events-panel"></div>' + timelines,
        "map": _image(images["inference-map.png"], "inference map") + '<div id="map-list"></div>',
        "contract": f"<dl>{contract}</dl><h3>Sources</h3><ul>{sources}</ul>",
    }
    sections = "".join(
        f'<section id="{key}-section"><h2>{html.escape(title)}</h2>'
        f"{bodies.get(key, f'<div id={chr(34)}{key}-panel{chr(34)}></div>')}</section>"
        for key, title in SECTIONS
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">
<title>{html.escape(lab["name"])}: {html.escape(record["id"])}</title>
<style>{_CSS}</style></head>
<body><header><h1>{html.escape(lab["name"])}</h1><nav>{nav}</nav></header>
<div id="inspection-error" role="alert"></div>
<main>{sections}</main>
<script type="application/json" id="data">{payload}</script>
<script>{_SCRIPT}</script></body></html>
"""


# JSON escapes that keep embedded data inert inside <script>: no "</script>", "<!--" or "<script"
# can form, and the line separators some parsers treat as line ends are escaped too.
_SCRIPT_SAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#111827;background:#f9fafb}
header{background:#1f2937;color:#f9fafb;padding:8px 24px}
header h1{margin:0 0 4px;font-size:19px} .question{margin:4px 0 8px}
nav a{color:#93c5fd;margin-right:12px;font-size:12px} #state{font:11px monospace;color:#047857;margin:0 0 6px;overflow-wrap:anywhere}
#inspection-error{position:fixed;bottom:0;left:0;right:0;z-index:2;background:#7f1d1d;color:#fecaca;font-size:12px;padding:6px 24px}
#inspection-error:empty{display:none}
main{padding:4px 24px} section{background:#fff;border:1px solid #e5e7eb;border-radius:6px;margin:10px 0;padding:8px 16px}
h2{font-size:16px;margin:4px 0 8px} img{max-width:100%} .answer{font-size:15px;background:#ecfdf5;border-left:4px solid #059669;padding:6px 10px}
.note{font-size:12px;color:#6b7280}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #e5e7eb;padding:2px 6px;text-align:right;white-space:nowrap}
th{white-space:normal} td.l{white-space:normal;overflow-wrap:anywhere} #arms-table td.l{min-width:12em}
th{background:#f3f4f6} td.l,th.l{text-align:left}
.tok{display:inline-block;font:12px monospace;padding:1px 3px;margin:1px;border:1px solid #d1d5db;border-radius:3px;cursor:pointer;white-space:pre}
.tok.control{background:#fde68a} .tok.reply{background:#e0e7ff} .tok.output{background:#bbf7d0} .tok.sel{outline:2px solid #dc2626}
.tok.turn1{border-color:#60a5fa} .tok.turn0{border-color:#a78bfa}
.bar{display:inline-block;height:10px;background:#6366f1;vertical-align:middle}
.stage{cursor:pointer;padding:2px 6px;margin:2px 0;border-left:3px solid transparent} .stage.sel{border-color:#dc2626;background:#fef2f2}
.heads{display:flex;flex-wrap:wrap;gap:10px} .heads figure{margin:0} figcaption{font-size:11px;color:#6b7280}
tr.sel td{background:#fef2f2} button{font-size:12px;margin:2px} .scroll{overflow-x:auto;max-width:100%}
.events{max-height:320px;overflow-y:auto}
"""

_SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const I = D.inspectable, OBS = I.observations;
const $ = id => document.getElementById(id);
const fmt = v => v === null || v === undefined ? '' : (typeof v === 'number' && !Number.isInteger(v) ? v.toFixed(4) : String(v));
// Mirrors jgpt.foundation.units: three significant digits in the largest unit the value reaches.
function scaled(value, units, step) {
  if (value < 0) return '-' + scaled(-value, units, step);
  const places = x => x < 10 ? 2 : x < 100 ? 1 : 0;
  let [name, size] = units[0];
  for (const [n, s] of units.slice(1))
    if (value / s >= 1 || Number((value / size).toFixed(places(value / size))) >= step) { name = n; size = s; }
  if (size === 1 && Number.isInteger(value)) return value + ' ' + name;
  return (value / size).toFixed(places(value / size)) + ' ' + name;
}
const TIME = [['us', 1], ['ms', 1e3], ['s', 1e6]], SIZE = [['B', 1], ['KiB', 1024], ['MiB', 1024 ** 2], ['GiB', 1024 ** 3]];
const WORK = [['FLOP', 1], ['kFLOP', 1e3], ['MFLOP', 1e6], ['GFLOP', 1e9], ['TFLOP', 1e12]];
// A recorded value in the unit its field's name gives; the exact value goes into the cell's title.
const human = (key, v) => typeof v !== 'number' ? fmt(v) : key.endsWith('_us') ? scaled(v, TIME, 1000)
  : key.endsWith('bytes') ? scaled(v, SIZE, 1024) : key.endsWith('flops') ? scaled(v, WORK, 1000) : fmt(v);
const cellOf = (key, v, className) =>
  el('td', Object.assign(className ? {class: className} : {}, {title: typeof v === 'number' ? String(v) : null}), human(key, v));
const heading = c => c.replaceAll('_', ' ');
let state = D.initial;

// Every element is built here; recorded values only ever become text nodes or attribute values.
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === 'class') node.className = v;
    else if (k === 'data') Object.assign(node.dataset, v);
    else if (k === 'style') Object.assign(node.style, v);  // CSSOM, which the CSP allows
    else if (k === 'onclick' || k === 'onchange') node[k] = v;
    else if (v !== false && v !== null && v !== undefined) node.setAttribute(k, v === true ? '' : String(v));
  }
  node.append(...children.flat(Infinity).filter(c => c !== null && c !== undefined).map(c => c instanceof Node ? c : String(c)));
  return node;
}
const show = (id, ...children) => $(id).replaceChildren(...children.flat(Infinity).map(c => c instanceof Node ? c : String(c)));
const table = (props, header, rows) => el('table', props, el('tr', {}, header), rows);

function requestOf(runId) {
  const r = OBS.requests.find(r => OBS.run_id + '/' + r.request_id === runId);
  if (!r) throw new Error('run_id ' + runId + ' is not an inspected computation');
  return r;
}
// Mirrors experiments.inspection.Inspectable.select/check: validate, never compute.
function select(changes) {
  const next = Object.assign({}, state, changes);
  if ('run_id' in changes && changes.run_id !== state.run_id) {
    const r = requestOf(changes.run_id);
    if (!('position' in changes)) next.position = r.prompt_length - 1;
    if (!('observation_id' in changes)) next.observation_id = r.attention[0].id;
    if (!('computation_index' in changes)) next.computation_index = 0;
  }
  const r = requestOf(next.run_id), last = r.tokens.length - 2;
  if (!Number.isInteger(next.position) || next.position < 0 || next.position > last) throw new Error('position must be 0..' + last);
  if (!['request', 'model', 'architecture', 'resources'].includes(next.surface)) throw new Error('unknown surface ' + next.surface);
  if (next.observation_id !== null && !r.observation_ids.includes(next.observation_id)) throw new Error('unknown observation ' + next.observation_id);
  if (next.surface === 'model' && next.observation_id === null) throw new Error('the model surface shows an observation');
  if (!Number.isInteger(next.architecture_step) || next.architecture_step < 0 || next.architecture_step >= I.walkthrough.stages.length) throw new Error('architecture_step out of range');
  const works = (I.computations[r.request_id] || []).length;
  if (next.computation_index !== null && !(next.computation_index >= 0 && next.computation_index < works)) throw new Error('computation_index out of range');
  state = next;
  $('inspection-error').textContent = '';
  render();
}
function trySelect(changes) { try { select(changes); } catch (e) { $('inspection-error').textContent = 'selection refused: ' + e.message; } }

function renderOverview() {
  const rec = D.record, b = rec.lab.ontology_binding, p = rec.provenance, m = rec.bindings.models[0];
  show('overview-panel', el('table', {}, [
    ['record', rec.id], ['lab', rec.lab.id], ['ontology', b.primary + (b.related.length ? ' (related: ' + b.related.join(', ') + ')' : '')],
    ['model', m.model_id], ['checkpoint_sha256', m.checkpoint_sha256], ['tokenizer_sha256', m.tokenizer_sha256],
    ['architecture', Object.entries(m.architecture).map(([k, v]) => k + '=' + v).join(' ')],
    ['kernels', Object.entries(rec.kernels).map(([k, v]) => k + ' ' + v).join(', ')],
    ['workload', rec.bindings.workload.kind + ', ' + rec.bindings.workload.requests.length + ' requests'],
    ['backend', Object.values(p.backend).join(' / ')], ['python', p.python], ['revision', p.revision],
  ].map(([k, v]) => el('tr', {}, el('th', {class: 'l'}, k), el('td', {class: 'l'}, fmt(v))))));
}
function renderFidelity() {
  const pairs = D.summary.fidelity;
  if (!pairs) { show('fidelity-panel', el('p', {}, 'No arm of this lab ran on the InferenceEngine: every outcome above is simulated by kvsim.')); return; }
  const pct = e => e === null ? '-' : (e >= 0 ? '+' : '') + (100 * e).toFixed(1) + '%';
  show('fidelity-panel', el('p', {}, 'Measured: wall-clock totals of an arm served on the InferenceEngine. Predicted: kvsim on the same ' +
    'system and workload, with its hypothetical roofline rates or with the service calibrated on the lab\'s separate calibration workload ' +
    '(hover a figure for its exact value; error = (predicted - measured) / measured; hit rates are compared for equality).'),
    pairs.map((p, i) => el('div', {}, el('h3', {}, p.measured + '  vs  kvsim (' + p.service + '): ' + p.predicted),
      table({}, ['field', 'measured', 'predicted', 'error'].map(k => el('th', k === 'field' ? {class: 'l'} : {}, k)),
        p.rows.map((r, j) => el('tr', {}, el('td', {class: 'l'}, r.field),
          el('td', {title: String(r.measured)}, D.fidelity_text[i][j][0]), el('td', {title: String(r.predicted)}, D.fidelity_text[i][j][1]),
          el('td', {}, r.exact ? (r.measured === r.predicted ? 'exact' : 'differs') : pct(r.error))))))),
    fidelityPlot(pairs));
}
// Measured against predicted, log-log, one point per latency field and kvsim arm (SVG built node by node).
function fidelityPlot(pairs) {
  const svg = (tag, attrs, ...children) => {
    const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    node.append(...children.flat(Infinity));
    return node;
  };
  const points = pairs.flatMap(p => p.rows.filter(r => !r.exact && r.field !== 'compute_busy_us' && r.measured > 0 && r.predicted > 0)
    .map(r => ({measured: r.measured, predicted: r.predicted, service: p.service, name: p.measured + ': ' + r.field})));
  if (!points.length) return [];
  const values = points.flatMap(q => [q.measured, q.predicted]);
  const lo = Math.floor(Math.log10(Math.min(...values))), hi = Math.ceil(Math.log10(Math.max(...values)));
  const size = 440, pad = 60, span = size - 2 * pad;
  const x = v => pad + (Math.log10(v) - lo) / (hi - lo) * span, y = v => size - x(v);
  const colors = {calibrated: '#2563eb', roofline: '#dc2626'};
  const color = s => colors[s] || '#6b7280', low = 10 ** lo, high = 10 ** hi;
  const band = [[low, low * 1.1], [high / 1.1, high], [high, high], [high, high * 0.9], [low, low * 0.9]];
  const ticks = [];
  for (let e = lo; e <= hi; e++) {
    const label = e >= 6 ? 10 ** (e - 6) + ' s' : e >= 3 ? 10 ** (e - 3) + ' ms' : 10 ** e + ' us';
    ticks.push(svg('text', {x: x(10 ** e), y: size - pad + 16, 'text-anchor': 'middle', 'font-size': 10}, label),
      svg('text', {x: pad - 4, y: y(10 ** e) + 3, 'text-anchor': 'end', 'font-size': 10}, label),
      svg('line', {x1: x(10 ** e), y1: pad, x2: x(10 ** e), y2: size - pad, stroke: '#e5e7eb'}),
      svg('line', {x1: pad, y1: y(10 ** e), x2: size - pad, y2: y(10 ** e), stroke: '#e5e7eb'}));
  }
  const services = [...new Set(points.map(q => q.service))];
  return el('figure', {id: 'fidelity-plot'}, svg('svg', {width: size, height: size, viewBox: '0 0 ' + size + ' ' + size, role: 'img'},
    svg('title', {}, 'kvsim predicted against measured on the engine: TTFT, TPOT and E2E percentiles'),
    ticks,
    svg('polygon', {points: band.map(([m, p]) => x(m) + ',' + y(p)).join(' '), fill: '#9ca3af', 'fill-opacity': 0.3}),
    svg('line', {x1: x(low), y1: y(low), x2: x(high), y2: y(high), stroke: '#111827'}),
    points.map(q => svg('circle', {class: 'point', cx: x(q.measured), cy: y(q.predicted), r: 4, fill: color(q.service), 'fill-opacity': 0.8},
      svg('title', {}, q.name + ', kvsim (' + q.service + '): measured ' + q.measured + ' us, predicted ' + q.predicted + ' us'))),
    services.map((s, i) => svg('text', {x: pad + 8, y: pad + 14 + 14 * i, fill: color(s), 'font-size': 11}, 'kvsim (' + s + ')')),
    svg('text', {x: size / 2, y: size - 8, 'text-anchor': 'middle', 'font-size': 11}, 'measured on the engine'),
    svg('text', {x: 12, y: size / 2, 'text-anchor': 'middle', 'font-size': 11, transform: 'rotate(-90 12 ' + size / 2 + ')'}, 'predicted by kvsim')),
    el('figcaption', {}, 'Each point a latency percentile (TTFT, TPOT, E2E p50 and p90) of an engine arm: measured (x) against ' +
      'predicted by kvsim (y). The line is predicted = measured; the grey band is within 10%.'));
}
function renderArchitecture() {
  const stages = I.walkthrough.stages, s = stages[state.architecture_step];
  show('architecture-panel', stages.map((st, i) =>
    el('div', {class: 'stage' + (i === state.architecture_step ? ' sel' : ''), onclick: () => trySelect({architecture_step: i, surface: 'architecture'})},
      i + '. ', el('b', {}, st.label), ' ', el('small', {}, st.owner + ' · ' + st.scope))),
    el('p', {id: 'stage-detail'}, el('b', {}, s.label), ': ' + s.detail, el('br'),
      'reads stages [' + s.inputs.join(', ') + ']; operations: ' + s.operations.join(', ') + '; observed as ', el('code', {}, s.inspection),
      s.related.length ? '; related: ' + s.related.join(', ') : ''));
}
function renderTokens(r) {
  const turnOf = new Array(r.tokens.length).fill(null), reply = new Array(r.tokens.length).fill(false);
  r.spans.forEach(sp => { for (let t = sp.token_start; t < sp.token_end; t++) { turnOf[t] = sp.turn; reply[t] = sp.kind === 'reply'; } });
  const picker = OBS.requests.map(q => el('button', {onclick: () => trySelect({run_id: OBS.run_id + '/' + q.request_id})}, q.request_id));
  const tokens = r.tokens.map((t, i) => el('span', {
    class: 'tok ' + (t.kind === 'control' ? 'control ' : '') + (i >= r.prompt_length ? 'output ' : '') + (reply[i] ? 'reply ' : '') +
      (turnOf[i] !== null ? 'turn' + (turnOf[i] % 2) : '') + (i === state.position ? ' sel' : ''),
    data: {pos: i}, title: 'position ' + i + ', id ' + t.id,
    onclick: () => { if (i <= r.tokens.length - 2) trySelect({position: i, surface: 'request'}); }}, t.piece));
  show('tokens-panel', el('div', {}, 'inspected requests: ', picker), el('p', {}, tokens),
    el('small', {}, r.prompt_length + ' prompt positions (framed turns; controls yellow), ' + (r.tokens.length - r.prompt_length) +
      ' generated (green); earlier replies the client resent are blue. Click a position.'));
}
function renderPrediction(r) {
  const p = r.predictions[state.position];
  show('prediction-panel',
    el('p', {}, 'after position ' + p.position + ' (' + r.tokens[p.position].piece + '), the recorded next id is ', el('b', {}, r.tokens[p.position + 1].piece),
      ' (id ' + p.next_id + ', p=' + fmt(p.next_probability) + ')'),
    table({id: 'candidates'}, [el('th', {class: 'l'}, 'candidate'), el('th', {}, 'id'), el('th', {}, 'probability'), el('th', {class: 'l'})],
      p.candidates.map(c => el('tr', {class: c.id === p.next_id ? 'sel' : null}, el('td', {class: 'l'}, el('code', {}, c.piece)), el('td', {}, c.id),
        el('td', {}, fmt(c.probability)), el('td', {class: 'l'}, el('span', {class: 'bar', style: {width: Math.round(200 * c.probability) + 'px'}}))))));
}
function renderAttention(r) {
  const layers = r.attention, obs = layers.find(o => o.id === state.observation_id) || layers[0];
  const n = obs.values.length, heads = obs.shape[1], cell = Math.max(3, Math.min(8, Math.floor(320 / n)));
  const best = h => { const row = obs.values[state.position][h], k = row.indexOf(Math.max(...row));
    return 'head ' + h + ' → ' + k + ' (' + r.tokens[k].piece + ', ' + row[k].toFixed(3) + ')'; };
  show('attention-panel',
    el('div', {}, layers.map(o => el('button', {disabled: o.id === obs.id, onclick: () => trySelect({observation_id: o.id, surface: 'model'})}, 'layer ' + o.layer))),
    el('p', {}, el('code', {id: 'observation-id'}, obs.id), ': rows are query positions, columns the positions they attend to; the red line is the selected position.'),
    el('div', {class: 'heads'}, Array.from({length: heads}, (_, h) =>
      el('figure', {}, el('canvas', {class: 'heatmap', data: {head: h}, width: n * cell, height: n * cell}), el('figcaption', {}, 'head ' + h)))),
    el('p', {}, 'position ' + state.position + ' attends most to: ' + Array.from({length: heads}, (_, h) => best(h)).join('; ')));
  document.querySelectorAll('canvas.heatmap').forEach(cv => {
    const ctx = cv.getContext('2d'), h = +cv.dataset.head;
    ctx.fillStyle = '#f3f4f6'; ctx.fillRect(0, 0, cv.width, cv.height);
    for (let q = 0; q < n; q++) obs.values[q][h].forEach((w, k) => {
      const shade = Math.round(255 * (1 - Math.sqrt(w)));
      ctx.fillStyle = 'rgb(' + shade + ',' + shade + ',255)'; ctx.fillRect(k * cell, q * cell, cell, cell); });
    ctx.strokeStyle = '#dc2626'; ctx.strokeRect(0, state.position * cell, (state.position + 1) * cell, cell);
  });
}
function renderComputations(r) {
  const works = I.computations[r.request_id] || [];
  const cols = ['work_id', 'phase', 'processed_positions', 'reused_positions', 'matmul_flops', 'reference_matmul_flops', 'logical_memory_bytes', 'reference_max_abs_error', 'wall_time_us'];
  show('computations-panel',
    el('p', {}, works.length + ' works of ' + r.request_id + ' (FLOPs and bytes are analytic counts; wall time is measured on this host). Click a row.'),
    el('div', {class: 'scroll'}, table({}, cols.map(c => el('th', {}, heading(c))), works.map((w, i) =>
      el('tr', {data: {work: i}, class: i === state.computation_index ? 'sel' : null, onclick: () => trySelect({computation_index: i, surface: 'resources'})},
        cols.map(c => cellOf(c, w[c])))))));
}
function renderEvents(r) {
  const armPicker = $('arm-picker'), arm = armPicker ? +armPicker.value : 0;
  const events = D.events[arm].filter(e => e.request_id === r.request_id);
  const cols = ['event_id', 'time_us', 'kind', 'phase', 'state_id', 'bytes', 'device_reserved_bytes', 'host_retained_bytes', 'transfer_direction', 'detail', 'causes'];
  const picker = el('select', {id: 'arm-picker', onchange: () => renderEvents(r)},
    D.summary.arms.map((a, i) => el('option', {value: i, selected: i === arm}, a.label)));
  show('events-panel',
    el('p', {}, 'kvsim events of ' + r.request_id + ' in arm ', picker, ' (virtual microseconds; causes name the events that made each happen)'),
    el('div', {class: 'scroll events'}, table({id: 'events'}, cols.map(c => el('th', {}, heading(c))), events.map(e =>
      el('tr', {}, cols.map(c => Array.isArray(e[c]) ? el('td', {}, e[c].join(' ')) : cellOf(c, e[c], c === 'kind' || c === 'detail' ? 'l' : null)))))));
}
function renderMap() {
  const byId = Object.fromEntries(D.map.nodes.map(n => [n.id, n]));
  show('map-list', el('details', {}, el('summary', {}, D.map.nodes.length + ' nodes, ' + D.map.relationships.length + ' relationships (data)'),
    el('ul', {}, D.map.relationships.map(e => el('li', {}, byId[e.source].owner + ' → ' + byId[e.target].owner + ': ' + e.label)))));
}
function render() {
  const r = requestOf(state.run_id);
  $('state').textContent = 'InspectionState ' + JSON.stringify(state);
  renderArchitecture(); renderTokens(r); renderPrediction(r); renderAttention(r); renderComputations(r); renderEvents(r);
}
function fromHash() {
  const changes = {};
  new URLSearchParams(location.hash.slice(1)).forEach((v, k) => {
    changes[k] = ['position', 'architecture_step', 'computation_index'].includes(k) ? (v === 'null' ? null : Number(v)) : (v === 'null' ? null : v); });
  if (Object.keys(changes).length) trySelect(changes);
}
renderOverview(); renderFidelity(); renderMap(); render(); fromHash();
window.addEventListener('hashchange', fromHash);
"""

# Only the page's own style and script, by hash: nothing a record could smuggle in runs or applies.
CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; img-src data:; style-src {_digest(_CSS)}; script-src {_digest(_SCRIPT)}; "
    "base-uri 'none'; form-action 'none'"
)
