"""The waiting queue of priority scheduling and tiers: a heap in ``rules.queue_key`` order.

It offers the slice of ``collections.deque`` the scheduler uses (``[0]``, ``append``,
``appendleft``, ``popleft``, ``remove``, iteration), so the scheduler's code is one for
both policies. As in vLLM's ``PriorityRequestQueue``, a preempted request goes back by
its rank, not to the front; equal ranks leave in the order they were put in.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from slotune.engine.request import Request


class PriorityWaiting:
    __slots__ = ("_counter", "_heap", "_key")

    def __init__(self, key: Callable[[Request], tuple]) -> None:
        self._heap: list[tuple[tuple, int, Request]] = []
        self._counter = itertools.count()
        self._key = key

    def append(self, req: Request) -> None:
        heapq.heappush(self._heap, (self._key(req), next(self._counter), req))

    appendleft = append  # a preempted request waits in its place too

    def popleft(self) -> Request:
        return heapq.heappop(self._heap)[2]

    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("PriorityWaiting: only the head ([0]) can be read")
        return self._heap[0][2]

    def remove(self, req: Request) -> None:
        heap = self._heap
        for i, entry in enumerate(heap):
            if entry[2] is req:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                return
        raise ValueError("PriorityWaiting.remove: request not waiting")

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """The requests in queue order."""
        return iter([entry[2] for entry in sorted(self._heap, key=lambda e: (e[0], e[1]))])
