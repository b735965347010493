"""OpenAI error bodies for the errors aiohttp answers itself, before any handler runs.

aiohttp's HTTP parser refuses some requests (a malformed request line or header, a duplicate
or negative ``Content-Length``, a NUL in the path) and answers them, like an exception that
escapes every middleware, from ``RequestHandler.handle_error`` with a plain-text body.
aiohttp has no option for that body: :class:`Runner` is an ``AppRunner`` whose connections
are :class:`_Handler`, which keeps aiohttp's status, logging and connection close and only
replaces the body with an OpenAI error object (a 500's message stays generic).

This leans on three aiohttp internals (checked by :func:`check_aiohttp`, which says so in
one line when a release changes them): ``AppRunner._make_server`` builds the ``Server``,
``Server.__call__`` builds each connection's ``RequestHandler`` from ``Server._loop`` and
``Server._kwargs``, and ``handle_error(request, status, exc, message)`` builds the error
response.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import aiohttp
from aiohttp import web

from slotune.server.protocol import error_body, error_type

MAX_MESSAGE_CHARS = 200  # aiohttp's parser messages quote the request's bytes
TESTED = "install an aiohttp release that has them (3.9 to 3.14 do)"
_HANDLE_ERROR_PARAMS = ["self", "request", "status", "exc", "message"]


def check_aiohttp() -> None:
    """Raise ``RuntimeError`` if aiohttp no longer has the internals this module uses."""
    params = list(inspect.signature(web.RequestHandler.handle_error).parameters)
    missing = [
        name
        for name, ok in [
            (
                "RequestHandler.handle_error(request, status, exc, message)",
                params == _HANDLE_ERROR_PARAMS,
            ),
            ("AppRunner._make_server", callable(getattr(web.AppRunner, "_make_server", None))),
            ("Server.__call__", "__call__" in vars(web.Server)),
        ]
        if not ok
    ]
    if missing:
        raise RuntimeError(
            f"aiohttp {aiohttp.__version__} changed what slotune's server relies on to "
            f"answer HTTP parser errors as OpenAI errors ({', '.join(missing)}); "
            f"{TESTED}"
        )


class _Handler(web.RequestHandler):
    """aiohttp's connection handler, with OpenAI error bodies."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's: logs, and raises ConnectionError once a response has started
        plain = super().handle_error(request, status, exc, message)
        if status >= 500 or not message:
            text = plain.reason.lower()  # never the exception or a traceback
        else:
            text = " ".join(message.split()).removesuffix(" ^")  # llhttp's caret line
            if len(text) > MAX_MESSAGE_CHARS:
                text = text[:MAX_MESSAGE_CHARS] + "..."
        resp = web.json_response(error_body(text, type_=error_type(status)), status=plain.status)
        resp.force_close()
        return resp


class _Server(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """``web.AppRunner`` whose connections answer aiohttp's own errors as OpenAI errors."""

    __slots__ = ()

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        check_aiohttp()
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if type(server) is not web.Server or not all(
            hasattr(server, name) for name in ("_loop", "_kwargs")
        ):
            logging.getLogger(__name__).warning(
                "aiohttp %s builds its server differently (%s): parser errors stay plain text; %s",
                aiohttp.__version__,
                type(server).__name__,
                TESTED,
            )
            return server
        server.__class__ = _Server  # the app's server as aiohttp built it; only __call__ differs
        return server
