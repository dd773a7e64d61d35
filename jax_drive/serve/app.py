"""``jax-drive serve``: the HTTP layer (FastAPI + uvicorn) over a ``PolicyServer``.

Endpoints (vLLM's paths and bodies):
  GET  /v1/models                  base model + loaded LoRA adapters (``owned_by: jax-drive``)
  POST /v1/completions             text or token-id prompts (one or many), n, seed, stop
                                   strings, stop_token_ids / ignore_eos, min_tokens, top_k,
                                   logprobs (0/1), logprobs_mode ('raw' | 'processed')
  POST /v1/chat/completions        chat template of the served tokenizer, same settings
  POST /v1/load_lora_adapter       {lora_name, lora_path, load_inplace} (PEFT directory)   admin
  POST /v1/unload_lora_adapter     {lora_name}                                             admin
  POST /update_weights_from_disk   {model_path}: reload the base weights from an HF        admin
                                   directory (SGLang's endpoint; for full fine-tuning)
  GET  /health                     200 when up; with the key (or on a server without one)
                                   also the batcher's counts and the weights' directory

With an API key every path but ``/health`` needs ``Authorization: Bearer KEY`` (401
otherwise); the admin endpoints need a key to exist at all (403 on a server without one)
and load only from the allowed directories (``PolicyServer``).

Every request is bounded (``ServeLimits``): the body is read up to ``max_body_bytes`` (413),
and the whole request (body, parsing, queue, generation) must end within
``request_timeout_s`` (408; its job is cancelled). A client that disconnects while its
request waits cancels the job too (its rows leave the running batch). Answers use OpenAI's
error layout: 400 for requests the server cannot honour, 401 / 403 / 404 / 408 / 413 / 429
as named above, 500 for internal failures with a generic message (the exception is logged,
never sent).

``stream=true`` (completions and chat) answers with server-sent events
(``EventStreamResponse``, ``streaming.StreamedAnswer``): every check above happens before
the stream starts and is a plain HTTP error; once it started, a time-out or failure ends it
with an error event, and a client that disconnects cancels its job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable

from jax_drive.serve.limits import ServeLimits, timeout_error
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from jax_drive.serve.errors import TOO_MANY_REQUESTS, InvalidRequest, error_body
from jax_drive.serve.protocol import validation_message
from jax_drive.serve.security import PUBLIC_PATHS, bearer_matches
from jax_drive.serve.server import PolicyServer
from jax_drive.serve.streaming import StreamedAnswer

log = logging.getLogger("jax_drive.serve")

CLIENT_CLOSED = 499  # nginx's status for "the client went away" (recorded, never received)
RETRY_AFTER_S = "1"
# POST path -> the PolicyServer method that answers its JSON body (through one request handler)
POST_ROUTES = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
    "/v1/load_lora_adapter": "load_lora",
    "/v1/unload_lora_adapter": "unload_lora",
    "/update_weights_from_disk": "update_weights",
}


class GuardMiddleware:
    """ASGI middleware: the API key check (all paths but ``PUBLIC_PATHS``) and a count of
    answers by status (``PolicyServer.status_counts``)."""

    def __init__(self, app, api_key: str | None, status_counts: Counter):
        self.app = app
        self.api_key = api_key
        self.status_counts = status_counts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.status_counts[int(message["status"])] += 1
            await send(message)

        if self.api_key is not None and scope["path"] not in PUBLIC_PATHS:
            headers = dict(scope.get("headers") or ())
            header = headers.get(b"authorization", b"").decode("latin-1")
            if not bearer_matches(header, self.api_key):
                return await _send_json(counting_send, 401, error_body(
                    "missing or incorrect API key: send 'Authorization: Bearer <key>'",
                    "invalid_request_error", code="invalid_api_key"),
                    [(b"www-authenticate", b"Bearer")])
        return await self.app(scope, receive, counting_send)


async def _send_json(send, status: int, body: dict, headers: list | None = None) -> None:
    payload = json.dumps(body).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())] + (headers or [])})
    await send({"type": "http.response.body", "body": payload})


class ClientGone(Exception):
    """The client closed the connection before its answer."""


async def read_body(request: Request, limits: ServeLimits) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed the limit (from
    Content-Length before reading, or while reading a chunked body).

    Raises:
      InvalidRequest: 413, or 400 for a malformed Content-Length.
      ClientGone: the client disconnected mid-body.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidRequest("malformed Content-Length header") from None
        limits.check_body(size)
    chunks, total = [], 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            limits.check_body(total)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


async def until_disconnect(receive) -> None:
    """Returns when the client disconnects (call only after the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def request_deadline(limits: ServeLimits) -> float | None:
    """When a request arriving now must be answered (``time.monotonic()``), or None."""
    timeout = limits.request_timeout_s
    return None if timeout is None else time.monotonic() + timeout


async def answer_request(request: Request, limits: ServeLimits, work: Callable[[bytes], Awaitable],
                         deadline: float | None = None):
    """Reads the body and runs ``work(body)`` before ``deadline`` (default: the request's time
    limit from now), cancelling it when the client disconnects or the time is up.

    Raises:
      InvalidRequest: from ``read_body`` or ``work``; 408 when time ran out.
      ClientGone: the client disconnected.
    """
    timeout = limits.request_timeout_s
    deadline = request_deadline(limits) if deadline is None else deadline

    def remaining() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    try:
        body = await asyncio.wait_for(read_body(request, limits), remaining())
    except asyncio.TimeoutError:
        raise timeout_error(timeout) from None
    task = asyncio.ensure_future(work(body))
    watcher = asyncio.ensure_future(until_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, timeout=remaining(), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()  # cancels the batcher job (PolicyServer.generate)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    if watcher.done() and not watcher.cancelled():
        raise ClientGone()
    raise timeout_error(timeout)


class EventStreamResponse(StreamingResponse):
    """A ``StreamedAnswer``'s events as ``text/event-stream``, sent while a watcher waits for
    the client to disconnect (whatever the ASGI version: a stream that waits for its next
    chunk sends nothing that could notice). A disconnect stops the stream and cancels its
    job; the answer is closed in every case."""

    def __init__(self, answer: StreamedAnswer, deadline: float | None, timeout_s: float | None):
        super().__init__(answer.events(deadline, timeout_s), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.answer = answer

    async def __call__(self, scope, receive, send):
        pump = asyncio.ensure_future(self.stream_response(send))
        watcher = asyncio.ensure_future(until_disconnect(receive))
        try:
            await asyncio.wait({pump, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watcher):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()
            self.answer.close()  # no-op when the stream finished; else the client is gone
        if pump.done() and not pump.cancelled() and pump.exception() is not None:
            log.warning("a streamed answer stopped: %r", pump.exception())  # e.g. the socket closed


def create_app(server: PolicyServer):
    """The FastAPI application over ``server``; the batcher and parse pool run while the
    app is up."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.start()
        try:
            yield
        finally:
            server.stop()

    app = FastAPI(title="jax-drive serve", lifespan=lifespan)
    app.add_middleware(GuardMiddleware, api_key=server.config.api_key, status_counts=server.status_counts)

    def refusal(error: InvalidRequest) -> JSONResponse:
        kind = "NotFoundError" if error.status == 404 else "invalid_request_error"
        headers = {"Retry-After": RETRY_AFTER_S} if error.status == TOO_MANY_REQUESTS else None
        return JSONResponse(error_body(str(error), kind, error.param, error.code),
                            status_code=error.status, headers=headers)

    def internal(error: BaseException) -> JSONResponse:
        incident = uuid.uuid4().hex[:12]
        log.error("internal error %s", incident, exc_info=error)
        return JSONResponse(error_body(f"internal server error (incident {incident}; the server "
                                       "log has the details)", "internal_server_error"), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError):
        return refusal(InvalidRequest(validation_message(error.errors())))

    @app.exception_handler(InvalidRequest)
    async def _invalid(request: Request, error: InvalidRequest):
        return refusal(error)

    @app.exception_handler(Exception)
    async def _internal(request: Request, error: Exception):
        return internal(error)

    async def handle(request: Request, work: Callable[[bytes], Awaitable]):
        deadline = request_deadline(server.limits)
        try:
            result = await answer_request(request, server.limits, work, deadline)
        except InvalidRequest as error:
            return refusal(error)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        except Exception as error:  # noqa: BLE001 - answered generically, logged in full
            return internal(error)
        if isinstance(result, StreamedAnswer):
            return EventStreamResponse(result, deadline, server.limits.request_timeout_s)
        return result

    @app.get("/health")
    async def health(request: Request):
        key = server.config.api_key
        detailed = key is None or bearer_matches(request.headers.get("authorization"), key)
        return server.health(detailed)

    @app.get("/v1/models")
    async def models():
        return server.models()

    def answered_by(method: str):
        async def endpoint(request: Request):
            return await handle(request, getattr(server, method))

        return endpoint

    for path, method in POST_ROUTES.items():
        app.add_api_route(path, answered_by(method), methods=["POST"], name=method)
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not listening yet: connections are refused until the
    server starts). Raises OSError when the address is taken or cannot be bound."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT only
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def run(server: PolicyServer, host: str = "127.0.0.1", port: int = 8000,
        log_level: str = "warning", sock: socket.socket | None = None) -> None:
    """Serves until interrupted (SIGINT / SIGTERM) on ``sock`` (from ``bind_socket``) or a
    socket bound here to host:port."""
    import uvicorn

    sock = sock if sock is not None else bind_socket(host, port)
    config = uvicorn.Config(create_app(server), host=host, port=port, log_level=log_level)
    uvicorn.Server(config).run(sockets=[sock])
