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
import math
from collections.abc import Callable, Iterator

from slotune.engine.request import Request, RequestStatus
from slotune.engine.rules import earns_priority, may_earn_priority


class PriorityWaiting:
    __slots__ = ("_counter", "_heap", "_key")

    def __init__(self, key: Callable[[Request], tuple]) -> None:
        self._heap: list[tuple[tuple, int, int, Request]] = []
        self._counter = itertools.count()
        self._key = key

    def rank(self, req: Request) -> tuple:
        """Where ``req`` sorts here: its key, then when it first joined the queue (one that
        has not joined yet joins behind every request here)."""
        return (self._key(req), req.queue_seq if req.queue_seq >= 0 else math.inf)

    def append(self, req: Request) -> None:
        n = next(self._counter)  # forks share their parent's place: this breaks the tie
        if req.queue_seq < 0:
            req.queue_seq = n
        heapq.heappush(self._heap, (*self.rank(req), n, req))

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

    def requeue(self, reqs: list[Request], change: Callable[[Request], None]) -> None:
        """Take ``reqs`` out, ``change`` each and append it again, in queue order (as
        removing and appending them one by one in that order does): one pass over the
        queue for all of them."""
        taken = set(reqs)
        moved = sorted((e for e in self._heap if e[3] in taken), key=lambda e: e[:3])
        if len(moved) != len(taken):
            raise ValueError("PriorityWaiting.requeue: request not waiting")
        self._heap = [e for e in self._heap if e[3] not in taken]
        heapq.heapify(self._heap)
        for entry in moved:
            change(entry[3])
            self.append(entry[3])

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def in_order(self) -> Iterator[Request]:
        """The requests in queue order, popped from a copy of the heap as far as they are
        read (a stretch reads the first few of thousands)."""
        heap = list(self._heap)
        while heap:
            yield heapq.heappop(heap)[3]

    def __iter__(self) -> Iterator[Request]:
        """The requests in queue order."""
        return iter([entry[3] for entry in sorted(self._heap, key=lambda e: e[:3])])


_WAITS = frozenset({RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.SWAPPED})


class BudgetWatch:
    """Decode budget: the waiting requests that may earn priority (``rules.earns_priority``),
    by when they were preempted, so that a step finds those that just earned it without
    walking the waiting queue. A request is added when it joins the queue with output;
    entries of requests admitted again (or preempted again since: a later entry) are
    dropped when due."""

    __slots__ = ("_counter", "_heap")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []
        self._counter = itertools.count()

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.preempted_at, next(self._counter), req))

    def first_preempted_at(self) -> float | None:
        """The earliest preemption of a watched request that may still earn priority
        (None: none): ``due`` finds nothing until the clock is more than the budget past
        it. Entries before it that never can (the request admitted again, boosted, without
        output, or preempted again since: a later entry) are dropped, as ``due`` drops them."""
        heap = self._heap
        while heap:
            at, _, req = heap[0]
            live = req.status in _WAITS and may_earn_priority(
                req.boosted, bool(req.output_token_ids)
            )
            if live and req.preempted_at == at:
                return at
            heapq.heappop(heap)
        return None

    def due(self, now: float, budget_s: float) -> list[Request]:
        """The waiting requests that earn priority at ``now``."""
        heap = self._heap
        due = []
        while heap and now - heap[0][0] > budget_s:
            req = heapq.heappop(heap)[2]
            if req.status in _WAITS and earns_priority(req, now, budget_s):
                due.append(req)
        return due
