"""Stretches: runs of engine steps worked out in advance and applied at once.

Between two arrivals a simulated engine mostly repeats itself: decoding requests take one
token per step, a freshly admitted prompt takes its chunks, and now and then a request
finishes. Nothing in such a step needs the scheduler's general machinery (no admission,
prefix-cache lookup, preemption, copy-on-write or fork), so ``StretchPlanner`` works out
step after step with integer bookkeeping only: what each step schedules (the numbers an
executor's cost model reads), which blocks it allocates in which order, which blocks it
fills, which requests sample and which finish. ``apply_stretch`` then applies the first
``k`` planned steps: tokens appended in bulk, blocks taken in exactly the order single
steps take them, filled blocks queued for the prefix cache in the same order, finished
requests freed step by step. The state afterwards (block ids and free-queue order
included) is the one ``k`` rounds of ``schedule`` and ``update_from_output`` leave.

A step can be planned only when it is certain to be such a step: nothing in the waiting
queue could be admitted or even looked up (a lookup commits blocks and touches the radix
tree) because the running requests take the whole budget, all seats are taken, or a
swapped head's blocks are not free; every allocation fits in the blocks free before the
stretch (frees during it are ignored, so the plan never over-commits); no prompt needs a
fork (``n > 1``). When a request finishes while others wait, or when the caller asks (it
may send new requests when one finishes), that step is the last. Stop tokens are the
caller's to check: it knows the tokens and may plan a shorter stretch again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotune.engine.request import Request, RequestStatus

if TYPE_CHECKING:
    from slotune.engine.scheduler import Scheduler

Chunk = tuple[int, int]  # (tokens, prior context) of a request taking more than one token


def _budget_left_estimate(s: Scheduler) -> int:
    """Roughly the budget the next step leaves after the running requests, counting the
    latest admitted (still prefilling) ones exactly and the others as decoders."""
    budget = s.config.max_num_batched_tokens
    running = s.running
    num = len(running)
    for req in reversed(running):
        n = len(req.all_token_ids) - req.num_computed_tokens
        if n == 1 and req.output_token_ids:
            break
        num -= 1
        budget -= min(n, s.threshold, max(budget, 0))
    return budget - num


class StretchPlan:
    """Planned steps, as lists indexed by step (0-based), and per request in running order.

    Request ``i`` samples one token in each step from ``first_sample[i]`` through
    ``last_sample[i]`` (0-based steps; ``first_sample[i] == -1``: it does not sample).
    """

    __slots__ = (
        "allocs",
        "chunks",
        "context_sum",
        "fills",
        "finishes",
        "first_sample",
        "last_sample",
        "num_decodes",
        "num_prefill",
        "num_requests",
        "num_samples",
        "num_steps",
        "num_tokens",
        "requests",
        "scheduled",
    )

    def __init__(self, requests: list[Request]) -> None:
        self.requests = requests
        self.num_steps = 0
        self.num_tokens: list[int] = []
        self.num_prefill: list[int] = []
        self.num_samples: list[int] = []
        self.num_requests: list[int] = []
        self.num_decodes: list[int] = []
        self.context_sum: list[int] = []
        self.chunks: list[list[Chunk]] = []
        self.allocs: list[list[tuple[int, int]]] = []  # per step: (request index, blocks)
        self.finishes: list[list[int]] = []  # per step: request indices, in running order
        self.fills: list[tuple[int, int]] = []  # (step, request index): first filled block
        self.scheduled: list[int] = [0] * len(requests)  # tokens computed in all steps
        self.first_sample = [-1] * len(requests)
        self.last_sample = [-1] * len(requests)


class _Other:
    """A running request outside the decoding prefix, stepped one by one while planning."""

    __slots__ = (
        "computed",
        "filled",
        "has_output",
        "index",
        "max_num_tokens",
        "n",
        "slots",
        "total",
    )

    def __init__(self, index: int, req: Request, slots: int) -> None:
        self.index = index
        self.computed = req.num_computed_tokens
        self.total = len(req.all_token_ids)
        self.slots = slots
        self.has_output = bool(req.output_token_ids)
        self.max_num_tokens = req.max_num_tokens
        self.n = req.sampling_params.n
        self.filled = False


class StretchPlanner:
    """Plans one step at a time (``plan_step``) so a caller can stop at its horizon."""

    def __init__(self, scheduler: Scheduler, stop_at_finish: bool) -> None:
        self.sched = scheduler
        kv = scheduler.kv_cache
        self.bs = bs = scheduler.block_size
        self.budget = scheduler.config.max_num_batched_tokens
        self.threshold = scheduler.threshold
        self.max_model_len = scheduler.max_model_len
        self.caching = kv.cache is not None
        self.free = kv.num_free_blocks  # frees during the stretch are not counted
        self.stop_at_finish = stop_at_finish or bool(scheduler.waiting)
        self.head: Request | None = None  # a swapped waiting head that could take a seat
        self.ended = False
        running = scheduler.running
        self.plan = StretchPlan(list(running))
        # decoders before the first other request ("the prefix"), kept as aggregates
        req_blocks = kv.req_blocks
        alloc_at: dict[int, list[int]] = {}
        finish_at: dict[int, list[int]] = {}
        fill_at: dict[int, list[int]] = {}
        finish_step: list[int] = []
        sum_computed = 0
        num = 0
        for req in running:
            computed = req.num_computed_tokens
            total = len(req.all_token_ids)
            if total - computed != 1 or not req.output_token_ids:
                break
            finish = req.max_num_tokens - total  # the 1-based step that samples its last token
            finish_step.append(finish)
            first = req_blocks[req.request_id].num_slots - computed + 1
            if first <= finish:
                alloc_at.setdefault(first, []).append(num)
            finish_at.setdefault(finish, []).append(num)
            if self.caching:
                fill = bs - computed % bs
                if fill <= finish:
                    fill_at.setdefault(fill, []).append(num)
            sum_computed += computed
            num += 1
        self.num_prefix = self.alive = num
        self.sum_computed = sum_computed
        self.finish_step = finish_step
        self.alloc_at = alloc_at
        self.finish_at = finish_at
        self.fill_at = fill_at
        self.others = [
            _Other(i, r, req_blocks[r.request_id].num_slots)
            for i, r in enumerate(running[num:], num)
        ]
        self.allocated = 0

    @classmethod
    def start(cls, scheduler: Scheduler, stop_at_finish: bool) -> StretchPlanner | None:
        """A planner with its first step planned, or None when that step is not certain."""
        s = scheduler
        if not s.running or s.kv_cache.cow_pending or s.pending_outputs:
            return None
        head = s.waiting[0] if s.waiting else None
        if head is not None:
            n = head.sampling_params.n
            seats = n if n > 1 and not head.output_token_ids else 1
            if len(s.running) + s.fork_seats + seats > s.max_num_seqs:
                head = None  # no seat for it before someone finishes
            elif head.status is not RequestStatus.SWAPPED:
                if s.prefill_first:
                    return None  # prompts come first: the next step looks it up
                if _budget_left_estimate(s) > 0:
                    return None  # the head will be looked up: don't plan a failing step
        planner = cls(s, stop_at_finish)
        if planner.alive > planner.budget:
            return None  # not every decoder fits in a step
        planner.head = head
        return planner if planner.plan_step() else None

    def plan_step(self) -> bool:
        """Plan the next step; False (and nothing planned) if it is not certain."""
        if self.ended:
            return False
        plan = self.plan
        j = plan.num_steps + 1  # 1-based, as the buckets
        prefix_allocs = self.alloc_at.pop(j, None)
        allocs: list[tuple[int, int]] = []
        if prefix_allocs:
            prefix_allocs.sort()
            allocs = [(i, 1) for i in prefix_allocs]
        new_blocks = len(allocs)
        alive = self.alive
        budget = self.budget - alive
        num_tokens = num_samples = num_requests = num_decodes = alive
        context = self.sum_computed + j * alive
        prefill = 0
        chunks: list[Chunk] = []
        stepped: list[tuple[_Other, int, int]] = []  # (request, tokens, slots after)
        bs = self.bs
        for o in self.others:
            if budget <= 0:
                break
            computed = o.computed
            n = o.total - computed
            if n > 1:
                n = min(n, self.threshold, budget, self.max_model_len - computed)
            slots = o.slots
            if computed + n > slots:
                slots = -(-(computed + n) // bs) * bs
                need = (slots - o.slots) // bs
                allocs.append((o.index, need))
                new_blocks += need
            if computed + n == o.total:
                if not o.has_output and o.n > 1:
                    return self._end_before(prefix_allocs, j)  # a fork: a general step's job
                num_samples += 1
            if n == 1:
                num_decodes += 1
                context += computed + 1
            else:
                chunks.append((n, computed))
            if n > 1 or not o.has_output:
                prefill += n
            num_requests += 1
            num_tokens += n
            budget -= n
            stepped.append((o, n, slots))
        if self.allocated + new_blocks > self.free or not self._head_stays(budget, new_blocks):
            return self._end_before(prefix_allocs, j)
        self.allocated += new_blocks
        plan.num_steps = j
        plan.num_tokens.append(num_tokens)
        plan.num_prefill.append(prefill)
        plan.num_samples.append(num_samples)
        plan.num_requests.append(num_requests)
        plan.num_decodes.append(num_decodes)
        plan.context_sum.append(context)
        plan.chunks.append(chunks)
        plan.allocs.append(allocs)
        # the update, prefix decoders first (running order)
        if prefix_allocs:
            alloc_at = self.alloc_at
            finish_step = self.finish_step
            nxt = j + bs
            for i in prefix_allocs:
                if nxt <= finish_step[i]:
                    alloc_at.setdefault(nxt, []).append(i)
        fills = self.fill_at.pop(j, None)
        if fills:
            fills.sort()
            plan.fills.extend((j - 1, i) for i in fills)
        finished: list[int] = []
        done = self.finish_at.pop(j, None)
        if done:
            requests = plan.requests
            done.sort()
            for i in done:
                self.sum_computed -= requests[i].num_computed_tokens
                plan.last_sample[i] = j - 1
            self.alive -= len(done)
            finished.extend(done)
        for o, n, slots in stepped:
            i = o.index
            computed = o.computed + n
            o.computed = computed
            o.slots = slots
            plan.scheduled[i] += n
            if self.caching and computed % bs < n and not o.filled:
                o.filled = True
                plan.fills.append((j - 1, i))
            if computed == o.total:
                if plan.first_sample[i] < 0:
                    plan.first_sample[i] = j - 1
                o.total = computed + 1
                o.has_output = True
                if o.total >= o.max_num_tokens:
                    plan.last_sample[i] = j - 1
                    finished.append(i)
        if finished:
            self.others = [o for o in self.others if plan.last_sample[o.index] < 0]
            if self.stop_at_finish or not (self.alive or self.others):
                self.ended = True
        plan.finishes.append(finished)
        return True

    def _end_before(self, prefix_allocs: list[int] | None, j: int) -> bool:
        if prefix_allocs is not None:
            self.alloc_at[j] = prefix_allocs
        self.ended = True
        return False

    def _head_stays(self, budget: int, new_blocks: int) -> bool:
        """Whether the waiting head (if it could take a seat) stays out in this step
        without being tried: no budget is left for it. A swapped head may also be
        tried: that fails, changing nothing, when its blocks are not free."""
        head = self.head
        if head is None or budget <= 0:
            return True
        if head.status is not RequestStatus.SWAPPED:
            return False  # a lookup (it commits blocks and touches the radix tree)
        need = self.sched.swap_in_blocks(head, budget)
        return need is None or need > self.free - self.allocated - new_blocks

    def finish(self) -> StretchPlan:
        """The plan so far, with every sampling request's range of steps filled in."""
        plan = self.plan
        last = plan.num_steps - 1
        num = self.num_prefix
        plan.first_sample[:num] = [0] * num
        ends = [s if s >= 0 else last for s in plan.last_sample[:num]]
        plan.last_sample[:num] = ends
        plan.scheduled[:num] = [s + 1 for s in ends]
        for i in range(num, len(plan.requests)):
            if plan.first_sample[i] >= 0 and plan.last_sample[i] < 0:
                plan.last_sample[i] = last
        return plan
