"""`kvsim synthesize` shapes workloads: a request rate, length distributions, conversations; one seed, one file.

The properties hold for any mix hypothesis draws: arrivals never go back, each turn's prompt extends its
conversation's previous turn (prompt and reply), every length lies in its distribution's range and the
context, and over many requests the rate made is the rate asked within a tolerance stated below.
"""

import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jgpt.cli.main import main as jgpt
from jgpt.foundation.errors import ApiError
from kvsim import distributions
from kvsim.analytic import framing_ids
from kvsim.distributions import Fixed, LogNormal, Sampled, Uniform
from kvsim.synthetic import FRAMING, Arrivals, ConversationMix, synthesize

DATA = Path(__file__).parent / "data"

LENGTHS = st.one_of(
    st.integers(4, 300).map(Fixed),
    st.tuples(st.integers(4, 100), st.integers(0, 200)).map(lambda t: Uniform(t[0], t[0] + t[1])),
    st.tuples(st.floats(4, 500), st.floats(1.01, 20)).map(lambda t: LogNormal(t[0], t[0] * t[1], 4, 4096)),
    st.lists(st.integers(4, 900), min_size=1, max_size=20).map(lambda v: Sampled(tuple(v), "test")),
)
MIXES = st.builds(
    ConversationMix,
    system_prompts=st.integers(0, 5),
    system_tokens=st.integers(0, 64),
    turns=st.tuples(st.integers(1, 4), st.integers(0, 6)).map(lambda t: (t[0], t[0] + t[1])),
    prompt_tokens=LENGTHS,
    output_tokens=st.sampled_from([Fixed(1), Uniform(1, 40), LogNormal(8, 60, 1, 4096)]),
    max_new_tokens=st.integers(1, 64),
    arrivals=st.sampled_from(tuple(Arrivals)),
    think_us=st.tuples(st.integers(0, 10_000), st.integers(0, 50_000)).map(lambda t: (t[0], t[0] + t[1])),
    context=st.integers(1024, 8192),
)


def _conversation_turns(items):
    """Each conversation's turns in turn order (request ids are c{conversation}t{turn})."""
    turns: dict[str, list] = {}
    for item in sorted(items, key=lambda i: int(i.request_id.partition("t")[2])):
        turns.setdefault(item.request_id.partition("t")[0], []).append(item)
    return turns


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mix=MIXES, seed=st.integers(0, 2**53), requests=st.integers(1, 300), rate=st.floats(0.01, 1e5))
def test_arrivals_prefixes_and_lengths_hold_for_any_mix(mix, seed, requests, rate):
    made = synthesize(requests, seed, mix.with_rate(rate))
    items = made.items
    assert len(items) == requests and len({i.request_id for i in items}) == requests
    assert all(a.arrival_us <= b.arrival_us for a, b in zip(items, items[1:], strict=False))
    systems = mix.system_tokens + 2 if mix.system_prompts else 0
    for turns in _conversation_turns(items).values():
        assert [int(t.request_id.partition("t")[2]) for t in turns] == list(range(len(turns)))
        assert len(turns) <= mix.turns[1]
        history: tuple = turns[0].prompt_ids[:systems]
        for turn in turns:
            assert turn.prompt_ids[: len(history)] == history  # the prefix property
            added = len(turn.prompt_ids) - len(history)
            assert FRAMING + 1 <= added  # a message and its framing
            # A message cut to fit leaves its prompt filling the context up to the budget.
            assert _within(mix.prompt_tokens, added) or len(turn.prompt_ids) + mix.max_new_tokens == mix.context
            assert len(turn.prompt_ids) + mix.max_new_tokens <= mix.context
            assert 1 <= len(turn.output_ids) <= mix.max_new_tokens and turn.max_new_tokens == mix.max_new_tokens
            assert _within(mix.output_tokens, len(turn.output_ids)) or len(turn.output_ids) == mix.max_new_tokens
            assert turn.complete == (turn.output_ids[-1] == framing_ids()["turn_end"])
            history = (*turn.prompt_ids, *turn.output_ids)
        think = [b.arrival_us - a.arrival_us for a, b in zip(turns, turns[1:], strict=False)]
        assert all(mix.think_us[0] <= gap <= mix.think_us[1] for gap in think)


def _within(distribution, value: int) -> bool:
    if isinstance(distribution, Fixed):
        return value == distribution.value
    if isinstance(distribution, Uniform):
        return distribution.low <= value <= distribution.high
    if isinstance(distribution, LogNormal):
        return distribution.least <= value <= distribution.most
    return value in distribution.values


# The rate made is (N - 1) / (last arrival - first arrival). Conversation starts are a Poisson process of
# rate R / mean turns, so over N requests from about N / mean turns conversations the relative error has
# a standard deviation near sqrt(1 + (turns' sd / mean)^2) / sqrt(N / mean turns): 3.1% for 5,000 requests of
# 1 to 6 turns. 15% is five of those; the think times are kept well under the span so as not to stretch it.
RATE_TOLERANCE = 0.15


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.floats(0.5, 2_000),
    seed=st.integers(0, 2**32),
    turns=st.sampled_from([(1, 1), (1, 6), (3, 3)]),
    arrivals=st.sampled_from(tuple(Arrivals)),
)
def test_the_rate_made_is_the_rate_asked_for_many_requests(rate, seed, turns, arrivals):
    requests = 5_000
    span_s = requests / rate
    think = max(0, round(span_s * 1e6 / 10_000 / max(turns)))  # a conversation under 1% of the span
    mix = ConversationMix(turns=turns, think_us=(0, think), arrivals=arrivals).with_rate(rate)
    items = synthesize(requests, seed, mix).items
    made = (requests - 1) * 1e6 / (items[-1].arrival_us - items[0].arrival_us)
    assert math.isclose(made, rate, rel_tol=RATE_TOLERANCE), (made, rate)


def test_fixed_arrivals_of_single_turns_are_evenly_spaced():
    items = synthesize(50, 3, ConversationMix(turns=(1, 1), arrivals=Arrivals.FIXED).with_rate(4)).items
    assert [i.arrival_us for i in items] == [250_000 * n for n in range(50)]


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(["fixed", "uniform", "lognormal"]),
    a=st.integers(4, 5000),
    b=st.integers(0, 5000),
    seed=st.integers(0, 2**32),
)
def test_a_written_distribution_reads_back_and_draws_within_its_range(kind, a, b, seed):
    text = {"fixed": f"{a}", "uniform": f"uniform:{a}:{a + b}", "lognormal": f"lognormal:{a}:{a + b + 1}"}[kind]
    parsed = distributions.parse(text, "--prompt-tokens", 4, 10_000)
    assert parsed.spec() == text
    rng = random.Random(seed)
    assert all(4 <= parsed.draw(rng) <= 10_000 for _ in range(50))


def test_a_lognormal_has_the_median_and_p90_it_was_given():
    distribution = distributions.parse("lognormal:200:800", "--prompt-tokens", 4, 10**9)
    rng = random.Random(0)
    draws = sorted(distribution.draw(rng) for _ in range(40_000))
    # Order statistics of 40,000 draws: within 3% of the quantiles asked (their spread is about 1%).
    assert math.isclose(draws[20_000], 200, rel_tol=0.03) and math.isclose(draws[36_000], 800, rel_tol=0.03)
    assert math.isclose(distribution.sigma, math.log(4) / 1.2815515655446004, rel_tol=1e-12)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=30))
def test_any_text_is_a_distribution_or_an_error_naming_the_option(text):
    try:
        parsed = distributions.parse(text, "--output-tokens", 1, 4096)
    except ApiError as error:
        assert error.field == "--output-tokens"
    else:
        assert isinstance(parsed, Fixed | Uniform | LogNormal | distributions.TraceSource)


def _synthesize(tmp_path, name, *options) -> tuple[int, bytes]:
    out = tmp_path / name
    code = jgpt(["kvsim", "synthesize", "--out", str(out), *map(str, options)])
    return code, out.read_bytes() if out.exists() else b""


def test_the_same_seed_writes_the_same_bytes_and_another_seed_differs(tmp_path, capsys):
    shape = ["--requests", 300, "--rate", 20, "--prompt-tokens", "lognormal:200:800", "--turns", "uniform:1:4"]
    first, again = _synthesize(tmp_path, "a.json", *shape), _synthesize(tmp_path, "b.json", *shape)
    other = _synthesize(tmp_path, "c.json", *shape, "--seed", 1)
    assert first[0] == again[0] == other[0] == 0
    assert first[1] == again[1] != other[1]
    out = capsys.readouterr().out
    assert (
        "arrivals: poisson, 20 requests/s asked" in out and "prompt ids (a turn adds lognormal:200:800) median" in out
    )
    source = json.loads(first[1])["execution"]["provenance"]["sources"]["generator"]
    assert "--rate 20.0" in source and "--prompt-tokens lognormal:200:800" in source


def test_lengths_sampled_from_a_trace_are_the_trace_s(tmp_path):
    trace = DATA / "kvsim_mooncake_sample.jsonl"
    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    code, written = _synthesize(
        tmp_path, "c.json", "--requests", 40, "--turns", 1, "--system-prompts", 0, "--max-new-tokens", 16,
        "--prompt-tokens", f"trace:mooncake:{trace}", "--output-tokens", f"trace:azure:{DATA / 'kvsim_azure_sample.csv'}",
    )  # fmt: skip
    assert code == 0
    requests = json.loads(written)["requests"]
    assert {len(r["prompt_ids"]) for r in requests} <= {r["input_length"] for r in rows}
    azure = [int(line.split(",")[2]) for line in (DATA / "kvsim_azure_sample.csv").read_text().splitlines()[1:]]
    assert {len(r["output_ids"]) for r in requests} <= set(azure)


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        (["--rate", "-1"], "--rate", "requests a second, got -1.0"),
        (["--rate", "nan"], "--rate", "got nan"),
        (["--prompt-tokens", "lognormal:200:100"], "--prompt-tokens", "p90 must be above its median (sigma > 0)"),
        (["--prompt-tokens", "lognormal:0:100"], "--prompt-tokens", "median must be above 0"),
        (["--prompt-tokens", "3"], "--prompt-tokens", "values must be from 4"),
        (["--output-tokens", "uniform:9:2"], "--output-tokens", "LO <= HI"),
        (["--output-tokens", "normal:9:2"], "--output-tokens", "expected one of N, uniform:LO:HI"),
        (["--output-tokens", "trace:csv:x"], "--output-tokens", "trace formats are mooncake, azure"),
        (["--output-tokens", "trace:azure:/nonexistent/t.csv"], "--output-tokens", "/nonexistent/t.csv"),
        (["--turns", "0"], "--turns", "values must be from 1"),
        (["--turns", "lognormal:2:3"], "--turns", "takes N or uniform:LO:HI"),
        (["--think-ms", "-5"], "--think-ms", "values must be from 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens", "must be at least 1"),
        (["--system-prompts", "-1"], "--system-prompts", "must be at least 0"),
        (["--prompt-tokens", "2040", "--context", "2048"], "--prompt-tokens", "past the model's context 2048"),
        (["--prompt-tokens", "4000", "--context", "2048"], "--prompt-tokens", "past the model's context 2048"),
        (["--output-tokens", "lognormal:2e6:3e6"], "--output-tokens", "median must be above 0 and at most 1048576"),
    ],
)
def test_each_bad_option_is_one_error_naming_it(tmp_path, capsys, options, field, words):
    code, written = _synthesize(tmp_path, "c.json", *options)
    err = capsys.readouterr().err
    assert code == 2 and not written
    assert f"{field}: " in err and words in err and err.count("\n") == 1, err


def test_the_defaults_make_a_workload_the_labs_default_system_serves(tmp_path, capsys):
    """The rule for the default rate: the labs' default system serves the default workload under half busy,
    rejecting nothing."""
    from experiments.generation_defaults import generation_defaults
    from kvsim import parse_document, parse_system, simulate

    code, written = _synthesize(tmp_path, "c.json", "--requests", 400)
    assert code == 0
    system = parse_system(generation_defaults().execution.system_config_json())
    totals = simulate(system, parse_document(json.loads(written))).outcomes["totals"]
    assert totals["rejected"] == 0 and totals["compute_busy_fraction"] < 0.5, totals
