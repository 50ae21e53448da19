"""Sizes that reach an allocation, and declared times, are bounded before anything is allocated or compiled.

- A generation budget past the context is clamped: every buffer a run sizes by its steps holds at most the ids
  the context leaves after the prompt (`inference.generation.selectable`); the budget keeps its meaning (the row
  stops at the context). `generate --max-new-tokens 2147483647` with a draft or prompt lookup used to be killed
  by the OOM killer at 23.8 GB, and with `--json` ended in an XLA out-of-memory traceback.
- A run whose buffers would still pass jgpt.foundation.limits.BUFFER_LIMIT is refused naming the size: `max_new_tokens`
  for a generation, `scheduling.max_active_requests` for the engine's slot state (a SYSTEM.json with 65,536
  active requests sized a 34 GB buffer and died in a traceback after a minute of compiling), `kv_cache.*` for
  the states its pool may retain.
- A served workload's declared times are at most kvsim.workload.WALL_CLOCK_LIMIT_US (one day); with
  `--as-fast-as-possible` nothing waits for them (a cancel at 2^53 us held `serve` for ever).
- Model text streamed to a terminal is escaped (`inference.commands.terminal_text`); a pipe gets it exactly.
"""

from __future__ import annotations

import functools
import io
import json
import time
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import inference.commands
import inference.execution
import inference.generation
import inference.speculative
import jgpt.foundation.limits
from inference.engine import InferenceEngine
from inference.policy import GenerationPolicy, InferenceRequest
from inference.slot_execution import SlotExecution
from jgpt.foundation.errors import ApiError
from jgpt.tokenizers.tokenizer import Tokenizer
from kvsim.system import parse_system
from kvsim.workload import WALL_CLOCK_LIMIT_US

from hostile import FUZZ, assert_clean, assert_refused, error_lines, extreme_numbers, run_jgpt

DATA = Path(__file__).parent / "data"
BIGGEST = 2**31 - 1
CONTEXT = 128  # the shipped chat model's
# A prompt one id short of the context: any run selects at most 2 ids, whatever its budget (cheap to fuzz).
LONG_PROMPT = ",".join(["257"] + ["97"] * (CONTEXT - 2))


@pytest.fixture(autouse=True)
def loaded_once(monkeypatch):
    """Every command of this module loads the model once (the loading is not what is tested)."""
    monkeypatch.setattr(inference.commands, "_load", _cached_load)


@functools.cache
def _cached_load(model, precision=None, kernels="auto"):
    return _original_load(model, precision, kernels)


_original_load = inference.commands._load


@pytest.fixture
def loop_widths(monkeypatch):
    """The `steps` each compiled loop is built with, checked against the context before it allocates anything."""
    widths: list[int] = []

    def spy(original):
        def checked(*args, steps, **kwargs):
            widths.append(steps)
            assert steps <= CONTEXT + 1, f"a loop sized {steps} columns for a context of {CONTEXT}"
            return original(*args, steps=steps, **kwargs)

        return checked

    monkeypatch.setattr(inference.generation, "_decode_loop", spy(inference.generation._decode_loop))
    monkeypatch.setattr(inference.speculative, "_speculative_loop", spy(inference.speculative._speculative_loop))
    return widths


@pytest.fixture
def nothing_compiles(monkeypatch):
    """Fails a test that runs a model program: its refusal must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model program ran before the refusal")

    monkeypatch.setattr(inference.generation, "_decode_loop", refuse)
    monkeypatch.setattr(inference.speculative, "_speculative_loop", refuse)
    monkeypatch.setattr(inference.execution.ModelExecution, "advance", refuse)
    monkeypatch.setattr(SlotExecution, "compile", refuse)


# -- generation budgets --------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [[], ["--json"], ["--draft", "chat-draft"], ["--draft", "prompt-lookup"],
                                     ["--draft", "chat-draft", "--json"], ["--sample", "--json"]])  # fmt: skip
def test_a_budget_past_the_context_is_clamped_to_it(options, loop_widths):
    code, stdout, stderr = run_jgpt(["generate", "--ids", LONG_PROMPT, "--max-new-tokens", BIGGEST, *options])
    assert code == 0, stderr
    if "--json" in options:
        outcome = json.loads(stdout)["outcome"]
        assert outcome["selected_tokens"] <= 2 and outcome["stop_reason"] in ("context", "turn_end"), outcome
        assert outcome["unused_budget"] == BIGGEST - outcome["selected_tokens"]  # the budget kept its meaning
    else:
        assert "[context: " in stderr or "[turn_end: " in stderr, stderr
    assert all(width <= CONTEXT + 1 for width in loop_widths)


def test_the_issue_commands_complete_with_the_budget_of_the_context():
    """`reverse abcd` with the largest budget: the row ends at its TURN_END, as with the default budget."""
    for options in ([], ["--json"], ["--draft", "chat-draft"], ["--draft", "prompt-lookup"]):
        code, stdout, stderr = run_jgpt(["generate", "--max-new-tokens", BIGGEST, *options, "reverse abcd"])
        assert code == 0, stderr
        text = json.loads(stdout)["text"] if "--json" in options else stdout
        assert text.strip() == "dcba", (options, stdout)


def test_selectable_is_the_budget_or_what_the_context_leaves():
    assert inference.generation.selectable([1] * 10, BIGGEST, 128) == 119
    assert inference.generation.selectable([1] * 10, 5, 128) == 5
    assert inference.generation.selectable([1] * 128, BIGGEST, 128) == 1  # the prefill's id, and no slot left
    assert inference.generation.selectable([1] * 500, 7, 128) == 1  # refused later by check_prompt


@pytest.mark.parametrize("options", [["--json"], [], ["--draft", "chat-draft"], ["--draft", "prompt-lookup"]])
def test_buffers_past_the_limit_are_refused_naming_the_budget_before_anything_runs(
    options, monkeypatch, nothing_compiles
):
    monkeypatch.setattr(jgpt.foundation.limits, "BUFFER_LIMIT", 100_000)
    line = assert_refused(["generate", "--max-new-tokens", BIGGEST, *options, "reverse abcd"], field="max_new_tokens")
    assert "BUFFER_LIMIT" in line and "bytes" in line, line


def test_kept_logits_count_against_the_limit(monkeypatch, nothing_compiles):
    """The chat model's 128-slot state fits 600 kB; with --json its logits of 119 steps (119 x 260 x 4 bytes
    kept, and the reference's of every slot) do not."""
    monkeypatch.setattr(jgpt.foundation.limits, "BUFFER_LIMIT", 600_000)
    assert_refused(["generate", "--json", "--max-new-tokens", BIGGEST, "reverse abcd"], field="max_new_tokens")


def test_record_clamps_the_same_way(tmp_path):
    document = {"kind": "bounds", "requests": [
        {"request_id": "r", "arrival_us": 0, "request": {"text": "reverse abcd", "generation": {"max_new_tokens": BIGGEST}}}
    ]}  # fmt: skip
    w, _, out = _files(tmp_path, document, _system())
    code, _, stderr = run_jgpt(["record", w, "--out", out, "--quiet"])
    assert code == 0, stderr
    (recorded,) = json.loads(out.read_text())["requests"]
    assert recorded["outcome"]["unused_budget"] == BIGGEST - len(recorded["output_ids"])


def test_record_refuses_a_request_past_the_limit_before_running_any(tmp_path, monkeypatch, nothing_compiles):
    monkeypatch.setattr(
        jgpt.foundation.limits, "BUFFER_LIMIT", 600_000
    )  # the reference's logits of 114 steps do not fit
    document = _workload(2, budget=4)
    document["requests"][1]["request"]["generation"]["max_new_tokens"] = BIGGEST
    w, _, out = _files(tmp_path, document, _system())
    assert_refused(["record", w, "--out", out], inputs=[w], watch=[out.parent],
                   field="request 'r1': generation.max_new_tokens")  # fmt: skip


# -- the engine's slot state and pool -----------------------------------------------------------------------


def _system(**scheduling) -> dict:
    system = json.loads((DATA / "engine_system.json").read_text())
    system["scheduling"].update(scheduling)
    return system


def _workload(n: int, cancel_at: int | None = None, budget: int = 4) -> dict:
    body = lambda i: {"prompt_ids": [257, 72 + i % 20], "generation": {"max_new_tokens": budget}}  # noqa: E731
    document: dict = {"kind": "bounds", "requests": [{"request_id": f"r{i}", "arrival_us": 0, "request": body(i)}
                                                     for i in range(n)]}  # fmt: skip
    if cancel_at is not None:
        document["customer_interaction"] = {"actions": [{"kind": "cancel", "at_us": cancel_at, "request_id": "r0"}]}
    return document


def _files(tmp_path: Path, workload: dict | bytes, system: dict | bytes) -> tuple[Path, Path, Path]:
    w, s = tmp_path / "workload.json", tmp_path / "system.json"
    w.write_bytes(workload if isinstance(workload, bytes) else json.dumps(workload).encode())
    s.write_bytes(system if isinstance(system, bytes) else json.dumps(system).encode())
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return w, s, out / "measured.json"


def test_65536_active_requests_are_refused_naming_the_slot_count_and_bytes(tmp_path, nothing_compiles):
    w, s, out = _files(tmp_path, _workload(65536, budget=64), _system(max_active_requests=65536))
    line = assert_refused(
        ["serve", w, "--system", s, "--out", out], inputs=[w, s], watch=[out.parent],
        field="scheduling.max_active_requests",
    )  # fmt: skip
    assert "65536 rows" in line and "25,795,363,200 bytes" in line, line


def _pool_case(tmp_path: Path, monkeypatch, retention: str):
    """One active request, but a pool that may retain every request's state: 1 MiB of limit cannot hold it."""
    monkeypatch.setattr(jgpt.foundation.limits, "BUFFER_LIMIT", 1 << 20)
    system = _system(max_active_requests=1)
    system["kv_cache"].update(device_kv_bytes=2**53, retention_policy=retention)
    w, s, out = _files(tmp_path, _workload(64), system)
    return ["serve", w, "--system", s, "--out", out, "--as-fast-as-possible", "--quiet"], [w, s], out


def test_what_the_pool_may_retain_counts_against_the_limit(tmp_path, monkeypatch, nothing_compiles):
    argv, inputs, out = _pool_case(tmp_path, monkeypatch, "lru")
    assert_refused(argv, inputs=inputs, watch=[out.parent], field="kv_cache.device_kv_bytes")


def test_a_pool_that_retains_nothing_leaves_the_slot_state_alone(tmp_path, monkeypatch):
    argv, _, out = _pool_case(tmp_path, monkeypatch, "none")
    code, _, stderr = run_jgpt(argv)
    assert code == 0 and out.is_file(), stderr


# -- declared times -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast", [False, True])
def test_declared_times_past_a_day_are_refused_naming_the_field(tmp_path, fast, nothing_compiles):
    late = WALL_CLOCK_LIMIT_US + 1
    arrivals = _workload(2)
    arrivals["requests"][1]["arrival_us"] = late
    for document, field in (
        (arrivals, "workload.requests[1].arrival_us"),
        (_workload(2, cancel_at=2**53), "workload.customer_interaction.actions[0].at_us"),
    ):
        w, s, out = _files(tmp_path, document, _system())
        argv = ["serve", w, "--system", s, "--out", out] + (["--as-fast-as-possible"] if fast else [])
        line = assert_refused(argv, inputs=[w, s], watch=[out.parent], field=field)
        assert str(late if "arrival" in field else 2**53) in line, line


def test_record_reads_the_same_schema(tmp_path, nothing_compiles):
    document = _workload(1)
    document["requests"][0]["arrival_us"] = 2**53
    w, _, out = _files(tmp_path, document, _system())
    assert_refused(["record", w, "--out", out], inputs=[w], watch=[out.parent], field="workload.requests[0].arrival_us")


def test_the_engine_refuses_far_times_whoever_read_them():
    """A lab's engine arm builds its requests itself: the engine's own gate names the request."""
    execution = _cached_load(None).execution
    far = InferenceRequest("far", (257, 72), GenerationPolicy(4), WALL_CLOCK_LIMIT_US + 1)
    with pytest.raises(ApiError, match=r"request 'far': arrival_us: .* past 86400000000 us"):
        InferenceEngine(execution, parse_system(_system())).serve([far])


def test_as_fast_as_possible_does_not_wait_for_a_cancel_a_day_away(tmp_path):
    w, s, out = _files(tmp_path, _workload(2, cancel_at=WALL_CLOCK_LIMIT_US), _system())
    started = time.monotonic()
    code, _, stderr = run_jgpt(["serve", w, "--system", s, "--out", out, "--as-fast-as-possible", "--quiet"])
    assert code == 0, stderr
    assert time.monotonic() - started < 120
    measured = json.loads(out.read_text())
    assert measured["totals"]["end_us"] < 60_000_000  # the run's own clock: not a day


# -- model text on a terminal -------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


HOSTILE_TEXT = "a\x1b]0;owned\x07b\tc\nd\x1b[2Je\u202ef\r"


@pytest.mark.parametrize("terminal", [True, False])
def test_streamed_model_text_is_escaped_on_a_terminal_and_exact_in_a_pipe(terminal, monkeypatch):
    stdout = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stdout", stdout)
    tokenizer = Tokenizer.bytes_only()
    ids = tokenizer.encode_text(HOSTILE_TEXT)
    stream = inference.commands._TextStream(tokenizer, tokenizer.turn_end_id)
    for token in ids[: len(ids) // 2]:
        stream.select(0, token)
    stream.ids.extend(ids[len(ids) // 2 :])  # the rest arrives at the end, as a speculative run's does
    stream.finish(_Response())
    shown = stdout.getvalue()
    if terminal:
        assert shown == "a\\x1b]0;owned\\x07b\tc\nd\\x1b[2Je\\u202ef\\r\n", repr(shown)
        assert not any(c in shown for c in "\x1b\x07\r\u202e")
    else:
        assert shown == HOSTILE_TEXT + "\n"


class _Response:
    class outcome:  # noqa: N801
        stop_reason, selected_tokens, published_tokens = "turn_end", 1, 1

    speculation = None
    observations = ()


def test_terminal_text_keeps_newlines_and_tabs_and_printable_text():
    assert inference.commands.terminal_text("héllo\tw\u00f6rld\n日本\n") == "héllo\tw\u00f6rld\n日本\n"
    assert inference.commands.terminal_text("\x00\x9b\u200b") == "\\x00\\x9b\\u200b"


# -- fuzz -------------------------------------------------------------------------------------------------------

# Each numeric flag of `generate`, with the options it needs.
GENERATE_FLAGS = {
    "--max-new-tokens": [],
    "--observe": [],
    "--speculate": ["--draft", "prompt-lookup"],
    "--top-k": ["--sample"],
    "--seed": ["--sample"],
    "--temperature": ["--sample"],
    "--top-p": ["--sample"],
}


@FUZZ
@given(
    flag=st.sampled_from(sorted(GENERATE_FLAGS)),
    value=extreme_numbers(),
    budget=st.one_of(st.just(BIGGEST), st.integers(1, 4)),
    as_json=st.booleans(),
)
def test_fuzz_generate_numeric_flags(flag, value, budget, as_json, loop_widths):
    """Any number for a flag: refused naming it, or a run of at most the 2 ids the context leaves (never a
    buffer past the context)."""
    argv = ["generate", "--ids", LONG_PROMPT, *GENERATE_FLAGS[flag], flag, value.decode()]
    if flag != "--max-new-tokens":
        argv += ["--max-new-tokens", budget]
    argv += ["--json"] if as_json else []
    code, stdout, stderr = run_jgpt(argv)
    assert "Traceback" not in stderr + stdout, stderr
    event(f"exit {code}")
    if code == 2:
        (line,) = error_lines(stderr)
        named = flag.removeprefix("--")
        assert named in line or named.replace("-", "_") in line, line
        return
    assert code == 0, stderr
    if as_json:
        assert json.loads(stdout)["outcome"]["selected_tokens"] <= 2
    assert all(width <= CONTEXT + 1 for width in loop_widths)


SYSTEM_NUMBERS = [
    ("max_requests",),
    ("max_new_tokens_cap",),
    ("scheduling", "max_active_requests"),
    ("kv_cache", "device_kv_bytes"),
    ("kv_cache", "host_kv_bytes"),
]
# The fuzz workload's slot state has 16 slots of 4,100 bytes a row, and a row more for a prefill's start: one
# active row (131,200 bytes) fits this limit, two do not (196,800), nor one with what an LRU pool may retain
# (131,072 more). So both memory refusals (the slot rows, the pool) and served runs occur.
FUZZ_BUFFER_LIMIT = 150_000


@FUZZ
@given(
    where=st.sampled_from(SYSTEM_NUMBERS + [("arrival",), ("cancel",)]),
    value=extreme_numbers(),
    retention=st.sampled_from(["lru", "none"]),
)
def test_fuzz_serve_extreme_times_and_system_numbers(tmp_path, monkeypatch, where, value, retention):
    """A number at or past the edges in SYSTEM.json or as a declared time: refused before compile naming the
    field (or the size it drives past the limit), or served quickly with --as-fast-as-possible."""
    monkeypatch.setattr(jgpt.foundation.limits, "BUFFER_LIMIT", FUZZ_BUFFER_LIMIT)
    sentinel = "__number__"
    system, workload = _system(max_active_requests=1), _workload(2, cancel_at=0)
    system["kv_cache"]["retention_policy"] = retention
    if where == ("arrival",):
        workload["requests"][1]["arrival_us"], field = sentinel, "workload.requests[1].arrival_us"
    elif where == ("cancel",):
        workload["customer_interaction"]["actions"][0]["at_us"] = sentinel
        field = "workload.customer_interaction.actions[0].at_us"
    else:
        parent = system if len(where) == 1 else system[where[0]]
        parent[where[-1]], field = sentinel, "system." + ".".join(where)
    place = lambda document: json.dumps(document).replace(f'"{sentinel}"', value.decode()).encode()  # noqa: E731
    w, s, out = _files(tmp_path, place(workload), place(system))
    out.unlink(missing_ok=True)
    argv = ["serve", w, "--system", s, "--out", out, "--as-fast-as-possible", "--quiet"]
    number = json.loads(value)
    timed = where[0] in ("arrival", "cancel")
    lowest = 0 if timed or where[-1] == "host_kv_bytes" else 1
    if not (isinstance(number, int) and lowest <= number <= (WALL_CLOCK_LIMIT_US if timed else 2**53)):
        assert_refused(argv, inputs=[w, s], watch=[out.parent], field=field)  # the number itself, by its path
        event("refused: the number")
        return
    started = time.monotonic()
    if assert_clean(argv, inputs=[w, s], watch=[out.parent]) == 0:
        assert out.is_file() and time.monotonic() - started < 60
        event("served")
    else:  # a valid number that sizes the KV arrays past the limit, refused naming the size it drives
        line = assert_refused(argv, inputs=[w, s], watch=[out.parent], field="BUFFER_LIMIT")
        assert "scheduling.max_active_requests" in line or "kv_cache." in line, line
        event(f"refused: {line.split(': ')[2]}")


@pytest.mark.parametrize("workload", ["workload", "calibration_workload"])
def test_a_lab_served_on_the_engine_refuses_far_times_before_anything_runs(workload):
    """kvsim-fidelity serves both workloads on the engine: its third turn, two days away, is refused
    when the lab is read (kvsim arms alone take any time kvsim does)."""
    from experiments.experiment_design import LABS, ExperimentDesign
    from jgpt.foundation.json_input import read_json

    lab = read_json(LABS / "kvsim-fidelity.json", "lab")
    ExperimentDesign.from_json(lab)
    lab[workload]["conversations"][0]["turn_gap_us"] = WALL_CLOCK_LIMIT_US
    with pytest.raises(ApiError, match=rf"{workload}: request '.*\.2': arrival_us: \d+ us is past 86400000000 us"):
        ExperimentDesign.from_json(lab)
