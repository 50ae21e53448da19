"""The RequestEndpoint's contracts without a server: the OpenAI fields read as the CLI reads them, refusals that
name the field, the published text with stop strings, the metrics' exposition, and the bridge to the engine's
thread driven by a scripted engine."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.live_traffic import ARRIVE, Accepted, Closed, Ended, EngineBridge, Failed, Gauges, LiveTraffic, Selected
from inference.policy import GREEDY, SAMPLE
from inference.request_endpoint import (
    CHAT,
    CLI_STREAM,
    COMPLETION,
    PublishedText,
    ServedModel,
    finish_reason,
    read_request,
    usage,
)
from inference.serving_metrics import ServingMetrics
from jgpt.foundation.errors import ApiError
from jgpt.tokenizers.framing import TURN_END_ID, Turn
from jgpt.tokenizers.tokenizer import Tokenizer

TOKENIZER = Tokenizer.bytes_only()
MODEL = ServedModel("tiny", TOKENIZER, vocabulary=260, context=32, turn_end_id=TURN_END_ID, max_new_tokens_cap=30,
                    created=0)  # fmt: skip


def read(kind: str, body: dict, seed: int = 77):
    return read_request(kind, body, MODEL, "r-1", seed)


def test_a_completion_prompt_is_raw_text_or_ids_and_a_chat_is_framed_with_the_assistant_turn_open():
    assert read(COMPLETION, {"prompt": "hi"}).request.prompt_ids == (104, 105)
    assert read(COMPLETION, {"prompt": [[5, 6]]}).request.prompt_ids == (5, 6)
    assert read(COMPLETION, {"prompt": ["hi"]}).request.prompt_ids == (104, 105)
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    framed = TOKENIZER.encode_turns([Turn("system", "be brief"), Turn("user", "hi")], open_turn="assistant").ids
    assert read(CHAT, {"messages": messages}).request.prompt_ids == framed


def test_the_api_fields_become_the_clis_generation_policy():
    greedy = read(COMPLETION, {"prompt": "hi", "temperature": 0, "top_p": 0.5, "max_tokens": 7}).request
    assert (greedy.generation.selection, greedy.generation.max_new_tokens) == (GREEDY, 7)
    sampled = read(COMPLETION, {"prompt": "hi", "top_k": 3, "seed": 9}).request
    assert (sampled.generation.selection, sampled.generation.temperature) == (SAMPLE, 1.0)  # the API's default
    assert (sampled.generation.top_k, sampled.generation.seed, sampled.draws_from) == (3, 9, CLI_STREAM)
    assert read(COMPLETION, {"prompt": "hi"}, seed=1234).request.generation.seed == 1234  # no seed: a fresh one
    assert read(COMPLETION, {"prompt": "hi"}).request.generation.max_new_tokens == 16  # a completion's default
    # A chat's default budget, and any budget past the context, is what the context leaves (context - prompt + 1).
    assert read(CHAT, {"messages": [{"role": "user", "content": "a"}]}).request.generation.max_new_tokens == 32 - 4 + 1
    assert read(COMPLETION, {"prompt": "hello", "max_tokens": 10**6}).request.generation.max_new_tokens == 28
    capped = ServedModel("tiny", TOKENIZER, 260, 32, TURN_END_ID, max_new_tokens_cap=5, created=0)
    assert (
        read_request(
            CHAT, {"messages": [{"role": "user", "content": "a"}]}, capped, "r", 0
        ).request.generation.max_new_tokens
        == 5
    )
    call = read(CHAT, {"messages": [{"role": "user", "content": "a"}], "stream": True, "stop": "x",
                       "stream_options": {"include_usage": True}, "max_completion_tokens": 3, "user": "u", "n": 1})  # fmt: skip
    assert (call.stream, call.include_usage, call.stop, call.request.generation.max_new_tokens) == (
        True,
        True,
        ("x",),
        3,
    )


@pytest.mark.parametrize(
    "kind, body, field, says",
    [
        (COMPLETION, {"prompt": "hi", "max_tokens": 0}, "max_tokens", "1..2147483647, got 0"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": -1},
            "max_completion_tokens",
            "got -1",
        ),
        (COMPLETION, {"prompt": "hi", "temperature": -1}, "temperature", "got -1"),
        (COMPLETION, {"prompt": "hi", "top_p": 2}, "top_p", "got 2"),
        (COMPLETION, {"prompt": "hi", "top_k": 1.5}, "top_k", "got 1.5"),
        (COMPLETION, {"prompt": "hi", "seed": -3}, "seed", "got -3"),
        (COMPLETION, {"prompt": "hi", "n": 2}, "n", "2 is not supported"),
        (COMPLETION, {"prompt": "hi", "echo": True}, "echo", "True is not supported"),
        (COMPLETION, {"prompt": "hi", "functions": []}, "functions", "unknown field"),
        (COMPLETION, {"prompt": "hi", "model": "gpt-4"}, "model", "'gpt-4' is not served here"),
        (COMPLETION, {"max_tokens": 3}, "prompt", "missing"),
        (COMPLETION, {"prompt": ""}, "prompt", "is empty"),
        (COMPLETION, {"prompt": [1, 999]}, "prompt[1]", "<= 259, got 999"),
        (COMPLETION, {"prompt": ["a", "b"]}, "prompt", "holds 2 prompts"),
        (COMPLETION, {"prompt": "x" * 33}, "prompt", "more than the model's context of 32"),
        (COMPLETION, {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        (COMPLETION, {"prompt": "hi", "stop": [""]}, "stop[0]", "is empty"),
        (COMPLETION, {"prompt": "hi", "stream": "yes"}, "stream", "true or false"),
        (COMPLETION, {"prompt": "hi", "stream_options": {"usage": True}}, "stream_options", "include_usage"),
        (CHAT, {"messages": [{"role": "tool", "content": "a"}]}, "messages[0].role", "'tool' is not a role"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]", "text"),
        (CHAT, {"messages": []}, "messages", "is empty"),
        (CHAT, {"messages": [{"role": "user", "content": "a\ud800"}]}, "messages[0].content", "lone surrogate"),
        (CHAT, {"messages": [{"role": "user"}]}, "messages[0].content", "missing"),
        (CHAT, [1], "body", "expected a JSON object"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field_and_the_value(kind, body, field, says):
    with pytest.raises(ApiError) as refused:
        read(kind, body)
    assert refused.value.field == field and says in refused.value.reason


def test_the_published_text_holds_back_a_split_character_and_a_possible_stop_string():
    text = PublishedText(TOKENIZER, TURN_END_ID, ("END",))
    pieces = [text.add(t) for t in b"ab\xc3\xa9E"]  # é is two bytes; "E" may begin "END"
    assert pieces == [("a", [97]), ("b", [98]), ("", []), ("é", [0xC3, 0xA9]), ("", [])]
    assert text.add(ord("x")) == ("Ex", [ord("E"), ord("x")])  # not "END" after all
    assert [text.add(t) for t in b"yEN"] == [("y", [ord("y")]), ("", []), ("", [])]
    assert text.add(ord("D")) == ("", [ord("E"), ord("N"), ord("D")]) and text.stopped
    assert text.add(ord("z")) == ("", []) and text.release(final=True) == ("", [])
    at_once = PublishedText(TOKENIZER, TURN_END_ID, ())
    assert at_once.extend([*b"ab\xc3\xa9C\xc3", TURN_END_ID]) == ("abéC", list(b"ab\xc3\xa9C\xc3"))
    assert at_once.release(final=True) == ("<0xC3>", [])  # an unfinished character, marked at the end
    plain = PublishedText(TOKENIZER, TURN_END_ID, ())
    assert [plain.add(t) for t in (104, TURN_END_ID)] == [("h", [104]), ("", [])]
    assert plain.release(final=True) == ("", [])


def whole_decode_pieces(groups: list[list[int]], stop: tuple[str, ...]) -> list[tuple[str, list[int]]]:
    """The reference: after each group the whole text decoded again (final=False), cut at the first stop string,
    less the longest tail past the text given out that may begin one; at the end the whole text (final)."""
    longest, ids, unsent, sent, stopped, pieces = max(map(len, stop), default=0), [], [], 0, False, []
    for final, group in [*((False, g) for g in groups), (True, [])]:
        kept = [] if stopped else [t for t in group if t != TURN_END_ID]
        ids, unsent = ids + kept, unsent + kept
        if stopped or (not kept and not final):
            pieces.append(("", []))
            continue
        text = TOKENIZER.decode(ids, final=final).text
        found = [at for s in stop if (at := text.find(s, max(0, sent - longest + 1))) >= 0]
        end = min(found) if found else len(text)
        stopped = bool(found)
        if not found and not final:
            end -= next((n for n in range(min(longest - 1, len(text) - sent), 0, -1)
                         if any(s.startswith(text[-n:]) for s in stop)), 0)  # fmt: skip
        piece, sent = text[sent : max(end, sent)], max(end, sent)
        released = bool(piece) or final or stopped
        pieces.append((piece, unsent) if released else ("", []))
        unsent = [] if released else unsent
    return pieces


@settings(max_examples=400, deadline=None)
@given(
    groups=st.lists(st.lists(st.sampled_from([*b"abc", 0xC3, 0xA9, 0xE2, 0x82, 0xFF, TURN_END_ID, 257]), max_size=3)),
    stop=st.lists(st.text("abcé\ufffd", min_size=1, max_size=3), max_size=3).map(tuple),
)
def test_the_published_text_is_the_whole_decode_cut_at_a_stop_string_as_ids_come(groups, stop):
    """Decoding each id once gives out, id group by id group, what decoding the whole text again would."""
    text = PublishedText(TOKENIZER, TURN_END_ID, stop)
    pieces = [text.extend(group) for group in groups] + [text.release(final=True)]
    assert pieces == whole_decode_pieces(groups, stop)


def test_finish_reason_and_usage_read_the_engines_outcome():
    outcome = {"status": "completed", "stop_reason": "turn_end", "prompt_positions": 9, "selected_tokens": 4,
               "reuse_positions": 6}  # fmt: skip
    assert finish_reason(outcome, False) == "stop"
    assert finish_reason(outcome | {"status": "stopped", "stop_reason": "max_new_tokens"}, False) == "length"
    assert finish_reason(outcome | {"status": "cancelled", "stop_reason": "cancelled at step boundary"}, True) == "stop"
    assert (
        finish_reason(outcome | {"status": "cancelled", "stop_reason": "cancelled at step boundary"}, False) == "abort"
    )
    assert usage(outcome) == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13,
                              "prompt_tokens_details": {"cached_tokens": 6}}  # fmt: skip


def _outcome(status: str, admitted: bool = True, tier: str | None = None) -> dict:
    times = dict.fromkeys(("ttft_us", "tpot_us", "e2e_us", "queueing_us"), 3000 if admitted else None)
    return {"status": status, "admitted_us": 0 if admitted else None, "prompt_positions": 10,
            "reuse_positions": 4 if tier else 0, "reuse_tier": tier, **times}  # fmt: skip


def test_the_metrics_are_prometheus_text_folded_from_the_outcomes():
    metrics = ServingMetrics(lambda: Gauges(2, 3, 1000, 10), device_kv_capacity=5000, host_kv_capacity=20)
    for publication in (Selected(1), Selected(2), Ended(_outcome("completed", tier="device")),
                        Ended(_outcome("cancelled")), Ended(_outcome("rejected", admitted=False))):  # fmt: skip
        metrics.observe("r", publication)
    metrics.responded("/v1/completions", 429)
    metrics.disconnected()
    lines = set(metrics.text().splitlines())
    assert {
        'jgpt_requests_total{outcome="completed"} 1', 'jgpt_requests_total{outcome="rejected"} 1',
        'jgpt_http_responses_total{endpoint="/v1/completions",code="429"} 1', "jgpt_client_disconnects_total 1",
        "jgpt_generation_tokens_total 2", "jgpt_prompt_tokens_total 20", "jgpt_reused_prompt_tokens_total 4",
        'jgpt_prefix_hit_rate{tier="device"} 0.5', "jgpt_token_hit_rate 0.2", "jgpt_requests_waiting 2",
        'jgpt_kv_bytes{tier="device"} 1000', 'jgpt_kv_capacity_bytes{tier="host"} 20',
        'jgpt_time_to_first_token_seconds_bucket{le="0.0025"} 0', 'jgpt_time_to_first_token_seconds_bucket{le="0.005"} 2',
        'jgpt_time_to_first_token_seconds_bucket{le="+Inf"} 2', "jgpt_time_to_first_token_seconds_count 2",
        "# TYPE jgpt_e2e_request_latency_seconds histogram",
    } <= lines  # fmt: skip


def _scripted_engine(traffic: LiveTraffic) -> list:
    """A stand-in for the engine's live loop: accepts each arrival, selects its prompt's ids back one happening
    at a time, honours a cancel between them, and ends when the traffic is closed and nothing is running."""
    traffic.start(0)
    running: dict[str, list[int]] = {}
    taken = []
    while (at := traffic.upcoming(wait=not running)) is not None or running:
        if at is not None:
            _, what, payload = traffic.take()
            taken.append(what)
            if what == ARRIVE:
                running[payload.request_id] = list(payload.prompt_ids)
                traffic.publish(payload.request_id, Accepted())
            elif payload.request_id in running:
                del running[payload.request_id]
                traffic.publish(payload.request_id, Ended({"status": "cancelled"}))
        for request_id, ids in list(running.items()):
            traffic.publish(request_id, Selected(ids.pop(0)))
            if not ids:
                del running[request_id]
                traffic.publish(request_id, Ended({"status": "completed"}))
        traffic.flush(Gauges(running=len(running)))
        time.sleep(0.005)  # an id per 5 ms: a cancel sent after the acceptance meets the request running
    return taken


def test_the_bridge_carries_requests_to_the_engine_thread_and_its_publications_back_in_order():
    async def scenario():
        seen = []
        bridge: EngineBridge[list] = EngineBridge(observe=lambda request_id, p: seen.append((request_id, p)))
        bridge.start(_scripted_engine)
        first = bridge.submit(read(COMPLETION, {"prompt": [1, 2, 3]}).request)
        got = [p async for p in first]
        assert got == [Accepted(), Selected(1), Selected(2), Selected(3), Ended({"status": "completed"})]
        second = bridge.submit(read_request(COMPLETION, {"prompt": [4] * 30}, MODEL, "r-2", 0).request)
        assert await anext(second) == Accepted()
        bridge.cancel("r-2")
        rest = [p async for p in second]
        assert rest[-1] == Ended({"status": "cancelled"}) and all(isinstance(p, Selected) for p in rest[:-1])
        taken = await bridge.stop()
        with pytest.raises(Closed):
            bridge.submit(read(COMPLETION, {"prompt": "x"}).request)
        assert taken == ["arrive", "arrive", "cancel"] and len(seen) == len(got) + 1 + len(rest)
        assert bridge.in_flight == 0

    asyncio.run(scenario())


def test_a_reader_that_looks_late_takes_everything_published_meanwhile_as_one_group():
    """A stream writes a group at a time: behind the engine, it writes once for all the ids it missed."""

    async def scenario():
        bridge: EngineBridge[list] = EngineBridge()
        bridge.start(_scripted_engine)
        reader = bridge.submit(read(COMPLETION, {"prompt": [5, 6, 7]}).request)
        assert await anext(reader) == Accepted()
        await asyncio.sleep(0.2)  # the engine selects an id per 5 ms: all three and the end are published
        assert await reader.group() == [Selected(5), Selected(6), Selected(7), Ended({"status": "completed"})]
        assert await reader.group() == [] and [p async for p in reader] == []
        await bridge.stop()

    asyncio.run(scenario())


def test_an_engine_that_fails_ends_every_reader_and_refuses_what_comes_after():
    def failing(traffic: LiveTraffic):
        traffic.start(0)
        traffic.upcoming(wait=True)
        traffic.take()
        raise RuntimeError("device lost")

    async def scenario():
        bridge: EngineBridge[None] = EngineBridge()
        bridge.start(failing)
        reader = bridge.submit(read(COMPLETION, {"prompt": "x"}).request)
        (only,) = [p async for p in reader]
        assert isinstance(only, Failed) and "RuntimeError: device lost" in only.reason
        with pytest.raises(Closed, match="device lost"):
            bridge.submit(read(COMPLETION, {"prompt": "y"}).request)
        with pytest.raises(RuntimeError):
            await bridge.stop()

    asyncio.run(scenario())


def test_an_engine_that_fails_answers_500_stops_the_server_and_its_error_ends_the_run():
    from inference.http_endpoint import HttpServer, RequestEndpoint, bind

    def failing(traffic: LiveTraffic):
        traffic.start(0)
        traffic.upcoming(wait=True)
        traffic.take()
        raise RuntimeError("device lost")

    addresses: queue.Queue[str] = queue.Queue()
    server = HttpServer(RequestEndpoint(MODEL, failing, 1, 1), bind("127.0.0.1", 0), drain_seconds=5,
                        announce=addresses.put)  # fmt: skip
    ended: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except RuntimeError as error:
            ended.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    request = urllib.request.Request(f"{addresses.get(timeout=60)}/v1/completions", data=b'{"prompt": "hi"}')
    with pytest.raises(urllib.error.HTTPError) as answered:
        urllib.request.urlopen(request, timeout=60)
    assert answered.value.code == 500
    assert "RuntimeError: device lost" in json.loads(answered.value.read())["error"]["message"]
    thread.join(timeout=60)
    assert not thread.is_alive() and [str(e) for e in ended] == ["device lost"]
