"""The aiohttp application: OpenAI's completions and chat endpoints over an ``AsyncEngine``.

Endpoints, as vLLM's OpenAI server has them: ``POST /v1/completions``,
``POST /v1/chat/completions`` (``stream`` true: server-sent events ``data: {...}`` ending
with ``data: [DONE]``, one chunk per generated token, the usage in a last chunk when
``stream_options.include_usage``; false: one JSON body), ``GET /v1/models``,
``GET /v1/models/{id}``, ``POST /tokenize``, ``POST /detokenize``, ``GET /version``,
``GET /health`` (503 when the engine loop stopped or a step has run ``stuck_step_s``),
``GET /metrics`` (Prometheus text, vLLM's metric names). A client that
disconnects aborts its request. Every error (400 bad input naming the field, 401 without the
API key, 404 unknown path or model, 405, 413, 503 when the queue is full) is an OpenAI error
object ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web

import slotune
from slotune.engine.engine import Engine
from slotune.engine.server.async_engine import AsyncEngine, EngineError
from slotune.engine.server.metrics import CONTENT_TYPE, ServerMetrics
from slotune.engine.server.protocol import (
    InvalidRequest,
    check_model,
    error_body,
    parse_detokenize,
    parse_request,
    parse_tokenize,
)
from slotune.engine.server.responses import Completion
from slotune.engine.server.served import ServedModel

logger = logging.getLogger(__name__)

ASYNC_ENGINE = web.AppKey("async_engine", AsyncEngine)
SERVED = web.AppKey("served", ServedModel)
METRICS = web.AppKey("metrics", ServerMetrics)
LIMITS = web.AppKey("limits", dict)
MAX_BODY_BYTES = 64 << 20  # token-id prompts of long contexts are large JSON
OFF_LOOP_BYTES = 32 << 10  # bodies larger than this are parsed and tokenized in a thread
RETRY_AFTER_S = 1
STUCK_STEP_S = 120.0  # /health fails while one engine step has run longer than this


def create_app(
    engine: Engine,
    served: ServedModel,
    *,
    api_key: str | None = None,
    max_queue: int | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    stuck_step_s: float = STUCK_STEP_S,
) -> web.Application:
    """An app whose startup starts the engine loop and whose cleanup stops it. Run it with
    ``handler_cancellation=True`` (as :func:`serve` does) so that a client leaving a
    non-streamed request also aborts it. ``api_key``: required as ``Authorization: Bearer``
    on ``/v1/*``; ``max_queue``: with that many requests waiting, new ones get a 503."""
    if max_queue is not None and max_queue < 0:
        raise ValueError(f"max_queue must be >= 0 (got {max_queue})")
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_errors, _auth])
    metrics = ServerMetrics(served.name)
    app[METRICS] = metrics
    app[ASYNC_ENGINE] = AsyncEngine(
        engine, pace=served.pace, metrics=metrics, request_delay_s=served.request_delay_s
    )
    app[SERVED] = served
    app[LIMITS] = {"api_key": api_key, "max_queue": max_queue, "stuck_step_s": stuck_step_s}
    app.on_startup.append(_start_engine)
    app.on_cleanup.append(_stop_engine)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model:.+}", _model)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_get("/version", _version)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


def serve(
    engine: Engine,
    served: ServedModel,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    max_queue: int | None = None,
    drain_timeout_s: float = 30.0,
) -> None:
    """Serve until interrupted. On SIGINT or SIGTERM the server stops accepting connections,
    lets the requests in flight finish for up to ``drain_timeout_s``, cancels the rest
    (aborting them) and returns."""
    web.run_app(
        create_app(engine, served, api_key=api_key, max_queue=max_queue),
        host=host,
        port=port,
        handler_cancellation=True,
        shutdown_timeout=drain_timeout_s,
        print=None,
        access_log=None,
    )


async def _start_engine(app: web.Application) -> None:
    app[ASYNC_ENGINE].start()


async def _stop_engine(app: web.Application) -> None:
    await app[ASYNC_ENGINE].stop()


# -- middlewares ---------------------------------------------------------------------------


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except InvalidRequest as exc:
        body = error_body(str(exc), exc.param, exc.code)
        return web.json_response(body, status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        type_ = "server_error" if exc.status >= 500 else "invalid_request_error"
        body = error_body(_http_message(exc), type_=type_)
        return web.json_response(body, status=exc.status, headers=_kept_headers(exc))
    except EngineError as exc:
        return web.json_response(error_body(str(exc), type_="server_error"), status=500)
    except Exception as exc:
        logger.exception("%s %s failed", request.method, request.path)
        message = f"internal error: {type(exc).__name__}: {exc}"
        return web.json_response(error_body(message, type_="server_error"), status=500)


def _http_message(exc: web.HTTPException) -> str:
    """The exception's text, unless it is aiohttp's default "404: Not Found"."""
    text = (exc.text or "").strip()
    return text if text and not text.startswith(f"{exc.status}:") else exc.reason


def _kept_headers(exc: web.HTTPException) -> dict[str, str]:
    return {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    key = request.app[LIMITS]["api_key"]
    given = request.headers.get("Authorization", "").encode()
    if (
        key is not None
        and request.path.startswith("/v1")
        and not hmac.compare_digest(given, f"Bearer {key}".encode())
    ):
        body = error_body("missing or wrong API key", code="invalid_api_key")
        return web.json_response(body, status=401)
    return await handler(request)


# -- small endpoints ---------------------------------------------------------------------------


def _card(served: ServedModel) -> dict[str, Any]:
    return {
        "id": served.name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "slotune",
        "root": served.name,
        "max_model_len": served.max_model_len,
    }


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_card(request.app[SERVED])]})


async def _model(request: web.Request) -> web.Response:
    served = request.app[SERVED]
    check_model(request.match_info["model"], served)
    return web.json_response(_card(served))


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": slotune.__version__})


async def _health(request: web.Request) -> web.Response:
    engine = request.app[ASYNC_ENGINE]
    if not engine.running:
        return web.json_response({"status": "engine loop stopped"}, status=503)
    running_s = engine.step_running_s
    if running_s > request.app[LIMITS]["stuck_step_s"]:
        status = f"engine step running for {running_s:.0f} s: stuck"
        return web.json_response({"status": status}, status=503)
    return web.json_response({"status": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _tokenize(request: web.Request) -> web.Response:
    served = request.app[SERVED]
    body, size = await _json(request)
    ids = await _off_loop(size, parse_tokenize, body, served)
    return web.json_response(
        {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids}
    )


async def _detokenize(request: web.Request) -> web.Response:
    served = request.app[SERVED]
    body, size = await _json(request)
    ids = parse_detokenize(body, served)
    text = await _off_loop(size, served.tokenizer.decode, ids)
    return web.json_response({"prompt": text})


# -- generation --------------------------------------------------------------------------------


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    served = request.app[SERVED]
    engine = request.app[ASYNC_ENGINE]
    _check_queue(request)
    body, size = await _json(request)
    gen = await _off_loop(size, parse_request, body, served, chat=chat)
    _check_queue(request)
    response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    synthetic_vocab = served.vocab_size if served.synthetic_logprobs else None
    completion = Completion(
        response_id, served.name, gen, served.tokenizer, synthetic_vocab=synthetic_vocab
    )
    outputs: asyncio.Queue[Any] = asyncio.Queue()
    try:
        for rid, ids in zip(completion.request_ids, gen.prompts, strict=True):
            try:
                await engine.add(rid, ids, gen.params, outputs)
            except ValueError as exc:
                message = str(exc).split("): ", 1)[-1]  # drop "add_request('<internal id>')"
                param = "n" if "SamplingParams.n" in message else ("messages" if chat else "prompt")
                raise InvalidRequest(message, param) from None
        if gen.stream:
            return await _stream(request, outputs, completion)
        while not completion.done:
            out = await outputs.get()
            if isinstance(out, EngineError):
                raise out
            completion.update(out)
            _abort_stopped(engine, completion)
        return web.json_response(completion.body())
    finally:
        for rid in completion.running_request_ids():  # all, if the client left
            engine.abort(rid, finished=completion.done)


def _abort_stopped(engine: AsyncEngine, completion: Completion) -> None:
    """Stop the engine requests whose every choice a stop string ended."""
    for rid in completion.take_stopped_request_ids():
        engine.abort(rid, finished=True)


def _check_queue(request: web.Request) -> None:
    limit = request.app[LIMITS]["max_queue"]
    if limit is not None and request.app[ASYNC_ENGINE].num_waiting >= limit:
        raise web.HTTPServiceUnavailable(
            text=f"the server's queue is full ({limit} requests waiting); retry later",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )


async def _stream(
    request: web.Request, outputs: asyncio.Queue[Any], completion: Completion
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    first = completion.gen.chat  # chat opens with the role, sent with the first token
    try:
        while not completion.done:
            out = await outputs.get()
            if isinstance(out, EngineError):
                await _send(resp, error_body(str(out), type_="server_error"))
                break
            chunk = completion.update(out)
            _abort_stopped(request.app[ASYNC_ENGINE], completion)
            if chunk is None:  # a choice that a stop string ended
                continue
            if first:
                await _send(resp, completion.role_chunk())
                first = False
            await _send(resp, chunk)
        else:
            if completion.gen.include_usage:
                await _send(resp, completion.usage_chunk())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:  # the client left; the caller aborts the request
        pass
    return resp


async def _send(resp: web.StreamResponse, data: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n")


async def _off_loop(body_bytes: int, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args)`` in a worker thread when the request body is large (tokenizing a long
    prompt would stall every stream), inline when it is small (a thread costs more)."""
    if body_bytes > OFF_LOOP_BYTES:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


async def _json(request: web.Request) -> tuple[Any, int]:
    """The body's JSON and its size in bytes."""
    raw = await request.read()
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(_loads, raw), len(raw)
    return _loads(raw), len(raw)


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and integers of more than 4300 digits
        message = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
        raise InvalidRequest(f"the request body is not valid JSON: {message}") from None
