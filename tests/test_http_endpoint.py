"""`jgpt serve --http` end to end: one server process on a free loopback port, the real OpenAI client and raw
HTTP against it, then SIGTERM, and its recorded traffic replayed in kvsim.

The tests run in file order against the one server (each is whole on its own; the last stops the server).
The model is the suite's tiny random-weight one, so the ids it selects are arbitrary but exactly those
`jgpt generate` selects (its `generate`, run here in-process as the reference).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")

from conftest import tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MAX_ACTIVE, MAX_REQUESTS = 4, 24
SYSTEM = {
    "max_requests": MAX_REQUESTS, "max_new_tokens_cap": 100,
    "scheduling": {"max_active_requests": MAX_ACTIVE, "policy": "continuous_batching"},
    "kv_cache": {"device_kv_bytes": 2_000_000, "host_kv_bytes": 1_000_000, "retention_policy": "lru"},
    "transfer": {"link_bytes_per_us": 1000, "link_latency_us": 10},
    "compute_service": {"compute_flops_per_us": 2_000_000, "memory_bytes_per_us": 20_000},
}  # fmt: skip
LONG = 100  # a budget the tiny model runs to (its prompts are picked so), for requests that must still be running
STARTUP_S = 600  # loading and compiling every program on a loaded 2-core machine


COMPLETION_PROMPT = (72, 105, 33, 10, 65)
CHAT = [("system", "be brief"), ("user", "sort plum")]
CLIENT_PROMPTS = [tuple(range(50 + n, 58 + n)) for n in range(4)]  # the 64 clients'
CANDIDATES = [tuple(range(40 + 7 * n, 48 + 7 * n)) for n in range(16)]  # for prompts the model answers at length
SAMPLED_PROMPT, SAMPLING = (80, 81, 82, 83), {"temperature": 1.0, "top_k": 50, "seed": 5}


class Server:
    """The server process, its address and what it wrote on stderr."""

    def __init__(self, model: Path, system: Path, record: Path):
        self.record = record
        self.noted: dict[str, str] = {}  # what one test leaves for a later one to find in the record
        environment = {**os.environ, "PYTHONPATH": str(REPO)}
        command = [sys.executable, "-m", "jgpt", "serve", "--http", "--model", str(model), "--system", str(system),
                   "--port", "0", "--record", str(record), "--drain-seconds", "30"]  # fmt: skip
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environment, cwd=REPO)
        self.lines: list[str] = []
        self.listening = threading.Event()
        self.url = ""
        threading.Thread(target=self.read_stderr, daemon=True).start()

    def read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            if found := re.findall(r"listening on (http://\S+)", line):
                self.url = found[0]
                self.listening.set()

    def ready(self) -> Server:
        if not self.listening.wait(STARTUP_S):
            self.process.kill()
            raise AssertionError(f"the server did not start: {self.lines}")
        return self

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics").text
        return {name: float(value) for name, value in re.findall(r"^(\S+) (\S+)$", text, re.M)}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("model"), seed=3).path


@pytest.fixture(scope="module")
def launched(model, tmp_path_factory):
    """The server process, started first: it loads and compiles while the references are computed."""
    directory = tmp_path_factory.mktemp("server")
    (directory / "system.json").write_text(json.dumps(SYSTEM))
    running = Server(model, directory / "system.json", directory / "live.json")
    yield running
    if running.process.poll() is None:
        running.process.kill()


@pytest.fixture(scope="module")
def expected(model, launched):
    """The ids `jgpt generate` selects (its `generate`, with the CLI's request id) for every prompt the tests
    send: greedy ones at the longest budget, one batch (a shorter budget selects their first ids), and the
    sampled one. Also the tokenizer and the chat's framed prompt."""
    from inference.commands import _load
    from inference.generation import generate
    from inference.policy import GenerationPolicy, InferenceRequest
    from jgpt.tokenizers.tokenizer import Turn

    execution, tokenizer, _ = _load(str(model))
    chat = tokenizer.encode_turns([Turn(role, text) for role, text in CHAT], open_turn="assistant").ids
    prompts = [COMPLETION_PROMPT, chat, *CLIENT_PROMPTS, *CANDIDATES]
    greedy = [InferenceRequest("cli", prompt, GenerationPolicy(LONG)) for prompt in prompts]
    published = {p: r.published_ids for p, r in zip(prompts, generate(execution, greedy).responses)}
    sampled = InferenceRequest("cli", SAMPLED_PROMPT, GenerationPolicy(16, "sample", **SAMPLING))
    (draw,) = generate(execution, [sampled]).responses
    long = [prompt for prompt in CANDIDATES if len(published[prompt]) == LONG]
    assert len(long) >= MAX_ACTIVE + 1, "the tiny model ends its turn early on too many prompts"
    return {"greedy": published, "sampled": draw.published_ids, "long": long, "chat": chat, "tokenizer": tokenizer}


def selected(expected: dict, prompt, budget: int) -> list[int]:
    """The ids the reference publishes for `prompt` with `budget` (greedy: the first of its longest run)."""
    return list(expected["greedy"][tuple(prompt)][:budget])


@pytest.fixture(scope="module")
def server(launched, expected):
    return launched.ready()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_models_and_health(model, server, client):
    assert [m.id for m in client.models.list().data] == [str(model)]  # the --model it was started with
    health = httpx.get(f"{server.url}/health")
    assert (health.status_code, health.json()["status"]) == (200, "ok")


def test_greedy_ids_are_the_ids_jgpt_generate_selects_streamed_or_not(client, expected):
    tokenizer, name = expected["tokenizer"], client.models.list().data[0].id
    ids = selected(expected, COMPLETION_PROMPT, 12)
    whole = client.completions.create(model=name, prompt=list(COMPLETION_PROMPT), max_tokens=12, temperature=0)
    assert whole.choices[0].token_ids == ids and whole.choices[0].text == tokenizer.decode(ids).text
    assert whole.usage.completion_tokens == len(ids) + (len(ids) < 12)  # the end of the turn counts
    streamed = client.completions.create(
        model=name, prompt=list(COMPLETION_PROMPT), max_tokens=12, temperature=0, stream=True
    )
    assert [token for chunk in streamed for token in chunk.choices[0].token_ids] == ids

    messages = [{"role": role, "content": text} for role, text in CHAT]
    text = tokenizer.decode(selected(expected, expected["chat"], 10)).text
    chat = client.chat.completions.create(model=name, messages=messages, max_tokens=10, temperature=0)
    assert chat.choices[0].message.content == text and chat.usage.prompt_tokens == len(expected["chat"])
    chunks = list(
        client.chat.completions.create(
            model=name, messages=messages, max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(expected["chat"])


def test_a_prompt_that_continues_a_served_one_reuses_its_state_as_cached_tokens(client):
    name = client.models.list().data[0].id
    prompt = [60, 61, 62, 63, 64]
    first = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0)
    output = first.choices[0].token_ids
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # What the first request computed is retained (all but an id it selected last, unless that ended its turn).
    turn = client.completions.create(model=name, prompt=prompt + output + [65, 66], max_tokens=4, temperature=0)
    assert turn.usage.prompt_tokens_details.cached_tokens >= len(prompt) + len(output) - 1


def test_seeded_sampling_is_reproducible_per_seed_and_draws_what_jgpt_generate_draws(client, expected):
    name, sampling = client.models.list().data[0].id, dict(SAMPLING)

    def draw(seed: int) -> list[int]:
        extra = {"top_k": sampling["top_k"]}  # not an OpenAI field: the client passes it as is
        response = client.completions.create(
            model=name, prompt=list(SAMPLED_PROMPT), max_tokens=16, temperature=sampling["temperature"], seed=seed,
            extra_body=extra,
        )  # fmt: skip
        return response.choices[0].token_ids

    first, again, other = draw(sampling["seed"]), draw(sampling["seed"]), draw(sampling["seed"] + 1)
    assert first == again != other
    assert first == list(expected["sampled"])


def test_bad_requests_get_400_naming_the_field_never_a_traceback(server, client):
    name = client.models.list().data[0].id
    for arguments, field in (
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "top_p": 1.5}, "top_p"),
        ({"prompt": [1, 9999]}, "prompt[1]"),
        ({"prompt": "hi", "n": 3}, "n"),
        ({"prompt": "hi", "max_tokens": 120}, "max_tokens"),  # past the system's max_new_tokens_cap of 100
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=name, **arguments)
        assert refused.value.body["param"] == field, refused.value.body
        assert refused.value.body["message"].startswith(f"{field}: ")
    for body, status in ((b"{oops", 400), (b"[" * 100_000, 400), (b" " * (9 << 20), 413)):  # too deep, too large
        refused = httpx.post(f"{server.url}/v1/chat/completions", content=body)
        assert (refused.status_code, refused.json()["error"]["param"]) == (status, "body")


async def _stream(client, body: dict, started: asyncio.Event | None = None, leave: asyncio.Future | None = None):
    """Stream a completion: (status, ids, finish reason, response id). `started` is set at the first chunk;
    given `leave`, the client awaits it after its first chunk and, if it says True, goes away (closes its
    connection)."""
    ids, finish, response_id = [], None, None
    async with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, response, None, None
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            response_id = chunk["id"]
            ids += chunk["choices"][0]["token_ids"]
            finish = chunk["choices"][0]["finish_reason"] or finish
            if started is not None:
                started.set()
            if leave is not None and await leave:
                return "left", ids, None, response_id
            leave = None
    return 200, ids, finish, response_id


def test_a_client_that_leaves_mid_stream_cancels_its_request_and_its_slot_goes_to_the_next(server, expected):
    long_prompts = expected["long"]
    before = server.metrics()

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            body = lambda n: {"prompt": list(long_prompts[n]), "max_tokens": LONG, "temperature": 0}  # noqa: E731
            # One more than the slots, sent together: one waits, and sends nothing, until a slot is freed. The
            # first to start leaves as soon as the slots are full, long before any of them runs to its budget.
            clients = range(MAX_ACTIVE + 1)
            started = [asyncio.Event() for _ in clients]
            leave = [asyncio.get_running_loop().create_future() for _ in clients]
            streams = [asyncio.ensure_future(_stream(http, body(n), started[n], leave[n])) for n in clients]
            starts = {asyncio.ensure_future(started[n].wait()): n for n in clients}
            order, waiting = [], set(starts)
            while len(order) < MAX_ACTIVE:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                order += [starts[task] for task in done]
            for n in clients:
                leave[n].set_result(n == order[0])
            for task in waiting:
                task.cancel()
            (waiter,) = set(clients) - set(order)
            results = await asyncio.gather(*streams)
            return results[order[0]], results[waiter], [results[n] for n in order[1:]]

    (left, _, _, left_id), (status, ids, finish, waited_id), others = asyncio.run(scenario())
    assert left == "left" and status == 200 and finish == "length" and len(ids) == LONG
    assert all(o[0] == 200 and len(o[1]) == LONG for o in others)
    after = server.metrics()
    assert after["jgpt_client_disconnects_total"] == before["jgpt_client_disconnects_total"] + 1
    assert after['jgpt_requests_total{outcome="cancelled"}'] == before['jgpt_requests_total{outcome="cancelled"}'] + 1
    server.noted.update(left=left_id, waited=waited_id)  # the record (last test) shows the slot handed over


def test_more_requests_than_the_system_holds_get_429_with_retry_after(server, expected):
    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            body = {"prompt": list(expected["long"][0]), "max_tokens": LONG, "temperature": 0}
            return await asyncio.gather(*(_stream(http, body) for _ in range(MAX_REQUESTS + 8)))

    results = asyncio.run(scenario())
    refused = [r for r in results if r[0] == 429]
    assert refused and {r[0] for r in results} == {200, 429}
    assert all(
        r[1].headers["retry-after"] == "1" and r[1].json()["error"]["type"] == "rate_limit_error" for r in refused
    )
    served = [r for r in results if r[0] == 200]
    assert len(served) >= MAX_REQUESTS and all(len(r[1]) == LONG for r in served)
    print(f"\n429: {len(refused)} of {len(results)} refused with Retry-After 1, {len(served)} served whole")


def test_64_concurrent_streaming_clients_each_get_their_own_ids_retrying_after_429(server, expected):
    """More clients than the system holds (24): each refused one asks again after Retry-After, as a client
    should; every one ends with exactly its own ids, within a bound."""
    prompts, ids = CLIENT_PROMPTS, [selected(expected, prompt, 16) for prompt in CLIENT_PROMPTS]

    async def client(http, body: dict) -> tuple:
        for attempt in range(20):
            result = await _stream(http, body)
            if result[0] != 429:
                return result, attempt
            await asyncio.sleep(int(result[1].headers["retry-after"]))
        raise AssertionError("refused 20 times")

    async def scenario():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as http:
            bodies = [{"prompt": list(prompts[n % 4]), "max_tokens": 16, "temperature": 0} for n in range(64)]
            return await asyncio.gather(*(client(http, body) for body in bodies))

    started = time.monotonic()
    results = asyncio.run(scenario())
    wall = time.monotonic() - started
    assert len(results) == 64 and wall < 120
    assert all(r[0] == 200 and r[1] == ids[n % 4] for n, (r, _) in enumerate(results))  # none lost or crossed
    assert len({r[3] for r, _ in results}) == 64  # 64 distinct responses
    refusals = sum(attempts for _, attempts in results)
    print(f"\n64 clients: all served their exact ids in {wall:.2f} s; {refusals} 429s along the way")


def test_metrics_count_what_was_served(server, client):
    """The counters move by exactly what this test sends, whatever the server served before it (under xdist
    the file's tests are split between servers)."""
    name = client.models.list().data[0].id
    before = server.metrics()
    prompt = [70, 71, 72, 73, 74]
    first = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0)
    turn = prompt + first.choices[0].token_ids + [75]
    client.completions.create(model=name, prompt=turn, max_tokens=4, temperature=0)  # reuses the first's state
    with pytest.raises(openai.BadRequestError):  # past max_new_tokens_cap: the engine rejects it, a 400
        client.completions.create(model=name, prompt="hi", max_tokens=120)
    after = server.metrics()
    moved = {key: after[key] - before.get(key, 0) for key in after}
    ended = sum(moved.get(f'jgpt_requests_total{{outcome="{o}"}}', 0) for o in ("completed", "stopped", "cancelled"))
    assert ended == moved["jgpt_time_to_first_token_seconds_count"] == 2
    assert moved['jgpt_requests_total{outcome="rejected"}'] == 1
    assert moved['jgpt_http_responses_total{endpoint="/v1/completions",code="400"}'] == 1
    assert after["jgpt_requests_running"] == after["jgpt_requests_waiting"] == 0
    assert moved['jgpt_prefix_hits_total{tier="device"}'] >= 1 and after['jgpt_kv_bytes{tier="device"}'] > 0


def test_sigterm_drains_in_flight_requests_exits_0_and_the_record_replays_in_kvsim(server, expected):
    from kvsim.fidelity import compare, replay
    from kvsim.measured_run import load_measured_run

    prompt = expected["long"][1]

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            started = asyncio.Event()
            body = {"prompt": list(prompt), "max_tokens": LONG, "temperature": 0}
            stream = asyncio.ensure_future(_stream(http, body, started))
            await started.wait()
            server.process.send_signal(signal.SIGTERM)
            return await stream

    status, ids, finish, _ = asyncio.run(scenario())
    assert (status, ids, finish) == (200, selected(expected, prompt, LONG), "length")  # in flight: served whole
    assert server.process.wait(timeout=300) == 0, "".join(server.lines)
    run = load_measured_run(server.record, "record")
    outcomes = run.document["requests"]
    left, waited = outcomes[server.noted["left"]], outcomes[server.noted["waited"]]
    assert left["status"] == "cancelled" and left["selected_tokens"] < LONG
    assert waited["admitted_us"] == left["end_us"]  # the slot the cancel freed, taken at once
    print(f"\ndisconnect: {server.noted['left']} cancelled after {left['selected_tokens']} of {LONG} ids at "
          f"{left['end_us']} us ({left['stop_reason']}); {server.noted['waited']} admitted at {waited['admitted_us']} us")  # fmt: skip
    interaction = run.document["customer_interaction"]["actions"]
    assert {"kind": "cancel", "request_id": server.noted["left"]} in [
        {k: a[k] for k in ("kind", "request_id")} for a in interaction
    ]
    # kvsim's rules alone, each work taking the engine's measured time, reproduce every measured figure.
    assert all(row.exact or row.error in (0, None) for row in compare(run.document["totals"], replay(run)))
    predicted = subprocess.run(
        [sys.executable, "-m", "jgpt", "kvsim", "predict", str(server.record), "--json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    fields = {row["field"] for row in json.loads(predicted.stdout)}
    assert {"ttft.p50", "e2e.p90", "hit_rate_device", "token_hit_rate"} <= fields
