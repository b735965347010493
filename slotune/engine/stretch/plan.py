"""A stretch's plan: what each planned step does, and each request over the steps."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from slotune.engine.queues import PriorityWaiting
from slotune.engine.request import Request
from slotune.engine.rules import may_earn_priority

Chunk = tuple[int, int]  # (tokens, prior context) of a request taking more than one token
Alloc = tuple[int, int]  # (request index, blocks) allocated in a step, in allocation order
Admit = tuple[int, int]  # (request index, tokens) of a request admitted in a step
# (allocations before it, request index, computed tokens it drops) of a request a step
# preempts (recompute): after that many of the step's allocations, before the next
Preempt = tuple[int, int, int]


@dataclass(slots=True)
class PlannedStep:
    """One step: the numbers an executor's cost model reads, then what the step changes.

    Indices are into ``StretchPlan.requests``; lists of them are in running order.
    """

    num_tokens: int
    num_prefill: int
    num_samples: int
    num_requests: int
    num_decodes: int
    context_sum: int  # KV tokens the decodes read together
    chunks: list[Chunk]  # the requests taking more than one token, in batch order
    allocs: list[Alloc]
    admits: list[Admit]
    fills: list[int]  # requests that filled a block
    finishes: list[int]
    arrivals: list[Request]  # requests arriving after it
    # the waiting head tried and left out under a prefix cache: the tokens its lookup
    # finds and those its allocation asks room for (a lookup commits filled blocks)
    retry: tuple[int, int] | None = None
    # the running requests it preempts, in the order the scheduler takes them (None: none)
    preempts: list[Preempt] | None = None


@dataclass(slots=True)
class PlannedRequest:
    """One request over the stretch: it samples one token in each step from
    ``first_sample`` through ``last_sample`` (0-based; -1: it does not sample) and
    computes ``scheduled`` tokens.

    How far it has computed: one token per step from step ``agg_start`` (1-based; 0:
    never) on, from ``agg_computed``; before that, ``progress`` as (step, computed after)
    (None: no progress noted; the planner notes it only with a prefix cache). A request
    the stretch preempts (recompute) has none from step ``preempted`` (0-based; -1: not
    preempted) on; it waits from then on, and if the stretch admits it again, that stay
    is the plan's request ``next_stay``.
    """

    request: Request
    start_computed: int
    scheduled: int = 0
    first_sample: int = -1
    last_sample: int = -1
    agg_start: int = 0
    agg_computed: int = 0
    progress: list[tuple[int, int]] | None = None
    preempted: int = -1
    next_stay: int = -1
    preempted_with_output: bool = False  # when preempted (a decode budget may move it up)

    @property
    def num_sampled(self) -> int:
        return self.last_sample - self.first_sample + 1 if self.first_sample >= 0 else 0

    def computed_after(self, k: int) -> int:
        """Its computed tokens after the first ``k`` steps."""
        if 0 <= self.preempted < k:
            return 0
        s = self.agg_start
        if s and k >= s - 1:
            return self.agg_computed + k - s + 1
        computed = self.start_computed
        for step, after in self.progress or ():
            if step > k:
                break
            computed = after
        return computed


class StretchPlan:
    """Planned ``steps``, and the ``requests`` they run: the running requests at the start
    in running order, then the ones the stretch admits in admission order (so index order
    is running order)."""

    __slots__ = ("_index", "num_start", "requests", "steps")

    def __init__(self, running: list[Request]) -> None:
        self.requests = [PlannedRequest(r, r.num_computed_tokens) for r in running]
        self.num_start = len(running)
        self.steps: list[PlannedStep] = []
        self._index: dict[str, int] | None = None

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def index(self, request_id: str, k: int = 0) -> int:
        """The plan index of a request in the steps from step ``k`` (0-based) on, until it
        is preempted (a request preempted and admitted again has one per stay)."""
        if self._index is None:
            members = self.requests
            self._index = {
                members[i].request.request_id: i for i in range(len(members) - 1, -1, -1)
            }
        i = self._index[request_id]
        member = self.requests[i]
        while 0 <= member.preempted < k and member.next_stay >= 0:
            i = member.next_stay
            member = self.requests[i]
        return i

    def admit(self, request: Request, computed: int = 0) -> int:
        """A request admitted during the stretch with ``computed`` tokens (its prefix-cache
        hit); its index."""
        self.requests.append(PlannedRequest(request, computed))
        self._index = None
        return len(self.requests) - 1


def sampled_runs(
    plan: StretchPlan, runs_of: Callable[[list[Request], list[int]], list[list[int]]]
) -> list[list[int]]:
    """What each request of the plan samples in its steps, from ``runs_of`` (each
    request's next ``count`` tokens from its length at the start): a request preempted and
    admitted again samples one run over its stays."""
    stays: dict[int, list[int]] = {}  # id of a request -> its plan indices
    for i, member in enumerate(plan.requests):
        stays.setdefault(id(member.request), []).append(i)
    members = plan.requests
    groups = list(stays.values())
    counts = [sum(members[i].num_sampled for i in group) for group in groups]
    runs = runs_of([members[group[0]].request for group in groups], counts)
    out: list[list[int]] = [[] for _ in members]
    for group, run in zip(groups, runs, strict=True):
        if len(group) == 1:
            out[group[0]] = run
            continue
        start = 0
        for i in group:
            end = start + members[i].num_sampled
            out[i] = run[start:end]
            start = end
    return out


class DueWatch:
    """Decode budget over a stretch: when the earliest waiting request that may still earn
    priority was preempted (``first``), so that the stretch ends with the step whose end
    brings it due (``Scheduler.advance`` moves it up there). Those are the scheduler's
    watched requests at the start (``BudgetWatch.first_preempted_at``) and the stretch's
    own victims while they wait: a victim the stretch admits again before it comes due
    (``PlannedRequest.next_stay``) never does, nor does one without output or boosted
    before (``rules.may_earn_priority``)."""

    __slots__ = ("_members", "_start", "_victims")

    def __init__(self, start: float | None, plan: StretchPlan) -> None:
        self._start = start
        self._members = plan.requests
        self._victims: deque[tuple[float, int]] = deque()  # (preempted at, plan index)

    def note(self, step: PlannedStep, clock: float) -> None:
        """``step`` was planned to start at ``clock``: its victims wait from then on."""
        members = self._members
        for _, i, _ in step.preempts or ():
            member = members[i]
            if may_earn_priority(member.request.boosted, member.preempted_with_output):
                self._victims.append((clock, i))

    def first(self) -> float | None:
        """The earliest preemption among the requests still waiting after the last noted
        step (and its admissions) that may earn priority; None: none."""
        victims, members = self._victims, self._members
        while victims and members[victims[0][1]].next_stay >= 0:
            victims.popleft()
        if not victims:
            return self._start
        at = victims[0][0]
        return at if self._start is None else min(at, self._start)


class WaitingView:
    """The scheduler's waiting queue at the start of a stretch, then the requests arriving
    during it, read in place: a stretch reads only the first few, so its cost does not
    grow with the queue's depth (the queue is not changed until the stretch is applied)."""

    __slots__ = ("_arrived", "_depth", "_order", "_queue", "_read")

    def __init__(self, queue: deque[Request] | PriorityWaiting) -> None:
        self._queue = queue
        self._depth = len(queue)
        self._arrived: list[Request] = []
        # a priority queue (a decode budget's) is read in its order, as far as read
        self._order = queue.in_order() if isinstance(queue, PriorityWaiting) else None
        self._read: list[Request] = []

    def __len__(self) -> int:
        return self._depth + len(self._arrived)

    def __getitem__(self, index: int) -> Request:
        if index < self._depth:
            if self._order is None:
                return self._queue[index]
            read = self._read
            while len(read) <= index:
                read.append(next(self._order))
            return read[index]
        return self._arrived[index - self._depth]

    def extend(self, requests: list[Request]) -> None:
        self._arrived.extend(requests)
