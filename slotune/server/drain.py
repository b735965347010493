"""Draining on shutdown: the generation requests in flight get ``timeout_s`` to finish, then
are cut, each ending as a client can read it (a stream: an error event, then ``[DONE]``).

aiohttp's own ``shutdown_timeout`` waits that long for handlers and then as long again for
the cancelled ones, and treats 0 as no bound at all; so the server hands aiohttp only a
short grace (``CUT_GRACE_S``) for what is left after this drain has cut every request.
A ``timeout_s`` of 0 cuts every request at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

CUT_GRACE_S = 1.0  # after the cut: for handlers to write their last event, then aiohttp's


class ShuttingDown(Exception):
    """Put on a request's output queue when the drain deadline cuts it."""


class Drain:
    def __init__(self, timeout_s: float) -> None:
        if not timeout_s >= 0:
            raise ValueError(f"drain timeout must be >= 0 seconds (got {timeout_s})")
        self.timeout_s = timeout_s
        self.started = False
        self._queues: set[asyncio.Queue[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def num_in_flight(self) -> int:
        return len(self._queues)

    @contextlib.contextmanager
    def track(self, outputs: asyncio.Queue[Any]) -> Iterator[None]:
        """A generation request in flight, its outputs on ``outputs``."""
        self._queues.add(outputs)
        self._idle.clear()
        try:
            yield
        finally:
            self._queues.discard(outputs)
            if not self._queues:
                self._idle.set()

    async def run(self) -> None:
        """Wait up to ``timeout_s`` for the requests in flight, then cut the rest and give
        them ``CUT_GRACE_S`` to end."""
        self.started = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self.timeout_s)
        if self._queues:
            message = f"the server shut down; the drain timeout ({self.timeout_s:g} s) cut this"
            for outputs in self._queues:
                outputs.put_nowait(ShuttingDown(message))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), CUT_GRACE_S)
