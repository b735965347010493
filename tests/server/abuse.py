"""One abusive request of each kind issue 26 found, sent while innocent streams run.

Used by ``benchmarks/server_load.py --abuse`` and the server's abuse test. Every abuse
goes to 127.0.0.1, once, bounded in size (at most ~40 MB of body) and in time (slow
clients give up after ``SLOW_S``). Each reports what the server answered: the HTTP status
(and the OpenAI error's ``param``) or how the connection ended.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import aiohttp

SLOW_S = 45.0  # a slow client gives up after this; the server must close it before
SLOW_CONNECTIONS = 20


@dataclass(frozen=True)
class AbuseResult:
    kind: str
    expected: str  # what a server that keeps its word answers
    got: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.got == self.expected


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: Any,
    headers: dict[str, str] | None = None,
) -> str:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    async with session.post(url, data=data, headers=hdrs) as resp:
        raw = await resp.read()
    try:
        param = json.loads(raw)["error"]["param"]
    except (ValueError, KeyError, TypeError):
        return f"{resp.status} (not an OpenAI error)" if resp.status >= 400 else str(resp.status)
    return f"{resp.status} {param}" if param else str(resp.status)


def _sender(
    session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> Callable[[], Awaitable[str]]:
    """Sends ``body``, serialized now: building a large body must not stall the clients."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return lambda: _post(session, url, data, headers)


async def _raw(port: int, request: bytes, read_s: float = 15) -> str:
    """Send raw bytes; the status line's code, or how the connection ended."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), read_s)
        if not line:
            return "closed"
        return line.split(b" ")[1].decode()
    except asyncio.TimeoutError:
        return "no answer"
    finally:
        writer.close()


async def _slow(port: int, request: bytes, give_up_s: float) -> str:
    """A slowloris client: sends ``request`` (incomplete) and waits for the server."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), give_up_s)
        return "closed" if not line else line.split(b" ")[1].decode()
    except asyncio.TimeoutError:
        return "held open"
    except ConnectionError:
        return "closed"
    finally:
        writer.close()


async def _slow_many(port: int, request: bytes) -> str:
    answers = await asyncio.gather(*(_slow(port, request, SLOW_S) for _ in range(SLOW_CONNECTIONS)))
    kinds = sorted(set(answers))
    return "/".join(kinds)


@cache
def large_bodies(model: str) -> dict[str, bytes]:
    """The large bodies, built once: call it before the load, whose client it would stall."""
    hi = {"model": model, "prompt": "hi"}
    return {
        "prompts": json.dumps({"model": model, "prompt": ["a"] * 20_000}).encode(),
        "stop": json.dumps(hi | {"stop": ["ab"] * 10**6}).encode(),
        "model": json.dumps({"model": "m" * (10 << 20), "prompt": "hi"}).encode(),
        "bomb": gzip.compress(b" " * (100 << 20)),  # 100 MB of JSON whitespace: ~100 KB
        "detokenize": json.dumps({"tokens": [5] * 15_000_000}).encode(),
    }


def abuses(
    session: aiohttp.ClientSession,
    base: str,
    port: int,
    model: str,
    api_key: str | None,
    max_queue: int,
) -> list[tuple[str, str, Callable[[], Awaitable[str]]]]:
    """(kind, expected answer, the coroutine that sends it), against a server run with
    ``api_key`` and ``max_queue`` (below ``protocol.MAX_CHOICES``)."""
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    c = base + "/v1/completions"
    hi = {"model": model, "prompt": "hi"}
    big = large_bodies(model)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    key = b"Authorization: Bearer %s\r\n" % (api_key or "").encode() if api_key else b""
    return [
        ("n = 2**80", "400 n", _sender(session, c, hi | {"n": 2**80}, auth)),
        (
            "best_of = 2**80",
            "400 best_of",
            _sender(session, c, hi | {"best_of": 2**80}, auth),
        ),
        (
            "max_tokens = 2**80",
            "400 max_tokens",
            _sender(session, c, hi | {"max_tokens": 2**80}, auth),
        ),
        (
            "logprobs = 2**80",
            "400 logprobs",
            _sender(session, c, hi | {"logprobs": 2**80}, auth),
        ),
        (
            "20,000 prompts",
            "400 prompt",
            _sender(session, c, big["prompts"], auth),
        ),
        (
            f"{max_queue + 1} prompts past --max-queue",
            "400 prompt",
            _sender(session, c, {"model": model, "prompt": ["a"] * (max_queue + 1)}, auth),
        ),
        (
            "10^6 stop strings",
            "400 stop",
            _sender(session, c, big["stop"], auth),
        ),
        (
            "top_p = 1e-46",
            "200",
            _sender(session, c, hi | {"top_p": 1e-46, "max_tokens": 8}, auth),
        ),
        (
            "top_p = 5e-324",
            "200",
            _sender(session, c, hi | {"top_p": 5e-324, "max_tokens": 8}, auth),
        ),
        (
            "include_usage a string",
            "400 stream_options",
            _sender(
                session, c, hi | {"stream": True, "stream_options": {"include_usage": "y"}}, auth
            ),
        ),
        (
            "10 MB model name",
            "404 model",
            _sender(session, c, big["model"], auth),
        ),
        (
            "gzip bomb (100 MB inflated)",
            "413",
            _sender(session, c, big["bomb"], auth | {"Content-Encoding": "gzip"}),
        ),
        (
            "Content-Encoding: br",
            "415",
            _sender(session, c, hi, auth | {"Content-Encoding": "br"}),
        ),
        (
            "0xE9 byte in Authorization",
            "401",
            lambda: _raw(
                port,
                head.replace(b"Host", b"Authorization: Bearer caf\xe9\r\nHost")
                + b"Content-Length: 2\r\n\r\n{}",
            ),
        ),
        (
            "/detokenize of 15M tokens",
            "413",
            _sender(session, base + "/detokenize", big["detokenize"], auth),
        ),
        (
            "Expect: 100-continue, 10 GB",
            "413",
            lambda: _raw(
                port, head + b"Content-Length: 10000000000\r\nExpect: 100-continue\r\n\r\n"
            ),
        ),
        (
            "duplicate Content-Length",
            "400",
            lambda: _raw(port, head + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
        ),
        (
            "negative Content-Length",
            "400",
            lambda: _raw(port, head + b"Content-Length: -1\r\n\r\n"),
        ),
        (
            "NUL in the path",
            "400",
            lambda: _raw(port, b"GET /he\x00alth HTTP/1.1\r\nHost: x\r\n\r\n"),
        ),
        (
            f"slowloris headers x{SLOW_CONNECTIONS}",
            "closed",
            lambda: _slow_many(port, head + b"X-Slow: "),
        ),
        (
            f"slowloris body x{SLOW_CONNECTIONS}",
            "408",
            lambda: _slow_many(port, head + key + b'Content-Length: 1000\r\n\r\n{"prompt": '),
        ),
    ]


async def run_abuse(
    base: str, port: int, model: str, api_key: str | None, max_queue: int
) -> list[AbuseResult]:
    """Every abuse at once; each result with the seconds it took."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=SLOW_S + 30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def timed(
            kind: str, expected: str, send: Callable[[], Awaitable[str]]
        ) -> AbuseResult:
            start = time.perf_counter()
            try:
                got = await send()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                got = f"{type(exc).__name__}"
            return AbuseResult(kind, expected, got, time.perf_counter() - start)

        jobs = [timed(*a) for a in abuses(session, base, port, model, api_key, max_queue)]
        return list(await asyncio.gather(*jobs))
