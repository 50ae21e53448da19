"""A crafted record cannot run script in the report (issue 13, report injection).

A copy of one tiny lab run (tests/conftest.py) is poisoned: every
string replay cannot re-derive (lab name, question, contract, source titles; in the
observations token and candidate pieces, span reasons, layer and observation ids) carries `<script>`,
an `<img onerror>` breaking out of an attribute, `<!--` and `</script>`. Each payload
would mark the page's body if it ran. The page is rendered in headless Chromium; the
dumped DOM must show the payloads as text, no mark, and every panel drawn. A control page
that does use innerHTML shows that the mark would be seen.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from experiments.experiment_record import execution_id
from experiments.generation_defaults import generation_defaults
from experiments.html_report import write_report
from experiments.record_files import dumps
from tests.test_experiments_run import _chromium

MARKED = r"<body[^>]* data-pwned="  # what a payload that ran leaves in the DOM
PAYLOAD = (
    '<script>document.body.setAttribute("data-pwned","script")</script>'
    "\"><img src=x onerror=\"document.body.setAttribute('data-pwned','img')\"><!--</script>\u2028"
)


def _poison(value, skip=("request_id", "run_id")):
    """Every string in `value` with the payload appended (keys named in `skip` left alone); equal strings stay equal."""
    if isinstance(value, str):
        return value + PAYLOAD
    if isinstance(value, list):
        return [_poison(item, skip) for item in value]
    if isinstance(value, dict):
        return {k: v if k in skip else _poison(v, skip) for k, v in value.items()}
    return value


def _rewrite(directory: Path, record: dict) -> Path:
    """Write `record` canonically with the identity replay re-derives."""
    from experiments.experiment_design import ExperimentDesign

    lab = ExperimentDesign.from_json(record["lab"], "lab")
    record["id"] = execution_id(
        lab, record["arms"], record["recordings"], lab.workload or generation_defaults().workload
    )
    (directory / "record.json").write_bytes(dumps(record))
    return directory / "record.json"


def rewrite_entry(directory: Path, entry: dict, document) -> None:
    """Write `document` as the file a record entry names, with the entry's sha256 and bytes to match."""
    data = dumps(document)
    (directory / entry["path"]).write_bytes(data)
    entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


@pytest.fixture(scope="module")
def poisoned(lab_run, tmp_path_factory):
    directory = tmp_path_factory.mktemp("poisoned") / "run"
    shutil.copytree(lab_run.directory, directory)
    record = json.loads((directory / "record.json").read_text())
    lab = record["lab"]
    for name in ("name", "question"):
        lab[name] += PAYLOAD
    lab["contract"] = _poison(lab["contract"])
    for source in lab["sources"]:
        source["title"] += PAYLOAD
    recording = record["recordings"][0]  # (its walkthrough is derived from the model: replay refuses an edit)
    rewrite_entry(
        directory,
        recording["observations"],
        _poison(json.loads((directory / recording["observations"]["path"]).read_text())),
    )
    return _rewrite(directory, record)


def test_report_injection_no_payload_runs_in_chromium(poisoned, tmp_path):
    page = write_report(poisoned, tmp_path / "page.html")
    text = page.read_text()
    opening = '<script type="application/json" id="data">'
    data = text[text.index(opening) + len(opening) :].split("</script>")[0]
    assert (
        "\\u003cscript\\u003edocument.body" in data and "\\u003c!--\\u003c/script\\u003e\\u2028" in data
    )  # the payload is in it,
    assert not any(c in data for c in "<>&\u2028\u2029")  # escaped so that nothing can end or change the element
    assert "'unsafe-inline'" not in re.search(r"script-src[^;\"]*", text).group(0)
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert not re.search(MARKED, dom), "a payload ran"
    assert "document.body.setAttribute" in dom  # and it is on the page, as text
    assert dom.count("&lt;script&gt;document.body") >= 10
    candidates = re.search(r'<table id="candidates">(.*?)</table>', dom).group(1)
    assert candidates.count("<tr") == 1 + 5 and "&lt;img src=x onerror=" in candidates  # the panels still render
    assert re.search(r'<div id="inspection-error" role="alert"></div>', dom)
    assert "&lt;!--&lt;/script&gt;" in re.search(r'<div id="tokens-panel">(.*?)</section>', dom, re.S).group(1)
    assert len(re.findall(r'<canvas class="heatmap" data-head="\d+"', dom)) == 2


def test_report_injection_the_check_would_see_a_payload_that_ran(tmp_path):
    """Control: the same payload inserted with innerHTML under a permissive policy marks the body."""
    page = tmp_path / "unsafe.html"
    page.write_text(
        f"<!DOCTYPE html><html><body><div id=x></div><script>document.getElementById('x').innerHTML = "
        f"{json.dumps(PAYLOAD).replace('<', chr(92) + 'u003c')};</script></body></html>"
    )
    assert re.search(MARKED, _chromium(tmp_path, "--dump-dom", page.as_uri()))


def test_report_injection_refused_fragment_is_shown_as_text(poisoned, tmp_path):
    page = write_report(poisoned, tmp_path / "page.html")
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#surface=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert not re.search(MARKED, dom) and "<img src=x" not in dom
    assert "selection refused: unknown surface &lt;img src=x onerror=alert(1)&gt;" in dom


def test_report_of_a_directory_with_a_symlink_loop_and_foreign_files_reads_only_what_the_record_names(
    lab_run, tmp_path
):
    directory = tmp_path / "run"
    shutil.copytree(lab_run.directory, directory)
    (directory / "loop").symlink_to(directory)  # copying the directory would recurse without end
    (directory / "elsewhere").symlink_to(tmp_path)
    (directory / "big.bin").write_bytes(b"\0" * (1 << 20))
    page = write_report(directory / "record.json", tmp_path / "page.html")
    assert page.read_text().count("data:image/png;base64,") == 2 + len(lab_run.record["arms"])
    assert not (directory / "plots").exists()


def matplotlib_png() -> bytes:
    """A small PNG as the report's plots are drawn (the report embeds nothing else)."""
    import io

    import matplotlib.pyplot as plt

    figure, stream = plt.figure(figsize=(1, 1), dpi=20), io.BytesIO()
    figure.savefig(stream, format="png")
    plt.close(figure)
    return stream.getvalue()


@pytest.mark.parametrize("link", ["each plot", "the plots directory"])
def test_report_refuses_plots_that_link_out_of_the_record_directory(lab_run, tmp_path, link):
    """A run directory whose plots/*.png linked to another file embedded that file in the page (base64)."""
    import base64

    from experiments.report_figures import simulated_arms
    from tests.hostile import assert_refused

    directory, secret = tmp_path / "run", tmp_path / "secret.txt"
    shutil.copytree(lab_run.directory, directory)
    secret.write_text("not for the page")
    names = ["arms.png", "inference-map.png", *(f"arm-{i}-timeline.png" for i, _ in simulated_arms(lab_run.record))]
    plots = tmp_path / "elsewhere" if link == "the plots directory" else directory / "plots"
    plots.mkdir()
    for name in names:
        (plots / name).symlink_to(secret)
    if link == "the plots directory":
        (directory / "plots").symlink_to(plots)
    out = tmp_path / "page.html"
    line = assert_refused(["report", directory / "record.json", "--out", out], inputs=[secret], watch=[tmp_path])
    assert ": plots: 'plots/arms.png' leads outside its directory through a symbolic link" in line, line
    if link == "the plots directory":
        return
    inside = directory / "inside.png"  # a link that stays in the directory is a plot like any other
    inside.write_bytes(matplotlib_png())
    for name in names:
        (directory / "plots" / name).unlink()
        (directory / "plots" / name).symlink_to(inside)
    assert base64.b64encode(inside.read_bytes()).decode() in write_report(directory / "record.json", out).read_text()
