"""The waiting queue of priority scheduling and tiers: a heap in ``rules.queue_key`` order.

It offers the slice of ``collections.deque`` the scheduler uses (``[0]``, ``append``,
``appendleft``, ``popleft``, ``remove``, iteration), so the scheduler's code is one for
both policies. As in vLLM's ``PriorityRequestQueue``, a preempted request goes back by
its rank, not to the front; equal ranks leave in the order the requests first joined
the queue (a preempted request keeps its place among them, as an earlier arrival).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from slotune.engine.request import Request


class PriorityWaiting:
    __slots__ = ("_counter", "_heap", "_key")

    def __init__(self, key: Callable[[Request], tuple]) -> None:
        self._heap: list[tuple[tuple, int, int, Request]] = []
        self._counter = itertools.count()
        self._key = key

    def append(self, req: Request) -> None:
        n = next(self._counter)  # forks share their parent's place: this breaks the tie
        if req.queue_seq < 0:
            req.queue_seq = n
        heapq.heappush(self._heap, (self._key(req), req.queue_seq, n, req))

    appendleft = append  # a preempted request waits in its place too

    def popleft(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("PriorityWaiting: only the head ([0]) can be read")
        return self._heap[0][3]

    def remove(self, req: Request) -> None:
        heap = self._heap
        for i, entry in enumerate(heap):
            if entry[3] is req:
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
        return iter([entry[3] for entry in sorted(self._heap, key=lambda e: e[:3])])
