"""Serving benchmark: the OpenAI API over HTTP against the same engine in-process, at request rates.

In the manner of vLLM's benchmark_serving. The requests are the built-in skill conversations
(bench/workloads.py's multi-turn chats: first turns, and later turns that share the earlier ones as a
prefix), greedy, as chat completions of at most --max-tokens ids; the model answers them in a few ids, so
each request's fixed cost weighs. With --decode they are instead completions of prompts the model continues
for the whole budget (mostly decode). They arrive as a Poisson process at each of --rates (requests per
second, the same seeded draw of gaps scaled), then all at once (saturated).

Each workload is served twice in the same run by the same compiled live engine (`jgpt serve --http`'s, the
shipped chat model under one system): through HTTP (the server in this process, as the command runs it;
the clients in a child process, each streaming its request over a connection of its own on loopback) and
in-process (the same request bodies read by the same RequestEndpoint contract and submitted to the engine's
bridge directly, at the same times). Both measure at the client: TTFT from sending to the first published
id, TPOT the mean gap between published ids after it, E2E to the end of the response; throughput is
published ids per second from the first send to the last end. Each also reads the CPU clocks of the event
loop's thread and the engine's thread: their CPU per streamed id is robust where the machine is shared,
and the loop's says what HTTP costs it. The HTTP layer's cost is printed after each rate's table: the
throughput ratio HTTP/in-process, the TTFT p50 difference and the loop CPU per id difference. Every run
starts from an empty KV pool. The two ways alternate --repeats times and each figure is the median over its
runs: the machine is shared, so expect noise and compare within a run.

The cases (the goal: HTTP costs at most 10% of throughput at saturation and at most 2 ms of TTFT p50):

    python bench/serving.py                                      chats at 10 and 40 req/s, then saturated
    python bench/serving.py --decode --max-tokens 64 --rates 4   decode-heavy at 4 req/s, then saturated
    python bench/serving.py --decode --max-tokens 64 --rates     decode-heavy, saturated only
    python bench/serving.py --repeats 5 --rates 10 40            more runs per median on a noisy machine
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and `kvsim` would name bench/kvsim.py.
_HERE, _ROOT = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent
sys.path[:] = [str(_ROOT), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from bench.result import BenchRun, add_results_argument  # noqa: E402
from bench.workloads import chat_workload, system  # noqa: E402

PATHS = {"messages": "/v1/chat/completions", "prompt": "/v1/completions"}  # by the body's input field


def bodies(requests: int, max_tokens: int) -> list[dict]:
    """The chat completion bodies: the chats' requests in their workload's order (turn after earlier turn)."""
    document = chat_workload(conversations=max(1, requests // 4), turns=4, max_new_tokens=max_tokens)
    chats = [entry["request"]["turns"] for entry in document["requests"]][:requests]
    return [
        {"messages": [{"role": t["role"], "content": t["text"]} for t in turns], "max_tokens": max_tokens,
         "temperature": 0, "stream": True}
        for turns in chats
    ]  # fmt: skip


def decode_bodies(execution, requests: int, max_tokens: int) -> list[dict]:
    """Completions of random printable prompts the model continues for the whole budget (bench/engine.py's
    `babbling`): mostly decode, where a request's fixed cost is spread over many ids."""
    from bench.engine import babbling

    return [
        {"prompt": list(r.prompt_ids), "max_tokens": max_tokens, "temperature": 0, "stream": True}
        for r in babbling(execution, requests)
    ]


def arrival_times(count: int, rate: float | None, seed: int = 0) -> list[float]:
    """Seconds after the start: a Poisson process at `rate` per second (None: all at once)."""
    if rate is None:
        return [0.0] * count
    draws = random.Random(f"jgpt-bench-serving/{seed}")
    times, at = [], 0.0
    for _ in range(count):
        times.append(at)
        at += draws.expovariate(rate)
    return times


# -- the two ways in ------------------------------------------------------------------------------------------


def thread_cpu_s(thread: threading.Thread | None) -> float:
    """The CPU time a running thread has used, in seconds."""
    assert thread is not None and thread.ident is not None, "a started thread"
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def over_http(model, engine, system_config, requests: list[dict], times: list[float]) -> tuple[list[dict], dict]:
    """Serve with the HTTP server in this process; the clients run in a child process. Also the CPU seconds the
    server's event loop and the engine's thread used while the clients ran, and the clients' own."""
    from inference.http_endpoint import HttpServer, RequestEndpoint, bind

    kv = system_config.kv_cache
    endpoint = RequestEndpoint(model, engine.serve, kv.device_kv_bytes, kv.host_kv_bytes)
    addresses: queue.Queue[str] = queue.Queue()
    server = HttpServer(endpoint, bind("127.0.0.1", 0), drain_seconds=60, announce=addresses.put)
    thread = threading.Thread(target=server.run, name="http-server")
    thread.start()
    try:
        address = addresses.get(timeout=120)
        threads = {"loop": thread, "engine": endpoint.bridge.thread}
        before = {name: thread_cpu_s(t) for name, t in threads.items()}
        child = subprocess.run(
            [sys.executable, __file__, "--client", address], input=json.dumps({"bodies": requests, "times": times}),
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        cpu = {name: thread_cpu_s(t) - before[name] for name, t in threads.items()}
    finally:
        server.stop()
        thread.join()
    served = json.loads(child.stdout)
    return served["results"], cpu | {"client": served["cpu_s"]}


def in_process(model, engine, requests: list[dict], times: list[float]) -> tuple[list[dict], dict]:
    """Submit the same requests to the engine's bridge directly, at the same times (the loop on this thread).
    Also the CPU seconds the loop and the engine's thread used meanwhile."""
    from inference.live_traffic import Ended, EngineBridge, Selected
    from inference.request_endpoint import CHAT, COMPLETION, read_request

    cpu: dict[str, float] = {}

    async def scenario() -> list[dict]:
        bridge = EngineBridge()
        bridge.start(engine.serve)
        threads = {"loop": threading.current_thread(), "engine": bridge.thread}
        before = {name: thread_cpu_s(t) for name, t in threads.items()}
        start = time.perf_counter()

        async def one(number: int) -> dict:
            await asyncio.sleep(max(0.0, start + times[number] - time.perf_counter()))
            sent = time.perf_counter()
            kind = CHAT if "messages" in requests[number] else COMPLETION
            call = read_request(kind, requests[number], model, f"request-{number}", 0)
            stamps: list[float] = []
            async for publication in bridge.submit(call.request):
                if isinstance(publication, Selected) and publication.token_id != model.turn_end_id:
                    stamps.append(time.perf_counter())
                elif isinstance(publication, Ended):
                    ended = time.perf_counter()
            return {"status": 200, "sent": sent - start, "stamps": [s - start for s in stamps], "end": ended - start}

        results = await asyncio.gather(*(one(n) for n in range(len(requests))))
        cpu.update({name: thread_cpu_s(t) - before[name] for name, t in threads.items()})
        await bridge.stop()
        return list(results)

    return asyncio.run(scenario()), cpu


def client(address: str) -> None:
    """The child process: stream each request at its time over a connection of its own (plain asyncio streams,
    so the client's own cost stays small); print each one's timings as JSON."""
    host, port = address.removeprefix("http://").rsplit(":", 1)
    job = json.load(sys.stdin)
    requests, times = job["bodies"], job["times"]

    async def one(number: int, start: float) -> dict:
        await asyncio.sleep(max(0.0, start + times[number] - time.perf_counter()))
        sent, stamps = time.perf_counter(), []
        body = json.dumps(requests[number]).encode()
        path = next(PATHS[field] for field in PATHS if field in requests[number])
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head.encode() + body)
        status = int((await reader.readline()).split()[1])
        # The chunked body, read as it comes: chunk sizes, and each event's `data: {...}` line, whose ids are
        # counted where its last key, token_ids, lists them (a JSON string holds no unescaped quote, so the
        # text cannot imitate the key): on a small machine the client shares the server's cores.
        unread = b""
        while data := await reader.read(1 << 16):
            now = time.perf_counter() - start
            *lines, unread = (unread + data).split(b"\n")
            for line in lines:
                if line.startswith(b"data: {") and (at := line.rfind(b'"token_ids":[')) >= 0:
                    ids = line[at + len(b'"token_ids":[') : line.index(b"]", at)]
                    stamps += [now] * (ids.count(b",") + 1 if ids else 0)
        writer.close()
        return {"status": status, "sent": sent - start, "stamps": stamps, "end": time.perf_counter() - start}

    async def scenario() -> list[dict]:
        start = time.perf_counter()
        return list(await asyncio.gather(*(one(n, start) for n in range(len(requests)))))

    started = time.process_time()
    results = asyncio.run(scenario())
    print(json.dumps({"results": results, "cpu_s": time.process_time() - started}))


# -- figures ----------------------------------------------------------------------------------------------------


def figures(results: list[dict], cpu: dict[str, float]) -> dict:
    """Throughput and latency percentiles of one run, measured at the client; the CPU the event loop, the
    engine's thread and (over HTTP) the client process used per streamed id."""
    served = [r for r in results if r["status"] == 200 and r["stamps"]]
    ttft = [(r["stamps"][0] - r["sent"]) * 1e3 for r in served]
    tpot = [(r["stamps"][-1] - r["stamps"][0]) * 1e3 / (len(r["stamps"]) - 1) for r in served if len(r["stamps"]) > 1]
    e2e = [(r["end"] - r["sent"]) * 1e3 for r in served]
    span = max(r["end"] for r in results) - min(r["sent"] for r in results)
    tokens = sum(len(r["stamps"]) for r in served)
    return {
        "served_count": len(served), "tokens_count": tokens, "span_s": round(span, 3),
        "tokens_per_s": round(tokens / span, 1), "requests_per_s": round(len(served) / span, 2),
        **{f"{name}_p{p}_ms": _percentile(values, p) for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))
           for p in (50, 90)},
        "loop_cpu_per_id_us": round(cpu["loop"] * 1e6 / tokens, 1),
        "engine_cpu_per_id_us": round(cpu["engine"] * 1e6 / tokens, 1),
        "client_cpu_per_id_us": round(cpu["client"] * 1e6 / tokens, 1) if "client" in cpu else None,
    }  # fmt: skip


def medians(runs: list[dict]) -> dict:
    """Each figure's median over repeated runs."""
    return {key: _median([run[key] for run in runs]) for key in runs[0]}


def _median(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def _percentile(values: list[float], p: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 2)
    return round(statistics.quantiles(values, n=100, method="inclusive")[p - 1], 2)


def cost(rows: dict[str, dict]) -> dict:
    """The HTTP layer's cost: throughput as a ratio, TTFT p50 and the loop's CPU per id as differences."""
    http, local = rows["HTTP"], rows["in-process"]
    ttft = None if None in (http["ttft_p50_ms"], local["ttft_p50_ms"]) else http["ttft_p50_ms"] - local["ttft_p50_ms"]
    return {"throughput_x": round(http["tokens_per_s"] / local["tokens_per_s"], 3),
            "ttft_p50_added_ms": None if ttft is None else round(ttft, 2),
            "loop_cpu_per_id_added_us": round(http["loop_cpu_per_id_us"] - local["loop_cpu_per_id_us"], 1)}  # fmt: skip


def table(label: str, rows: dict[str, dict]) -> str:
    head = (
        f"{label}\n  {'':<11}{'tok/s':>8}{'req/s':>7}  "
        + "  ".join(f"{n} p50/p90 ms".rjust(19) for n in ("TTFT", "TPOT", "E2E"))
        + f"{'loop/engine CPU us/id':>23}"
    )
    lines = [head]
    for mode in ("in-process", "HTTP"):
        f = rows[mode]
        pairs = "  ".join(f"{_ms(f[f'{n}_p50_ms'])}/{_ms(f[f'{n}_p90_ms'])}".rjust(19) for n in ("ttft", "tpot", "e2e"))
        cpu = f"{f['loop_cpu_per_id_us']:.0f}/{f['engine_cpu_per_id_us']:.0f}"
        lines.append(f"  {mode:<11}{f['tokens_per_s']:>8}{f['requests_per_s']:>7}  {pairs}{cpu:>23}")
    added, paid = rows["HTTP cost"]["ttft_p50_added_ms"], rows["HTTP cost"]["loop_cpu_per_id_added_us"]
    lines.append(f"  HTTP/in-process throughput {rows['HTTP cost']['throughput_x']:.3f}; TTFT p50 "
                 f"{'-' if added is None else f'{added:+.2f} ms'}; loop CPU per id {paid:+.0f} us (the clients' "
                 f"own: {rows['HTTP']['client_cpu_per_id_us']:.0f} us)")  # fmt: skip
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--rates", type=float, nargs="*", default=[10.0, 40.0],
        help="requests per second, each a Poisson run before the saturated one (none: saturated only)",
    )  # fmt: skip
    parser.add_argument("--requests", type=int, default=64, help="requests per run")
    parser.add_argument("--max-tokens", type=int, default=24, help="each request's budget")
    parser.add_argument("--max-active", type=int, default=8, help="the system's max_active_requests")
    parser.add_argument(
        "--decode", action="store_true", help="completions the model continues for the whole budget, not the chats"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way in, alternating; medians shown")
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)  # the child process
    add_results_argument(parser)
    args = parser.parse_args()
    if args.client:
        client(args.client)
        return
    run = BenchRun.start("serving-decode" if args.decode else "serving", __doc__)
    model, engine, config, execution = _engine(args.max_active)
    if args.decode:
        requests = decode_bodies(execution, args.requests, args.max_tokens)
    else:
        requests = bodies(args.requests, args.max_tokens)
    results = {}
    for rate in [*args.rates, None]:
        times = arrival_times(len(requests), rate)
        runs: dict[str, list[dict]] = {"in-process": [], "HTTP": []}
        for _ in range(args.repeats):  # alternating, so the machine's drift falls on both
            runs["in-process"].append(figures(*in_process(model, engine.live(), requests, times)))
            runs["HTTP"].append(figures(*over_http(model, engine.live(), config, requests, times)))
        rows = {mode: medians(figured) for mode, figured in runs.items()}
        rows["HTTP cost"] = cost(rows)
        label = f"{'saturated' if rate is None else f'{rate:g} req/s'}, {len(requests)} requests"
        results[label] = rows
        print(table(f"{label} ({args.max_tokens} ids at most; medians of {args.repeats} runs)", rows), flush=True)
    run.write(results, args.results, note=f"medians of {args.repeats} alternating runs; chat model, "
              f"max_active_requests {args.max_active}; measured at the client")  # fmt: skip


def _engine(max_active: int):
    """The shipped chat model's live engine under a system that rejects nothing these runs send, compiled."""
    from inference.engine import InferenceEngine
    from inference.execution import ModelExecution
    from inference.request_endpoint import ServedModel
    from jgpt.artifacts.catalog import load_model, read_catalog
    from kvsim import parse_system

    name = read_catalog().default_id()
    artifact = load_model(name)
    tokenizer = artifact.tokenizer()
    execution = ModelExecution.from_artifact(artifact, tokenizer)
    config = parse_system(system("continuous_batching", max_active, 16 << 20, 16 << 20))
    a = execution.architecture
    model = ServedModel(name, tokenizer, a.vocabulary, a.context, execution.turn_end_id, config.max_new_tokens_cap, 0)
    started = time.perf_counter()
    engine = InferenceEngine(execution, config)
    engine.live()
    print(f"compiled the live engine in {time.perf_counter() - started:.1f} s", flush=True)
    return model, engine, config, execution


if __name__ == "__main__":
    main()
