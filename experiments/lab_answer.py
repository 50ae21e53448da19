"""LabAnswer: how a lab's question is answered, declared in the lab file and computed from a record's arms.

A lab's `answer` names the comparison that answers its question, in one of six kinds:

* `crossover`: a `candidate` and a `baseline` (each `{"name", "arms": {control: value}}`) at every value
  of the swept control `sweep`, judged by `metric` (`better`: lower or higher); the answer is where the
  winner flips, bracketed by the two swept values around it and estimated by interpolating the
  difference (on a log scale when both values are positive), e.g. host tier against recompute as the
  link bandwidth varies.
* `saturation`: `metric` along `sweep`: the swept value from which each further step changes the metric
  by at most `tolerance` (a fraction); `ratio_of` optionally names a control whose value over the swept
  one the answer states there (compute rate over memory bandwidth).
* `trend`: `metrics` along `sweep`, value by value.
* `comparison`: `candidate` against `baseline`, metric by metric, with their ratio.
* `best`: the arm best by `metric`, against the `baseline` arm; `require` names yes/no fields that must
  hold in every arm (a speculative arm must select greedy's ids).
* `fidelity`: do kvsim's arms with `service` predict the engine's latency percentiles within
  `tolerance`, and its hit rates exactly (the record's measured-against-predicted pairs).

Metrics are summary.json's fields (experiments/figure_text.py). A lab file's answer is checked against
its arms when it is read: every selector picks exactly the arms it must, in a planned lab it may name
a missing control. The computed answer is a sentence and a table of the figures behind it, each with
its exact value; it reads only the record (its lab, its arms' resolved controls, their summary rows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from experiments.controls import CONTROLS
from experiments.figure_text import METRICS, arm_caption, cell, control_caption, control_text, metric_caption
from experiments.figure_text import metric_text as _text
from jgpt.foundation.errors import ApiError
from jgpt.foundation.units import percent
from jgpt.foundation.validation import Anything, ListOf, MapOf, Number, Object, String, Tagged, Text

GENERATE_METRICS = (
    "requests",
    "decode_ids",
    "rounds",
    "acceptance_rate",
    "ids_per_round",
    "decode_tokens_per_s",
    "vs_greedy",
    "same_ids_as_greedy",
)
SERVING_METRICS = tuple(name for name in METRICS if name not in GENERATE_METRICS)
_METRIC = String(tuple(METRICS))
_BETTER = String(("lower", "higher"))
_SIDE = Object(
    {"name": Text(), "arms": MapOf(Anything("the value of the control"))},
    about="Arms picked by the controls they assign: {control: value}, and what the answer calls them.",
)


def _kind(name: str, required: dict, optional: dict | None = None, about: str = "") -> Object:
    return Object({"kind": String((name,)), **required}, optional or {}, about=about)


ANSWER = Tagged(
    "kind",
    {
        "crossover": _kind(
            "crossover",
            {"sweep": String(), "metric": _METRIC, "better": _BETTER, "candidate": _SIDE, "baseline": _SIDE},
            about="Where along `sweep` the better of candidate and baseline by `metric` flips.",
        ),
        "saturation": _kind(
            "saturation",
            {"sweep": String(), "metric": _METRIC, "tolerance": Number(0, exact=False, positive=True)},
            {"ratio_of": String()},
            about="The swept value from which `metric` changes by at most `tolerance` per step.",
        ),
        "trend": _kind("trend", {"sweep": String(), "metrics": ListOf(_METRIC, 1)}, about="`metrics` along `sweep`."),
        "comparison": _kind(
            "comparison",
            {"candidate": _SIDE, "baseline": _SIDE, "metrics": ListOf(_METRIC, 1)},
            about="Candidate against baseline, metric by metric.",
        ),
        "best": _kind(
            "best",
            {"metric": _METRIC, "better": _BETTER, "baseline": _SIDE},
            {"require": ListOf(String(("same_ids_as_greedy",)))},
            about="The best arm by `metric`, against the baseline.",
        ),
        "fidelity": _kind(
            "fidelity",
            {"tolerance": Number(0, exact=False, positive=True), "service": String(("calibrated", "roofline"))},
            about="Whether kvsim with `service` predicts the engine arms within `tolerance`.",
        ),
    },
)


def read_answer(value: Any, field: str, arms: Sequence[Mapping[str, Any]] | None, names: Sequence[str]) -> dict:
    """A lab's `answer`, checked against the assignments of its arms (None: a planned lab, which has none);
    `names` are the controls it may name (the declared ones and the lab's missing ones)."""
    answer = ANSWER.read(value, field)
    for key in ("sweep", "ratio_of"):
        if key in answer and answer[key] not in names:
            raise ApiError(f"{field}.{key}", f"unknown control {answer[key]!r}")
    for side in ("candidate", "baseline"):
        for name, item in answer.get(side, {}).get("arms", {}).items():
            where = f"{field}.{side}.arms.{name}"
            if name not in names:
                raise ApiError(where, f"unknown control {name!r}")
            if name in CONTROLS:
                CONTROLS[name].check(item, where)
    if arms is not None:
        _check_against(answer, field, arms)
    return answer


def _check_against(answer: dict, field: str, arms: Sequence[Mapping[str, Any]]) -> None:
    generate = all(_value(arm, "execution.runner") == "generate" for arm in arms)
    allowed = GENERATE_METRICS if generate else SERVING_METRICS
    named = [("metric", answer["metric"])] if "metric" in answer else []
    named += [(f"metrics[{i}]", name) for i, name in enumerate(answer.get("metrics", []))]
    for where, name in named:
        if name not in allowed:
            raise ApiError(f"{field}.{where}", f"{name} is not a figure of these arms; they have {', '.join(allowed)}")
    kind = answer["kind"]
    if kind == "fidelity":
        if not any(_value(arm, "execution.runner") == "engine" for arm in arms):
            raise ApiError(f"{field}.kind", "a fidelity answer needs an arm served on the engine")
        if not any(_value(arm, "compute_service.model") == answer["service"] for arm in arms if _kvsim(arm)):
            raise ApiError(f"{field}.service", f"no kvsim arm uses the {answer['service']} service")
        return
    values = _sweep_values(answer, field, arms) if "sweep" in answer else [None]
    for side in ("candidate", "baseline"):
        if side not in answer:
            continue
        for value in values:
            picked = _picked(arms, answer[side]["arms"], answer.get("sweep"), value)
            if len(picked) != 1:
                at = "" if value is None else f" at {answer['sweep']}={value}"
                raise ApiError(f"{field}.{side}.arms", f"picks {len(picked)} arms{at}; it must pick exactly one")


def _sweep_values(answer: dict, field: str, arms: Sequence[Mapping[str, Any]]) -> list:
    sweep = answer["sweep"]
    if any(sweep not in arm for arm in arms):
        raise ApiError(f"{field}.sweep", f"{sweep} is not assigned in every arm")
    values = list(dict.fromkeys(arm[sweep] for arm in arms))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if answer["kind"] in ("crossover", "saturation") and not numeric:
        raise ApiError(f"{field}.sweep", f"a {answer['kind']} needs a numeric control; {sweep} takes {values!r}")
    if answer["kind"] in ("trend", "saturation") and len(values) != len(arms):
        raise ApiError(
            f"{field}.sweep", f"the arms sweep more than {sweep}; a {answer['kind']} needs one arm per value"
        )
    if len(values) < 2:
        raise ApiError(f"{field}.sweep", f"{sweep} takes one value in these arms; a sweep needs two or more")
    return values


def _value(assignments: Mapping[str, Any], name: str) -> Any:
    return assignments.get(name, CONTROLS[name].default if name in CONTROLS else None)


def _kvsim(assignments: Mapping[str, Any]) -> bool:
    return _value(assignments, "execution.runner") == "kvsim"


def _picked(arms: Sequence[Mapping[str, Any]], selector: Mapping[str, Any], sweep: str | None, value: Any) -> list[int]:
    return [
        i
        for i, arm in enumerate(arms)
        if all(_value(arm, k) == v for k, v in selector.items()) and (sweep is None or arm.get(sweep) == value)
    ]


# -- the answer computed from a record ------------------------------------------------------------------------


def computed_answer(record: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], fidelity: Any) -> dict | None:
    """The record's lab's declared answer computed from its arms and their summary rows (None: none declared)."""
    lab = record["lab"]
    if "answer" not in lab:
        return None
    answer = lab["answer"]
    arms = [{spec["control"]: spec["value"] for spec in arm["execution"]} for arm in record["arms"]]
    captions = arm_captions(record)
    kind = answer["kind"]
    if kind == "fidelity":
        found = _fidelity(answer, fidelity or [], {row["label"]: c for row, c in zip(rows, captions)})
    elif kind == "crossover":
        found = _crossover(answer, arms, rows)
    elif kind in ("trend", "saturation"):
        found = _along(answer, arms, rows)
    elif kind == "comparison":
        found = _comparison(answer, arms, rows)
    else:
        found = _best(answer, arms, rows, captions)
    return {"kind": kind, "declared": answer} | found


def arm_captions(record: Mapping[str, Any]) -> list[str]:
    """Each arm by the controls the lab sweeps, in their units ('host kv budget 16.0 MiB, link bandwidth
    3.00 GB/s'); an arm of a lab without a sweep by its label."""
    names: list[str] = []
    for axis in record["lab"].get("sweep", []):
        if "control" in axis:
            names.append(axis["control"])
        else:
            names += [k for point in axis["values"] for k in point if k not in names]
    captions = []
    for arm in record["arms"]:
        assignments = {spec["control"]: spec["value"] for spec in arm["execution"]}
        captions.append(arm_caption({k: assignments[k] for k in names if k in assignments}) or arm["label"])
    return captions


def _row(rows, arms, selector, sweep=None, value=None) -> Mapping[str, Any]:
    (index,) = _picked(arms, selector, sweep, value)
    return rows[index]


def _table(columns: list[str], rows: list[list[dict]]) -> dict[str, Any]:
    return {"columns": columns, "rows": rows}


def _m(key: str, row: Mapping[str, Any]) -> dict[str, Any]:
    return cell(_text(key, row.get(key)), row.get(key))


def _crossover(answer: dict, arms: list, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    sweep, metric, lower = answer["sweep"], answer["metric"], answer["better"] == "lower"
    cand, base = answer["candidate"], answer["baseline"]
    points = []
    for value in sorted({arm[sweep] for arm in arms}):
        c = _row(rows, arms, cand["arms"], sweep, value)[metric]
        b = _row(rows, arms, base["arms"], sweep, value)[metric]
        margin = (b - c) if lower else (c - b)  # > 0: the candidate is better
        winner = cand["name"] if margin > 0 else base["name"] if margin < 0 else "tie"
        points.append({"value": value, "candidate": c, "baseline": b, "winner": winner, "margin": margin})
    flips = []
    for left, right in zip(points, points[1:]):
        if left["winner"] != right["winner"]:
            flips.append(
                {"between": [left["value"], right["value"]], "estimate": _zero(left, right), "to": right["winner"]}
            )
    show = lambda v: control_text(sweep, v)  # noqa: E731
    name, by = control_caption(sweep), metric_caption(metric)
    if not flips:
        text = (
            f"{_upper(points[0]['winner'])} wins by {by} at every {name} swept, {show(points[0]['value'])} to "
            f"{show(points[-1]['value'])}: no crossover within the sweep."
        )
    else:
        parts = []
        for flip in flips:
            low, high = flip["between"]
            before = next(p["winner"] for p in points if p["value"] == low)
            at = show(low) if flip["estimate"] is None else f"about {show(flip['estimate'])}"
            parts.append(
                f"{before} beats {flip['to']} by {by} below {at} of {name} and {flip['to']} wins above it; the "
                f"measured crossover lies between the arms at {show(low)} and {show(high)}"
            )
        text = _upper("; ".join(parts)) + " (the estimate interpolates the difference between those two arms)."
    table = _table(
        [control_caption(sweep), cand["name"], base["name"], "better"],
        [
            [
                cell(show(p["value"]), p["value"]),
                cell(_text(metric, p["candidate"]), p["candidate"]),
                cell(_text(metric, p["baseline"]), p["baseline"]),
                cell(p["winner"], p["margin"]),
            ]
            for p in points
        ],
    )
    return {"text": text, "points": points, "flips": flips, "table": table}


def _zero(left: dict, right: dict) -> float | None:
    """Where the margin, interpolated between two swept values, is zero (log scale when both are positive)."""
    a, b = left["margin"], right["margin"]
    if a == b or a * b > 0:
        return None
    t = a / (a - b)
    x0, x1 = left["value"], right["value"]
    if x0 > 0 and x1 > 0:
        return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))
    return x0 + t * (x1 - x0)


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def _along(answer: dict, arms: list, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A trend or a saturation: the metrics at each swept value, in the sweep's order (ascending if numeric)."""
    sweep = answer["sweep"]
    order = sorted(range(len(arms)), key=lambda i: arms[i][sweep]) if answer["kind"] == "saturation" else None
    order = order or list(range(len(arms)))
    metrics = answer.get("metrics") or [answer["metric"]]
    show = lambda v: control_text(sweep, v)  # noqa: E731
    table = _table(
        [control_caption(sweep), *map(metric_caption, metrics)],
        [[cell(show(arms[i][sweep]), arms[i][sweep]), *(_m(m, rows[i]) for m in metrics)] for i in order],
    )
    values = [arms[i][sweep] for i in order]
    if answer["kind"] == "trend":
        said = []
        for m in metrics:
            series = [rows[i].get(m) for i in order]
            shown = series if len(series) <= 5 else [series[0], series[-1]]
            said.append(f"{metric_caption(m)} {' -> '.join(_text(m, v) for v in shown)}")
        text = f"As {control_caption(sweep)} goes {' -> '.join(map(show, values))}: {'; '.join(said)}."
        return {"text": text, "table": table}
    return {"table": table} | _saturation(answer, [arms[i] for i in order], [rows[i] for i in order])


def _saturation(answer: dict, arms: list, rows: list) -> dict[str, Any]:
    sweep, metric, tolerance = answer["sweep"], answer["metric"], answer["tolerance"]
    series = [row[metric] for row in rows]
    changes = [(b - a) / a if a else None for a, b in zip(series, series[1:])]
    knee = len(series) - 1
    while knee > 0 and (change := changes[knee - 1]) is not None and abs(change) <= tolerance:
        knee -= 1
    show = lambda v: control_text(sweep, v)  # noqa: E731
    steps = ", ".join("-" if c is None else f"{100 * c:+.1f}%" for c in changes)
    caption, name = metric_caption(metric), control_caption(sweep)
    if knee == len(series) - 1:
        text = _upper(
            f"{caption} still changes by more than {percent(tolerance)} at the last step ({steps} per step): "
            f"it does not settle within the swept {name} ({show(arms[0][sweep])} to {show(arms[-1][sweep])})."
        )
        return {"text": text, "knee": None, "changes": changes}
    ratio = ""
    if "ratio_of" in answer and answer["ratio_of"] in arms[knee]:
        other = answer["ratio_of"]
        quotient = arms[knee][other] / arms[knee][sweep]
        ratio = (
            f" There {control_caption(other)} / {name} = {quotient:.3g} "
            f"({control_text(other, arms[knee][other])} over {show(arms[knee][sweep])})."
        )
    text = _upper(
        f"{caption} settles from {name} {show(arms[knee][sweep])} on ({_text(metric, series[knee])}): each further "
        f"step changes it by at most {percent(tolerance)}; step by step it changed {steps}.{ratio}"
    )
    return {"text": text, "knee": arms[knee][sweep], "changes": changes}


def _comparison(answer: dict, arms: list, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    cand, base = answer["candidate"], answer["baseline"]
    c, b = _row(rows, arms, cand["arms"]), _row(rows, arms, base["arms"])
    said, table_rows, ratios = [], [], {}
    for m in answer["metrics"]:
        ratio = c[m] / b[m] if isinstance(b.get(m), (int, float)) and b[m] else None
        ratios[m] = ratio
        times = "" if ratio is None else f" ({ratio:.2f}x)"
        said.append(f"{metric_caption(m)} {_text(m, c[m])} against {_text(m, b[m])}{times}")
        table_rows.append(
            [cell(metric_caption(m), m), _m(m, c), _m(m, b), cell("-" if ratio is None else f"{ratio:.2f}x", ratio)]
        )
    text = f"{_upper(cand['name'])} against {base['name']}: {'; '.join(said)}."
    table = _table(["figure", cand["name"], base["name"], "ratio"], table_rows)
    return {"text": text, "ratios": ratios, "table": table}


def _best(answer: dict, arms: list, rows: Sequence[Mapping[str, Any]], captions: list[str]) -> dict[str, Any]:
    metric, higher, base = answer["metric"], answer["better"] == "higher", answer["baseline"]
    (baseline,) = _picked(arms, base["arms"], None, None)
    scored = [i for i, row in enumerate(rows) if row.get(metric) is not None]
    best = (max if higher else min)(scored, key=lambda i: rows[i][metric])
    others = [i for i in scored if i != baseline]
    reference = rows[baseline][metric]
    better = [i for i in others if (rows[i][metric] > reference if higher else rows[i][metric] < reference)]
    caption = metric_caption(metric)
    if best == baseline or not better:
        runner_up = (max if higher else min)(others, key=lambda i: rows[i][metric]) if others else None
        text = f"No arm beats {base['name']} ({_text(metric, reference)}) by {caption}"
        if runner_up is not None:
            text += f": the best other, {captions[runner_up]}, reaches {_text(metric, rows[runner_up][metric])}"
            text += _times(rows[runner_up][metric], reference, base["name"])
    else:
        text = (
            f"{len(better)} of {len(others)} arms beat {base['name']} ({_text(metric, reference)}) by {caption}; the best, "
            f"{captions[best]}, reaches {_text(metric, rows[best][metric])}{_times(rows[best][metric], reference, base['name'])}"
        )
    for name in answer.get("require", []):
        failing = [captions[i] for i, row in enumerate(rows) if not row.get(name)]
        held = "yes in every arm" if not failing else f"no in {', '.join(failing)}"
        text += f"; {metric_caption(name)}: {held}"
    table = _table(
        ["arm", caption, *map(metric_caption, answer.get("require", []))],
        [
            [
                cell(captions[i], rows[i]["label"]),
                _m(metric, rows[i]),
                *(_m(n, rows[i]) for n in answer.get("require", [])),
            ]
            for i in sorted(scored, key=lambda i: rows[i][metric], reverse=higher)
        ],
    )
    return {"text": text + ".", "best": rows[best]["label"], "better_than_baseline": len(better), "table": table}


def _times(value: float, reference: float, name: str) -> str:
    return f" ({value / reference:.2f}x {name}'s)" if reference else ""


def _fidelity(answer: dict, pairs: Sequence[Mapping[str, Any]], captions: Mapping[str, str]) -> dict[str, Any]:
    tolerance, service = answer["tolerance"], answer["service"]
    chosen = [p for p in pairs if p["service"] == service]
    within = total = exact = exact_total = 0
    worst: tuple[float, str, str] | None = None
    table_rows = []
    for pair in chosen:
        latencies = [r for r in pair["rows"] if not r["exact"] and "." in r["field"] and r["error"] is not None]
        inside = [r for r in latencies if abs(r["error"]) <= tolerance]
        equal = [r for r in pair["rows"] if r["exact"] and r["measured"] == r["predicted"]]
        exacts = [r for r in pair["rows"] if r["exact"]]
        within, total = within + len(inside), total + len(latencies)
        exact, exact_total = exact + len(equal), exact_total + len(exacts)
        far = max(latencies, key=lambda r: abs(r["error"]), default=None)
        if far is not None and (worst is None or abs(far["error"]) > abs(worst[0])):
            worst = (far["error"], far["field"], captions.get(pair["measured"], pair["measured"]))
        table_rows.append(
            [
                cell(captions.get(pair["measured"], pair["measured"]), pair["measured"]),
                cell(f"{len(inside)} of {len(latencies)}", len(inside)),
                cell(
                    "-" if far is None else f"{far['field']} {100 * far['error']:+.1f}%",
                    None if far is None else far["error"],
                ),
                cell(f"{len(equal)} of {len(exacts)}", len(equal)),
            ]
        )
    verdict = "yes" if total and within == total and exact == exact_total else "no"
    text = (
        f"{verdict.capitalize()}: kvsim ({service}) predicts {within} of {total} latency percentiles within "
        f"{percent(tolerance)} of the engine's and {exact} of {exact_total} hit rates exactly"
    )
    if worst is not None:
        text += f"; the farthest is {worst[1]} of {worst[2]}, {100 * worst[0]:+.1f}%"
    table = _table(["engine arm", f"within {percent(tolerance)}", "farthest", "hit rates exact"], table_rows)
    return {"text": text + ".", "verdict": verdict, "within": within, "of": total, "table": table}
