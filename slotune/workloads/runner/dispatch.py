"""When each request of a trace is sent: the bookkeeping every target shares.

A *flow* is a request without a parent plus every turn that continues it (an agent or
chat session). Flows start at their arrival times, at most ``concurrency`` at once; a
turn is released ``think_time_s`` after the turn it continues finishes, with the
parent's full prompt and actual output in front of its own tokens. The targets (virtual
engine loop, wall-clock engine loop, HTTP client) only ask what is due, send it, and
report finishes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from slotune.workloads.arrivals import ArrivalSpec, arrival_times
from slotune.workloads.trace import Trace

P = TypeVar("P")


class PromptBuilder(Protocol[P]):
    """How a target turns a request into what it sends (token ids, text, chat messages)."""

    def prompt(self, index: int, parent_context: P | None) -> P: ...

    def context_after(self, prompt: P, output: Any) -> P: ...


@dataclass(frozen=True)
class Release(Generic[P]):
    index: int
    request_id: str
    arrival_time: float
    prompt: P
    max_tokens: int


_NOTHING: list[Any] = []


class Dispatcher(Generic[P]):
    def __init__(
        self, trace: Trace, arrivals: ArrivalSpec, builder: PromptBuilder[P], *, seed: int = 0
    ) -> None:
        reqs = trace.requests
        self._trace = trace
        self._builder = builder
        index = {r.request_id: i for i, r in enumerate(reqs)}
        self._children: list[list[int]] = [[] for _ in reqs]
        self._flow = [0] * len(reqs)
        self._parent = [-1] * len(reqs)
        roots: list[int] = []
        for i, r in enumerate(reqs):
            if r.parent_id is None:
                roots.append(i)
                self._flow[i] = i
            else:
                p = index[r.parent_id]
                self._parent[i] = p
                self._children[p].append(i)
                self._flow[i] = self._flow[p]
        self._flow_left: dict[int, int] = {}
        for f in self._flow:
            self._flow_left[f] = self._flow_left.get(f, 0) + 1
        times = arrival_times(
            arrivals, len(roots), trace_times=[reqs[i].arrival_time for i in roots], seed=seed
        )
        self._timed: list[tuple[float, int]] = sorted(zip(times, roots, strict=True))
        heapq.heapify(self._timed)
        self._blocked: deque[tuple[float, int]] = deque()
        self._cap = arrivals.concurrency
        self._active_flows = 0
        # when each free concurrency slot became free; a waiting flow starts at
        # max(its arrival, that time), so open-loop arrivals keep their true times
        self._free_since: deque[float] = deque([-math.inf] * (arrivals.concurrency or 0))
        self._in_flight = 0
        self._sent_prompts: dict[int, P] = {}
        self._contexts: dict[int, P] = {}
        self._unreleased_children = [len(c) for c in self._children]

    @property
    def has_children(self) -> Sequence[bool]:
        return [bool(c) for c in self._children]

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def next_time(self) -> float | None:
        """The next time something becomes due (an arrival or the end of a think time)."""
        return self._timed[0][0] if self._timed else None

    def done(self) -> bool:
        return not self._timed and not self._blocked and self._in_flight == 0

    def pop_due(self, now: float) -> list[Release[P]]:
        if not self._blocked and (not self._timed or self._timed[0][0] > now):
            return _NOTHING
        releases: list[Release[P]] = []
        while self._timed and self._timed[0][0] <= now:
            t, i = heapq.heappop(self._timed)
            if self._trace.requests[i].parent_id is None:
                self._blocked.append((t, i))
            else:
                releases.append(self._release(i, t))
        while self._blocked and (self._cap is None or self._active_flows < self._cap):
            t, i = self._blocked.popleft()
            self._active_flows += 1
            if self._cap is not None:
                t = max(t, self._free_since.popleft())
            releases.append(self._release(i, t))
        return releases

    def finish(self, index: int, now: float, output: Any) -> None:
        """Report that a request ended (done or failed) at ``now`` with ``output``."""
        self._in_flight -= 1
        prompt = self._sent_prompts.pop(index, None)
        if self._children[index]:
            self._contexts[index] = self._builder.context_after(prompt, output)  # type: ignore[arg-type]
            for c in self._children[index]:
                heapq.heappush(self._timed, (now + self._trace.requests[c].think_time_s, c))
        flow = self._flow[index]
        self._flow_left[flow] -= 1
        if self._flow_left[flow] == 0:
            self._active_flows -= 1
            if self._cap is not None:
                self._free_since.append(now)

    def _release(self, i: int, t: float) -> Release[P]:
        req = self._trace.requests[i]
        parent_ctx = None
        p = self._parent[i]
        if p >= 0:
            parent_ctx = self._contexts.get(p)
            self._unreleased_children[p] -= 1
            if self._unreleased_children[p] == 0:
                self._contexts.pop(p, None)
        prompt = self._builder.prompt(i, parent_ctx)
        if self._children[i]:
            self._sent_prompts[i] = prompt
        self._in_flight += 1
        return Release(
            index=i,
            request_id=req.request_id,
            arrival_time=t,
            prompt=prompt,
            max_tokens=req.output_len,
        )
