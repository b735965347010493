"""The aiohttp application: OpenAI's completions and chat endpoints over an ``AsyncEngine``.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream`` true:
server-sent events ``data: {...}`` ending with ``data: [DONE]``, the usage in a last chunk
when ``stream_options.include_usage``; false: one JSON body), ``GET /v1/models``,
``GET /health``. A client that disconnects aborts its request. Bad input is an HTTP 400
with an OpenAI-style error naming the field.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from slotune.engine.engine import Engine
from slotune.engine.server.async_engine import AsyncEngine, EngineError
from slotune.engine.server.protocol import InvalidRequest, error_body, parse_request
from slotune.engine.server.responses import Completion
from slotune.engine.server.served import ServedModel

logger = logging.getLogger(__name__)

ASYNC_ENGINE = web.AppKey("async_engine", AsyncEngine)
SERVED = web.AppKey("served", ServedModel)
MAX_BODY_BYTES = 64 << 20  # token-id prompts of long contexts are large JSON


def create_app(engine: Engine, served: ServedModel) -> web.Application:
    """An app whose startup starts the engine loop and whose cleanup stops it. Run it with
    ``handler_cancellation=True`` (as :func:`serve` does) so that a client leaving a
    non-streamed request also aborts it."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
    app[ASYNC_ENGINE] = AsyncEngine(engine, pace=served.pace)
    app[SERVED] = served
    app.on_startup.append(_start_engine)
    app.on_cleanup.append(_stop_engine)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    return app


def serve(
    engine: Engine, served: ServedModel, *, host: str = "127.0.0.1", port: int = 8000
) -> None:
    """Serve until interrupted."""
    web.run_app(
        create_app(engine, served),
        host=host,
        port=port,
        handler_cancellation=True,
        print=None,
        access_log=None,
    )


async def _start_engine(app: web.Application) -> None:
    app[ASYNC_ENGINE].start()


async def _stop_engine(app: web.Application) -> None:
    await app[ASYNC_ENGINE].stop()


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except InvalidRequest as exc:
        return web.json_response(error_body(str(exc), exc.param, exc.code), status=400)
    except web.HTTPException:
        raise
    except EngineError as exc:
        return web.json_response(error_body(str(exc), type_="server_error"), status=500)
    except Exception as exc:
        logger.exception("%s %s failed", request.method, request.path)
        message = f"internal error: {type(exc).__name__}: {exc}"
        return web.json_response(error_body(message, type_="server_error"), status=500)


async def _models(request: web.Request) -> web.Response:
    served = request.app[SERVED]
    card = {
        "id": served.name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "slotune",
        "max_model_len": served.max_model_len,
    }
    return web.json_response({"object": "list", "data": [card]})


async def _health(request: web.Request) -> web.Response:
    if not request.app[ASYNC_ENGINE].running:
        return web.json_response({"status": "engine loop stopped"}, status=503)
    return web.json_response({"status": "ok"})


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    served = request.app[SERVED]
    engine = request.app[ASYNC_ENGINE]
    gen = parse_request(await _json(request), served, chat=chat)
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    try:
        outputs = await engine.add(request_id, gen.prompt_token_ids, gen.params)
    except ValueError as exc:
        message = str(exc).split("): ", 1)[-1]  # drop "add_request('<internal id>')"
        param = "n" if "SamplingParams.n" in message else ("messages" if chat else "prompt")
        raise InvalidRequest(message, param) from None
    completion = Completion(request_id, served.name, gen, served.tokenizer)
    try:
        if gen.stream:
            return await _stream(request, outputs, completion)
        while not completion.done:
            out = await outputs.get()
            if isinstance(out, EngineError):
                raise out
            completion.update(out)
        return web.json_response(completion.body())
    finally:
        if not completion.done:
            engine.abort(request_id)


async def _stream(
    request: web.Request, outputs: asyncio.Queue[Any], completion: Completion
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    try:
        if completion.gen.chat:
            await _send(resp, completion.role_chunk())
        while not completion.done:
            out = await outputs.get()
            if isinstance(out, EngineError):
                await _send(resp, error_body(str(out), type_="server_error"))
                break
            chunk = completion.update(out)
            if chunk is not None:
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


async def _json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
