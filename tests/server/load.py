"""A load of concurrent streaming clients, some of which leave mid-stream.

Used by the server's load and metrics tests and by ``benchmarks/server_load.py``. Each
client streams one completion over its own connection, timing every token chunk as the
client sees it (TTFT: request sent to first token chunk; ITL: gaps between token chunks).
Every ``leave_every``-th client (none if 0) closes its connection after ``leave_after``
tokens.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class ClientResult:
    tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    completed: bool = False
    left: bool = False
    error: str | None = None


@dataclass
class LoadResult:
    clients: list[ClientResult]
    wall_s: float

    @property
    def completed(self) -> int:
        return sum(c.completed for c in self.clients)

    @property
    def left(self) -> int:
        return sum(c.left for c in self.clients)

    @property
    def errors(self) -> list[str]:
        return [c.error for c in self.clients if c.error]

    def summary(self) -> dict[str, float]:
        ttft = [c.ttft_s for c in self.clients if c.ttft_s is not None]
        itl = [x for c in self.clients for x in c.itl_s]
        return {
            "clients": len(self.clients),
            "completed": self.completed,
            "left": self.left,
            "wall_s": self.wall_s,
            "requests_per_s": self.completed / self.wall_s,
            "tokens_per_s": sum(c.tokens for c in self.clients) / self.wall_s,
            "ttft_p50_ms": 1e3 * _quantile(ttft, 0.5),
            "ttft_p99_ms": 1e3 * _quantile(ttft, 0.99),
            "itl_p50_ms": 1e3 * _quantile(itl, 0.5),
            "itl_p99_ms": 1e3 * _quantile(itl, 0.99),
        }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


async def _client(
    session: aiohttp.ClientSession,
    url: str,
    body: dict,
    leave_after: int | None,
    headers: dict[str, str] | None = None,
) -> ClientResult:
    result = ClientResult()
    start = last = time.perf_counter()
    try:
        async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {await resp.text()}"
                return result
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    result.completed = result.tokens == body["max_tokens"]
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    break
                if not chunk.get("choices"):
                    continue
                now = time.perf_counter()
                if result.ttft_s is None:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last = now
                result.tokens += 1
                if leave_after is not None and result.tokens >= leave_after:
                    result.left = True
                    resp.close()  # drop the connection mid-stream
                    break
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_load(
    url: str,
    model: str,
    *,
    clients: int,
    max_tokens: int,
    prompt: str,
    leave_every: int = 3,
    leave_after: int = 3,
    timeout_s: float = 120,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """All ``clients`` at once; raises ``TimeoutError`` if they are not done in
    ``timeout_s``."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        jobs = [
            _client(
                session,
                url,
                body,
                leave_after if leave_every and i % leave_every == leave_every - 1 else None,
                headers,
            )
            for i in range(clients)
        ]
        results = await asyncio.wait_for(asyncio.gather(*jobs), timeout_s)
        return LoadResult(list(results), time.perf_counter() - start)
