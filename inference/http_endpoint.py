"""The HTTP server of the RequestEndpoint: the OpenAI API over the InferenceEngine's live loop (Starlette, uvicorn).

Routes: POST /v1/completions and /v1/chat/completions (whole, or streamed as server-sent events: one chunk
per published id or group of ids, then `data: [DONE]`), GET /v1/models, /health and /metrics (Prometheus
text). The engine runs on its own thread behind an EngineBridge (inference/live_traffic.py); this module only
reads requests, waits on publications and writes responses.

Semantics under load:
* the engine decides admission: a request it rejects because the system is full (max_requests) gets 429
  with Retry-After, one it could never serve (max_new_tokens_cap, a reservation past the device's KV
  bytes) 400 naming max_tokens; a malformed one 400 naming the field, before it reaches the engine;
* a client that goes away cancels its request in the engine (at its next step boundary; its slot is freed);
* SIGTERM or Ctrl-C stops accepting connections, lets the requests in flight finish for up to the drain
  bound, cancels what is left, stops the engine and returns its result (a second Ctrl-C quits at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar, cast

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from inference.live_traffic import Accepted, Closed, Ended, EngineBridge, Failed, LiveTraffic, Publications, Selected
from inference.request_endpoint import (
    CHAT,
    COMPLETION,
    DONE,
    EndpointRequest,
    PublishedText,
    ServedModel,
    chunk,
    error,
    event,
    finish_reason,
    read_request,
    refusal,
    response,
    usage_chunk,
)
from inference.serving_metrics import ServingMetrics
from jgpt.foundation.errors import ApiError

Result = TypeVar("Result")
RETRY_AFTER_S = 1  # a full system frees a slot as soon as one request ends: ask again soon
FULL = "max_requests"  # the engine's rejection reason when the system holds all the requests it may
PATHS = {COMPLETION: "/v1/completions", CHAT: "/v1/chat/completions"}
ID_PREFIXES = {COMPLETION: "cmpl", CHAT: "chatcmpl"}
# A request's JSON: ample for any prompt a context holds, as ids or text; nothing larger is read.
MAX_BODY_BYTES = 8 << 20


class BodyTooLarge(ApiError):
    """A request body past MAX_BODY_BYTES (413): refused before the rest of it is read."""


class RequestEndpoint(Generic[Result]):
    """The app's state: the model served, the bridge to the engine, the metrics, and the engine's result."""

    def __init__(self, model: ServedModel, serve: Callable[[LiveTraffic], Result], device_kv: int, host_kv: int):
        self.model, self.serve = model, serve
        self.metrics = ServingMetrics(lambda: self.bridge.traffic.gauges, device_kv, host_kv)
        self.bridge: EngineBridge[Result] = EngineBridge(self.metrics.observe, lambda: self.on_failure())
        self.numbers = itertools.count()
        # Seeds for requests that sample without one: fresh per request, as the API's are (no secret is made from
        # them, and a system call per request would hand the engine thread the GIL back and forth).
        self.seeds = random.Random()
        self.result: Result | None = None  # the engine's, once stopped
        self.error: BaseException | None = None  # or what it stopped with
        self.stopped = False
        self.on_failure: Callable[[], None] = lambda: None  # the server's: stop serving

    def app(self, on_ready: Callable[[], None] = lambda: None) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            self.bridge.start(self.serve)
            on_ready()
            yield
            try:
                self.result = await self.bridge.stop()
            except BaseException as error:  # the engine's own: the command ends with it once the server is down
                self.error = error
            self.stopped = True

        routes = [
            Route(PATHS[COMPLETION], functools.partial(self.complete, kind=COMPLETION), methods=["POST"]),
            Route(PATHS[CHAT], functools.partial(self.complete, kind=CHAT), methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.exposition, methods=["GET"]),
        ]
        return Starlette(routes=routes, lifespan=lifespan)

    # -- the plain routes ---------------------------------------------------

    async def models(self, request: Request) -> Response:
        return self.json("/v1/models", self.model.listing())

    async def health(self, request: Request) -> Response:
        bridge = self.bridge
        status = "failed" if bridge.failure else "draining" if bridge.closed else "ok"
        return self.json("/health", {"status": status, "in_flight": bridge.in_flight}, 200 if status == "ok" else 503)

    async def exposition(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    def json(self, path: str, document: Any, status: int = 200, headers: dict | None = None) -> Response:
        self.metrics.responded(path, status)
        return Response(orjson.dumps(document), status, headers, media_type="application/json")

    # -- completions ---------------------------------------------------------

    async def complete(self, request: Request, kind: str) -> Response:
        path = PATHS[kind]
        response_id = f"{ID_PREFIXES[kind]}-{next(self.numbers)}"
        try:
            body = await _json_body(request)
            call = read_request(kind, body, self.model, response_id, self.seeds.randrange(1 << 31))
        except BodyTooLarge as problem:
            return self.json(path, refusal(problem), 413)
        except ApiError as problem:
            return self.json(path, refusal(problem), 400)
        try:
            publications = self.bridge.submit(call.request)
        except Closed as problem:
            return self.json(path, error(str(problem), None, "server_error"), 503)
        first = await anext(publications)
        if isinstance(first, Failed):
            return self.json(path, error(first.reason, None, "server_error"), 500)
        if isinstance(first, Ended):
            return self.rejected(path, first.outcome)
        assert isinstance(first, Accepted), "the engine accepts or rejects a request before anything else"
        if call.stream:
            self.metrics.responded(path, 200)
            return StreamingResponse(
                self.chunks(call, publications), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        return await self.whole(request, path, call, publications)

    def rejected(self, path: str, outcome: dict) -> Response:
        reason = outcome["stop_reason"]
        if reason.startswith(FULL):
            message = f"the server is full ({reason}); retry after {RETRY_AFTER_S} s"
            return self.json(path, error(message, None, "rate_limit_error"), 429, {"Retry-After": str(RETRY_AFTER_S)})
        return self.json(path, error(f"max_tokens: {reason}", "max_tokens"), 400)

    async def whole(self, request: Request, path: str, call: EndpointRequest, publications) -> Response:
        """The non-streamed response, once the request has ended; a client gone meanwhile cancels it."""
        collected = asyncio.ensure_future(self.collect(call, publications))
        gone = asyncio.ensure_future(_disconnected(request))
        await asyncio.wait((collected, gone), return_when=asyncio.FIRST_COMPLETED)
        if not collected.done():
            collected.cancel()
            self.client_gone(call)
            return Response(status_code=499)  # nobody reads it
        gone.cancel()
        outcome, text, ids, stopped = collected.result()
        if outcome is None:
            return self.json(path, error(text, None, "server_error"), 500)
        document = response(
            call, self.model, call.request.request_id, text, ids, finish_reason(outcome, stopped), outcome
        )
        return self.json(path, document)

    async def collect(self, call: EndpointRequest, publications) -> tuple[dict | None, str, list[int], bool]:
        """(outcome, text, ids, stopped by a stop string), or (None, why) if the engine failed. Without stop
        strings the text is decoded once, at the end; with them, as each id comes, to cancel at the first."""
        published = PublishedText(self.model.tokenizer, self.model.turn_end_id, call.stop)
        pieces: list[str] = []
        ids: list[int] = []
        waiting: list[int] = []  # ids not decoded yet
        async for publication in publications:
            if isinstance(publication, Selected):
                waiting.append(publication.token_id)
                if call.stop and not published.stopped:
                    piece, new = published.extend(waiting)
                    pieces.append(piece)
                    ids += new
                    waiting = []
                    if published.stopped:
                        self.bridge.cancel(call.request.request_id)  # a stop string ends it: free its slot now
            elif isinstance(publication, Ended):
                piece, new = published.extend(waiting)
                rest, last = published.release(final=True)
                text = "".join([*pieces, piece, rest])
                return publication.outcome, text, ids + new + last, published.stopped
            elif isinstance(publication, Failed):
                return None, publication.reason, ids, False
        raise AssertionError("publications end with Ended or Failed")

    async def chunks(self, call: EndpointRequest, publications: Publications) -> AsyncIterator[bytes]:
        """The streamed response's events: one chunk per group of ids published since the last write (one id
        each while the loop keeps up), written at once with the events the group ends with (a chat's opening
        role chunk goes with its first text); leaving early (the client went away) cancels the request."""
        model, request_id = self.model, call.request.request_id
        published = PublishedText(model.tokenizer, model.turn_end_id, call.stop)
        events = [event(chunk(call, model, request_id, None, []))] if call.kind == CHAT else []
        ended = False
        try:
            while group := await publications.group():
                selected = [p.token_id for p in group if isinstance(p, Selected)]
                if selected:
                    piece, ids = self.text_of(published, selected, request_id)
                    if piece or ids:
                        events.append(event(chunk(call, model, request_id, piece, ids)))
                last = group[-1]
                if isinstance(last, Ended):
                    ended = True
                    events += self.last_events(call, published, last.outcome)
                elif isinstance(last, Failed):
                    ended = True
                    events += [event(error(last.reason, None, "server_error")), DONE]
                if events:
                    yield b"".join(events)
                    events = []
        finally:
            if not ended:
                self.client_gone(call)

    def text_of(self, published: PublishedText, selected: list[int], request_id: str) -> tuple[str, list[int]]:
        """The text and ids a group of selected ids releases: decoded together, or with stop strings one at a
        time, so the request is cancelled at the id that completes one (the ids after it are not given out)."""
        if not published.stop:
            return published.extend(selected)
        pieces, given = [], []
        for token_id in selected:
            stopped = published.stopped
            piece, ids = published.add(token_id)
            pieces.append(piece)
            given += ids
            if published.stopped and not stopped:
                self.bridge.cancel(request_id)
        return "".join(pieces), given

    def last_events(self, call: EndpointRequest, published: PublishedText, outcome: dict) -> list[bytes]:
        """A stream's end: the text still held back, the finish reason, the usage if asked, then [DONE]."""
        model, request_id = self.model, call.request.request_id
        piece, ids = published.release(final=True)
        events = [event(chunk(call, model, request_id, piece, ids))] if piece or ids else []
        events.append(event(chunk(call, model, request_id, "", [], finish_reason(outcome, published.stopped))))
        if call.include_usage:
            events.append(event(usage_chunk(call, model, request_id, outcome)))
        return [*events, DONE]

    def client_gone(self, call: EndpointRequest) -> None:
        self.metrics.disconnected()
        self.bridge.cancel(call.request.request_id)


async def _json_body(request: Request) -> Any:
    """The request's body as JSON, refused past MAX_BODY_BYTES (read no further) or when it is not JSON."""
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > MAX_BODY_BYTES:
            raise BodyTooLarge("body", f"is larger than {MAX_BODY_BYTES} bytes")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as problem:  # nested past 1024 levels too
        raise ApiError("body", f"not JSON ({problem})") from None


async def _disconnected(request: Request) -> None:
    """Returns when the client closes its connection (the body has been read: what comes next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Server(uvicorn.Server):
    """uvicorn's server, but a signal that stops it is the end of the command, not raised again afterwards: a
    SIGTERM drains the server and the command ends with 0, its record written."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket's address taken before the model loads, so a port in use is refused at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as problem:
        sock.close()
        raise ApiError("port", f"cannot listen on {host}:{port}: {problem.strerror or problem}") from None
    return sock


class HttpServer(Generic[Result]):
    """The endpoint served on a bound socket: `run` until SIGTERM or Ctrl-C (on the main thread) or `stop` (from any
    thread), then the engine's result, once the requests in flight have drained; or, when the engine failed, the
    server stops and `run` raises what the engine raised."""

    def __init__(
        self, endpoint: RequestEndpoint[Result], sock: socket.socket, *, drain_seconds: int,
        announce: Callable[[str], None],
    ):  # fmt: skip
        self.endpoint, self.sock, self.announce = endpoint, sock, announce
        endpoint.on_failure = self.stop  # an engine that failed serves nothing more: drain what is left and stop
        config = uvicorn.Config(
            endpoint.app(self.ready), log_level="warning", timeout_graceful_shutdown=drain_seconds, lifespan="on",
            access_log=False,
        )  # fmt: skip
        self.server = _Server(config)

    def ready(self) -> None:
        self.sock.listen(2048)
        host, port = self.sock.getsockname()[:2]
        self.announce(f"http://{host}:{port}")

    def run(self) -> Result:
        self.server.run(sockets=[self.sock])
        if self.server.force_exit or not self.endpoint.stopped:
            raise KeyboardInterrupt  # quit at once: nothing drained, nothing to write
        if self.endpoint.error is not None:
            raise self.endpoint.error
        return cast(Result, self.endpoint.result)

    def stop(self) -> None:
        """Drain and stop, as SIGTERM does."""
        self.server.should_exit = True


def print_announcement(address: str) -> None:
    print(f"listening on {address} (SIGTERM or Ctrl-C drains and stops)", file=sys.stderr, flush=True)
