"""`kvsim plot` draws every request, or says on the figure and in its output how many of how many it shows.

Checked through matplotlib's artists: the timeline's line collections hold one segment per request drawn
(the earliest arrivals when limited), the latency CDF reaches 1 over every admitted request, and the
occupancy steps cover every event.
"""

import json
from pathlib import Path

import pytest
from matplotlib.collections import LineCollection, PathCollection

from jgpt.cli.main import main as jgpt
from kvsim.cache_run import read_record
from kvsim.cache_run_plots import figures
from kvsim.record_lines import whole_view
from kvsim.record_view import check_viewable

EXAMPLE = json.loads((Path(__file__).parent / "data" / "kvsim_worked_example.json").read_text())
# Small budgets and two active requests: some requests are rejected (no latency), some states dropped.
SYSTEM = EXAMPLE["system"] | {
    "max_requests": 6, "max_new_tokens_cap": 16, "scheduling": {"max_active_requests": 2},
    "kv_cache": {"device_kv_bytes": 10**7, "host_kv_bytes": 10**6},
    "compute_service": {"compute_flops_per_us": 10**6, "memory_bytes_per_us": 10**5},
}  # fmt: skip
REQUESTS = 300


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("plots")
    (directory / "system.json").write_text(json.dumps(SYSTEM))
    document = directory / "doc.json"
    assert jgpt(["kvsim", "synthesize", "--requests", str(REQUESTS), "--rate", "2000", "--out", str(document)]) == 0
    assert jgpt(["kvsim", "run", "--system", str(directory / "system.json"), "--computations", str(document),
                 "--out", str(directory / "record.json"), "--quiet"]) == 0  # fmt: skip
    return directory / "record.json"


def _figures(record: Path, limit):
    data = read_record(record.read_bytes())
    drawn = {name: (figure, note) for name, figure, note in figures(whole_view(check_viewable(data)), limit)}
    return data, drawn


def _title(figure) -> str:
    return figure.axes[0].get_title()


def test_the_timeline_draws_every_request_and_says_so(record):
    data, drawn = _figures(record, None)
    figure, note = drawn["timeline.png"]
    assert note == f"every one of {REQUESTS} requests, by arrival" and note in _title(figure)
    collections = [c for c in figure.axes[0].collections if isinstance(c, LineCollection)]
    assert [len(c.get_segments()) for c in collections] == [REQUESTS] * 3  # queued, to first token, decoding
    (ends,) = [c for c in figure.axes[0].collections if isinstance(c, PathCollection)]
    outcomes = sorted(data["outcomes"]["requests"].values(), key=lambda o: o["arrival_us"])
    assert [x for x, _ in ends.get_offsets()] == [o["end_us"] for o in outcomes]
    assert [s[0][0] for s in collections[0].get_segments()] == [o["arrival_us"] for o in outcomes]


def test_a_limited_timeline_shows_the_earliest_arrivals_and_says_how_many_of_how_many(record):
    data, drawn = _figures(record, 200)
    figure, note = drawn["timeline.png"]
    assert note == (f"showing 200 of {REQUESTS} requests: the first 200 by arrival; --requests all to draw every one")
    assert note in _title(figure)
    queued = next(c for c in figure.axes[0].collections if isinstance(c, LineCollection))
    earliest = sorted(o["arrival_us"] for o in data["outcomes"]["requests"].values())[:200]
    assert [s[0][0] for s in queued.get_segments()] == earliest


def test_the_latency_cdf_covers_every_admitted_request_and_counts_the_rest(record):
    data, drawn = _figures(record, 200)
    figure, note = drawn["latency_cdf.png"]
    outcomes = list(data["outcomes"]["requests"].values())
    admitted = [o for o in outcomes if o["admitted_us"] is not None]
    assert 0 < len(admitted) < len(outcomes)  # the system rejects some: the note must count them
    assert note == (
        f"every admitted request, {len(admitted)} of {REQUESTS} "
        f"({REQUESTS - len(admitted)} rejected or cancelled while waiting have no latency)"
    )
    assert note in _title(figure)
    for line in figure.axes[0].get_lines():
        assert line.get_ydata()[-1] == 1.0
    e2e = next(line for line in figure.axes[0].get_lines() if line.get_label().startswith("end to end"))
    assert max(e2e.get_xdata()) == max(o["e2e_us"] for o in admitted)
    assert e2e.get_label() == f"end to end ({len(admitted)})"


def test_the_occupancy_covers_every_event(record):
    data, drawn = _figures(record, 200)
    figure, note = drawn["occupancy.png"]
    assert note == f"every one of {len(data['events']):,} events" and note in _title(figure)
    device = figure.axes[0].get_lines()[0]
    assert max(device.get_ydata()) == max(e["device_reserved_bytes"] for e in data["events"])


def test_plot_prints_what_each_view_covers(record, tmp_path, capsys):
    assert jgpt(["kvsim", "plot", str(record), "--out-dir", str(tmp_path / "p"), "--requests", "50"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        f"{tmp_path / 'p' / 'timeline.png'}: showing 50 of {REQUESTS} requests: the first 50 by arrival; "
        "--requests all to draw every one"
    )
    assert lines[0].startswith(f"{tmp_path / 'p' / 'occupancy.png'}: every one of ")
    assert lines[2].startswith(f"{tmp_path / 'p' / 'latency_cdf.png'}: every admitted request")


@pytest.mark.parametrize("value", ["0", "-3", "some", "1.5"])
def test_a_bad_requests_value_names_the_option(record, tmp_path, capsys, value):
    assert jgpt(["kvsim", "plot", str(record), "--out-dir", str(tmp_path / "p"), "--requests", value]) == 2
    err = capsys.readouterr().err
    assert "--requests: " in err and not (tmp_path / "p").exists()
