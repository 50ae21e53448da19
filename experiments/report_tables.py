"""The report's tables as escaped markup: the answer first, then the outcomes of every arm.

Each cell shows a figure in its human unit (experiments/figure_text.py) and carries its exact value in its
`title` attribute, so hovering shows it; every string a record holds is escaped before it becomes markup.
"""

from __future__ import annotations

import html
import json
from typing import Any

from experiments.figure_text import METRICS, cell, metric_caption, metric_text
from experiments.lab_answer import arm_captions


def arms_table(record: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """summary.json's rows as a table of cells: each arm by its swept controls in their units (its label on
    hover), each figure in its unit with the exact value beside it. A figure equal in every arm of several
    is not a column: it is listed once under `same` (so the table fits a laptop's width)."""
    rows = figures["arms"]
    keys = [k for k in METRICS if any(k in row for row in rows)]
    same = [k for k in keys if len(rows) > 1 and len({json.dumps(row.get(k)) for row in rows}) == 1]
    keys = [k for k in keys if k not in same]
    sourced = any("source" in row for row in rows)
    captions = arm_captions(record)
    return {
        "columns": ["arm", *map(metric_caption, keys), *(["source"] if sourced else [])],
        "rows": [
            [
                cell(caption, row["label"]),
                *(cell(metric_text(k, row.get(k)), row.get(k)) for k in keys),
                *([cell(row.get("source", ""), row.get("source"))] if sourced else []),
            ]
            for caption, row in zip(captions, rows)
        ],
        "same": [[cell(metric_caption(k), k), cell(metric_text(k, rows[0].get(k)), rows[0].get(k))] for k in same],
    }


def same_in_every_arm(table: dict[str, Any]) -> str:
    """The figures equal in every arm, as one escaped line with their exact values as titles."""
    if not table["same"]:
        return ""
    figures = ", ".join(
        f'{html.escape(name["text"])} <span title="{html.escape(json.dumps(value["exact"]))}">'
        f"{html.escape(value['text'])}</span>"
        for name, value in table["same"]
    )
    return f'<p class="note" id="same-in-every-arm">The same in every arm: {figures}.</p>'


def html_table(table: dict[str, Any], table_id: str = "") -> str:
    """A table of cells as escaped markup: the first column left-aligned, each cell's exact value its title."""
    head = "".join(f"<th{' class=l' if i == 0 else ''}>{html.escape(c)}</th>" for i, c in enumerate(table["columns"]))
    body = "".join(
        "<tr>"
        + "".join(
            f'<td{" class=l" if i == 0 else ""} title="{html.escape(json.dumps(c["exact"]))}">{html.escape(c["text"])}</td>'
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in table["rows"]
    )
    return f"<table{f' id={table_id}' if table_id else ''}><tr>{head}</tr>{body}</table>"


def answer_section(record: dict[str, Any], figures: dict[str, Any]) -> str:
    """The lab's question and the answer computed from this record, then the figures behind it."""
    lab, answer = record["lab"], figures.get("answer")
    question = f'<p class="question"><b>Question.</b> {html.escape(lab["question"])}</p>'
    if answer is None:
        return question + '<p id="answer-text">This lab declares no answer; the outcomes by arm follow.</p>'
    return (
        question
        + f'<p id="answer-text" class="answer"><b>Answer ({html.escape(answer["kind"])}).</b> '
        + f"{html.escape(answer['text'])}</p>"
        + f'<div class="scroll">{html_table(answer["table"], "answer-table")}</div>'
        + "<p class=note>Computed from this record's arms (summary.json's <code>answer</code> keeps the exact "
        + "values; hover a figure for it here).</p>"
    )
