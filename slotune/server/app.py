"""The aiohttp application: OpenAI's completions and chat endpoints over an ``AsyncEngine``.

Endpoints, as vLLM's OpenAI server has them: ``POST /v1/completions``,
``POST /v1/chat/completions`` (``stream`` true: server-sent events ``data: {...}`` ending
with ``data: [DONE]``, one chunk per generated token, the usage in a last chunk when
``stream_options.include_usage``; false: one JSON body), ``GET /v1/models``,
``GET /v1/models/{id}``, ``POST /tokenize``, ``POST /detokenize``, ``GET /version``,
``GET /health`` (503 when the engine loop stopped or a step has run ``stuck_step_s``),
``GET /metrics`` (Prometheus text, vLLM's metric names), ``POST /reset_prefix_cache``
(vLLM's development endpoint: the prefix cache dropped, so that a benchmark's next run
starts cold; 409 while requests are served; behind the API key when one is set). A client that
disconnects aborts its request. Every error (400 bad input naming the field, 401 without the
API key, 404 unknown path or model, 405, 408 a body too slow to arrive, 413, 415 an unknown
``Content-Encoding``, 503 when the queue is full) is an OpenAI error object
``{"error": {"message", "type", "param", "code"}}``, those aiohttp's HTTP parser answers
before any handler runs included (a malformed request line or header, a duplicate or
negative ``Content-Length``, a NUL in the path: a 400 that closes the connection;
``http_errors.Runner``).

Bounds against hostile clients: headers must arrive within ``KEEPALIVE_S`` of the
connection opening (aiohttp's keep-alive timer closes it), a body within ``body_read_s``;
``Expect: 100-continue`` is answered 413 (or 401) before "100 Continue" when the body could
not be accepted; ``--max-queue`` counts engine sequences (prompts x ``n``); the other
sizes are bounded in ``protocol``. On shutdown, ``drain.Drain`` keeps the drain timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import signal
import time
import uuid
import zlib
from typing import Any

from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestPayloadError

from slotune._version import __version__
from slotune.engine.engine import Engine
from slotune.server.async_engine import AsyncEngine, EngineError
from slotune.server.drain import CUT_GRACE_S, Drain, ShuttingDown
from slotune.server.http_errors import Runner
from slotune.server.memory import keep_large_blocks_mapped
from slotune.server.metrics import CONTENT_TYPE, ServerMetrics
from slotune.server.protocol import (
    InvalidRequest,
    check_model,
    error_body,
    error_type,
    parse_detokenize,
    parse_request,
    parse_tokenize,
)
from slotune.server.responses import Completion
from slotune.server.served import ServedModel

logger = logging.getLogger(__name__)

ASYNC_ENGINE = web.AppKey("async_engine", AsyncEngine)
SERVED = web.AppKey("served", ServedModel)
METRICS = web.AppKey("metrics", ServerMetrics)
LIMITS = web.AppKey("limits", dict)
DRAIN = web.AppKey("drain", Drain)
MAX_BODY_BYTES = 64 << 20  # token-id prompts of long contexts are large JSON
OFF_LOOP_BYTES = 32 << 10  # bodies larger than this are parsed and tokenized in a thread
RETRY_AFTER_S = 1
STUCK_STEP_S = 120.0  # /health fails while one engine step has run longer than this
BODY_READ_S = 30.0  # the whole body must arrive within this (slow clients hold a worker)
DETOKENIZE_BYTES_PER_TOKEN = 16  # a token id and its separator in JSON, with room to spare
KEEPALIVE_S = 10.0  # idle connections, and headers not complete, close after this
CONTENT_ENCODINGS = ("gzip", "deflate", "identity")  # bodies the server decompresses


def runner_options() -> dict[str, Any]:
    """aiohttp ``AppRunner`` options, which :func:`create_app`'s app needs: handlers
    cancelled when their client leaves, a short keep-alive (it also bounds the time to send
    headers), only a short grace of aiohttp's own on shutdown (``Drain`` keeps the drain
    timeout), and bodies left compressed (the handlers decompress them, within the body
    limit, and answer an unknown encoding with a 415 rather than aiohttp's plain 400)."""
    return {
        "handler_cancellation": True,
        "keepalive_timeout": KEEPALIVE_S,
        "shutdown_timeout": CUT_GRACE_S,
        "auto_decompress": False,
    }


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The runner :func:`create_app`'s app needs: :func:`runner_options`, and the errors
    aiohttp answers itself as OpenAI errors. ``kwargs``: more ``AppRunner`` options.

    An aiohttp whose internals changed still serves: its own plain-text parser errors
    then, with a warning, rather than no server at all."""
    try:
        return Runner(app, **runner_options(), **kwargs)
    except RuntimeError as exc:
        logging.getLogger(__name__).warning("%s: parser errors stay plain text", exc)
        return web.AppRunner(app, **runner_options(), **kwargs)


def create_app(
    engine: Engine,
    served: ServedModel,
    *,
    api_key: str | None = None,
    max_queue: int | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    stuck_step_s: float = STUCK_STEP_S,
    body_read_s: float = BODY_READ_S,
    drain_timeout_s: float = 30.0,
) -> web.Application:
    """An app whose startup starts the engine loop and whose cleanup stops it. Run it with
    :func:`make_runner` (as :func:`serve` does) so that a client leaving a non-streamed
    request also aborts it. ``api_key``: required as ``Authorization: Bearer``
    on ``/v1/*``; ``max_queue``: while the engine sequences waiting (prompts x ``n``) and a
    request's own would pass it, the request gets a 503; ``drain_timeout_s``: on shutdown,
    how long requests in flight may run before they are cut (0: cut at once)."""
    if max_queue is not None and max_queue < 0:
        raise ValueError(f"max_queue must be >= 0 (got {max_queue})")
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_errors, _auth])
    metrics = ServerMetrics(served.name)
    app[METRICS] = metrics
    app[ASYNC_ENGINE] = AsyncEngine(engine, pace=served.pace, metrics=metrics)
    app[SERVED] = served
    app[DRAIN] = Drain(drain_timeout_s)
    app[LIMITS] = {
        "api_key": api_key,
        "max_queue": max_queue,
        "stuck_step_s": stuck_step_s,
        "body_read_s": body_read_s,
    }
    app.on_startup.append(_start_engine)
    app.on_shutdown.append(_drain)
    app.on_cleanup.append(_stop_engine)
    post = {"expect_handler": _expect}
    app.router.add_post("/v1/completions", _completions, **post)
    app.router.add_post("/v1/chat/completions", _chat_completions, **post)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model:.+}", _model)
    app.router.add_post("/tokenize", _tokenize, **post)
    app.router.add_post("/detokenize", _detokenize, **post)
    app.router.add_get("/version", _version)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/reset_prefix_cache", _reset_prefix_cache)
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
    lets the requests in flight finish for up to ``drain_timeout_s`` (0: none), cuts the
    rest (a stream ends with an error event and ``[DONE]``; aborting them) and returns. A
    second signal stops at once."""
    app = create_app(
        engine, served, api_key=api_key, max_queue=max_queue, drain_timeout_s=drain_timeout_s
    )
    keep_large_blocks_mapped()
    asyncio.run(_serve_until_signal(app, host, port))


async def _serve_until_signal(app: web.Application, host: str, port: int) -> None:
    # web.run_app would build a plain AppRunner: this is its loop, with make_runner's
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    stopping = asyncio.Event()

    def on_signal() -> None:
        if stopping.is_set() and main is not None:
            main.cancel()  # the second signal: no drain
        stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    runner = make_runner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        await stopping.wait()
    finally:
        with contextlib.suppress(asyncio.CancelledError):  # the second signal
            await runner.cleanup()


async def _start_engine(app: web.Application) -> None:
    app[ASYNC_ENGINE].start()


async def _stop_engine(app: web.Application) -> None:
    await app[ASYNC_ENGINE].stop()


async def _drain(app: web.Application) -> None:
    await app[DRAIN].run()


async def _expect(request: web.Request) -> web.Response | None:
    """``Expect: 100-continue``: refuse, before the client sends it, a body too large or a
    request without the API key; else tell the client to go on."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if expect.lower() != "100-continue":
        body = error_body(f"unsupported Expect: {expect[:100]!r}")
        return web.json_response(body, status=417)
    size = request.content_length
    limit = request.client_max_size
    if size is not None and size > limit:
        message = f"the request body is {size} bytes, more than this server's {limit}"
        return web.json_response(error_body(message), status=413)
    if not _authorized(request):
        return _unauthorized()
    if request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response proper has not started
    return None


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
        body = error_body(_http_message(exc), type_=error_type(exc.status))
        return web.json_response(body, status=exc.status, headers=_kept_headers(exc))
    except ShuttingDown as exc:
        body = error_body(str(exc), type_="server_error")
        return web.json_response(body, status=503)
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
    if not _authorized(request):
        return _unauthorized()
    return await handler(request)


def _authorized(request: web.Request) -> bool:
    key = request.app[LIMITS]["api_key"]
    if key is None or not request.path.startswith(("/v1", "/reset_prefix_cache")):
        return True
    # header bytes that are not UTF-8 come as surrogate escapes: compare the raw bytes
    given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, f"Bearer {key}".encode())


def _unauthorized() -> web.Response:
    body = error_body("missing or wrong API key", code="invalid_api_key")
    return web.json_response(body, status=401)


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
    return web.json_response({"version": __version__})


async def _health(request: web.Request) -> web.Response:
    engine = request.app[ASYNC_ENGINE]
    if not engine.running:
        return web.json_response({"status": "engine loop stopped"}, status=503)
    running_s = engine.step_running_s
    if running_s > request.app[LIMITS]["stuck_step_s"]:
        status = f"engine step running for {running_s:.0f} s: stuck"
        return web.json_response({"status": status}, status=503)
    return web.json_response({"status": "ok"})


async def _reset_prefix_cache(request: web.Request) -> web.Response:
    try:
        reset = await request.app[ASYNC_ENGINE].reset_prefix_cache()
    except EngineError as exc:
        return web.json_response(error_body(str(exc), type_="server_error"), status=503)
    if not reset:
        message = "requests are being served: the prefix cache is reset only when idle"
        return web.json_response(error_body(message, code="engine_busy"), status=409)
    return web.json_response({"reset": True})


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
    # bytes enough for max_model_len token ids: parsing a larger list would hold the GIL
    limit = served.max_model_len * DETOKENIZE_BYTES_PER_TOKEN + OFF_LOOP_BYTES
    body, size = await _json(request, limit)
    ids = await _off_loop(size, parse_detokenize, body, served)
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
    loop = asyncio.get_running_loop()
    # a simulated stack's per-request latency (HTTP, tokenizer) covers this handler's own
    entered = loop.time() + served.request_delay_s
    _check_queue(request, 0)
    body, size = await _json(request)
    gen = await _off_loop(size, parse_request, body, served, chat=chat)
    if (left := entered - loop.time()) > 0:
        await asyncio.sleep(left)
    if gen.priority and engine.engine.config.scheduling_policy != "priority":
        raise InvalidRequest(  # as vLLM answers under fcfs
            f"Got priority {gen.priority} but priority scheduling is not enabled "
            "(serve with --scheduling-policy priority)",
            "priority",
        )
    batch = len(gen.prompts)
    _check_queue(request, batch * gen.params.n, "prompt" if batch > 1 else "n")
    response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    synthetic_vocab = served.vocab_size if served.synthetic_logprobs else None
    completion = Completion(
        response_id, served.name, gen, served.tokenizer, synthetic_vocab=synthetic_vocab
    )
    outputs: asyncio.Queue[Any] = asyncio.Queue()
    # every prompt handed in at once, with no await since the queue check
    admissions = [
        engine.submit(rid, ids, gen.params, outputs, gen.priority, entered_at=entered)
        for rid, ids in zip(completion.request_ids, gen.prompts, strict=True)
    ]
    try:
        with request.app[DRAIN].track(outputs):
            for admission in admissions:
                try:
                    await admission
                except ValueError as exc:
                    message = str(exc).split("): ", 1)[-1]  # drop "add_request('<id>')"
                    raise InvalidRequest(message, "messages" if chat else "prompt") from None
            if gen.stream:
                return await _stream(request, outputs, completion)
            while not completion.done:
                out = await outputs.get()
                if isinstance(out, (EngineError, ShuttingDown)):
                    raise out
                completion.update(out)
                _abort_stopped(engine, completion)
            return web.json_response(completion.body())
    finally:
        for admission in admissions:  # those not admitted yet will not be
            if not admission.cancel() and not admission.cancelled():
                admission.exception()  # retrieved: the first one's error was answered
        for rid in completion.running_request_ids():  # all, if the client left
            engine.abort(rid, finished=completion.done)


def _abort_stopped(engine: AsyncEngine, completion: Completion) -> None:
    """Stop the engine requests whose every choice a stop string ended."""
    for rid in completion.take_stopped_request_ids():
        engine.abort(rid, finished=True)


def _check_queue(request: web.Request, sequences: int, param: str = "prompt") -> None:
    """503 while shutting down, or when the engine sequences waiting and the request's
    own (``sequences``: prompts x n; 0 before the body is read) would pass ``max_queue``;
    400 naming ``param`` for a request that alone passes it (it could never be queued)."""
    if request.app[DRAIN].started:
        raise web.HTTPServiceUnavailable(text="the server is shutting down")
    limit = request.app[LIMITS]["max_queue"]
    if limit is None:
        return
    if 0 < limit < sequences:
        raise InvalidRequest(
            f"the request makes {sequences} sequences (prompts x n), more than this "
            f"server's queue holds ({limit})",
            param,
        )
    waiting = request.app[ASYNC_ENGINE].num_waiting
    if waiting + max(sequences, 1) > limit:
        raise web.HTTPServiceUnavailable(
            text=f"the server's queue is full ({waiting} of {limit} sequences waiting); "
            "retry later",
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
            if isinstance(out, (EngineError, ShuttingDown)):
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


async def _json(request: web.Request, limit: int | None = None) -> tuple[Any, int]:
    """The body's JSON and its size in bytes (gzip or deflate bodies decompressed, within
    the size limit: the app's, or ``limit`` bytes if smaller)."""
    limit = request.client_max_size if limit is None else min(limit, request.client_max_size)
    declared = request.content_length
    if declared is not None and declared > limit:
        raise InvalidRequest(
            f"the request body is {declared} bytes, more than the {limit} this endpoint takes",
            status=413,
        )
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    if encoding not in CONTENT_ENCODINGS:
        raise InvalidRequest(
            f"Content-Encoding {encoding[:40]!r} is not supported; send gzip, deflate or none",
            status=415,
        )
    timeout = request.app[LIMITS]["body_read_s"]
    try:
        raw = await asyncio.wait_for(request.read(), timeout)
    except asyncio.TimeoutError:
        raise InvalidRequest(
            f"the request body did not arrive within {timeout:g} s", status=408
        ) from None
    except RequestPayloadError as exc:
        message = f"the request body could not be read: {' '.join(str(exc).split())}"
        raise InvalidRequest(message) from None
    if encoding != "identity":
        raw = await _off_loop(len(raw), _decompress, raw, encoding, limit)
    elif len(raw) > limit:  # sent without a Content-Length
        raise InvalidRequest(
            f"the request body is more than the {limit} bytes this endpoint takes", status=413
        )
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(_loads, raw), len(raw)
    return _loads(raw), len(raw)


def _decompress(raw: bytes, encoding: str, limit: int) -> bytes:
    """A gzip or deflate body (zlib-wrapped, or raw as some clients send it), at most
    ``limit`` bytes once decompressed."""
    wrapped = zlib.MAX_WBITS | 32  # a gzip or a zlib header, detected
    for wbits in (wrapped, -zlib.MAX_WBITS) if encoding == "deflate" else (wrapped,):
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(raw, limit + 1)
        except zlib.error as exc:
            error = str(exc)
            continue
        if len(out) > limit:
            raise InvalidRequest(
                f"the request body is more than {limit} bytes once decompressed", status=413
            )
        if not inflater.eof:
            raise InvalidRequest(f"the request body is truncated {encoding} data")
        return out
    raise InvalidRequest(f"the request body is not valid {encoding} data: {error}")


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and integers of more than 4300 digits
        message = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
        raise InvalidRequest(f"the request body is not valid JSON: {message}") from None
