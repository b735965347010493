"""Client timeouts for the in-process targets: when each sent request is given up.

A client that sends a request at its arrival time gives up ``timeout_s`` later, as the
load generators of vLLM, inference-perf and GuideLLM do. The engine hears of it between
steps (as a server hears of a closed connection): the runner aborts the request there,
which frees its blocks, and records it as failed at its deadline with the tokens that
had arrived by then. A request that finishes after its deadline timed out all the same.
"""

from __future__ import annotations

import heapq
import math

TIMEOUT_ERROR = "timeout"
UNFINISHED_ERROR = "unfinished when the run ended"
"""A request still in flight at a run's horizon (``run_simulated(horizon_s=...)``)."""


def check_timeout(timeout_s: float | None) -> float | None:
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout: must be a positive number of seconds (got {timeout_s})")
    return timeout_s


class Deadlines:
    """Each pending request's deadline, earliest first (``timeout_s`` None: no deadlines)."""

    def __init__(self, timeout_s: float | None, num_requests: int) -> None:
        self.timeout_s = check_timeout(timeout_s)
        self.at = [math.inf] * num_requests
        self._heap: list[tuple[float, int]] = []

    def start(self, index: int, arrival_time: float) -> None:
        if self.timeout_s is not None:
            self.at[index] = arrival_time + self.timeout_s
            heapq.heappush(self._heap, (self.at[index], index))

    def missed(self, index: int, finish_time: float) -> bool:
        return finish_time > self.at[index]

    def resolve(self, index: int) -> None:
        """The request ended; its deadline no longer counts."""
        self.at[index] = math.inf

    def next_time(self) -> float | None:
        heap = self._heap
        while heap and heap[0][0] != self.at[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pop_expired(self, now: float) -> list[int]:
        """Pending requests whose deadline is before ``now``, in deadline order."""
        expired = []
        while (t := self.next_time()) is not None and t < now:
            _, i = heapq.heappop(self._heap)
            expired.append(i)
        return expired


def earliest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None
