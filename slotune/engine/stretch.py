"""Stretches: runs of engine steps worked out in advance and applied at once.

A simulated engine mostly repeats itself: decoding requests take one token per step, a
prompt takes its chunks, a new request is admitted when budget is left, now and then a
request finishes. Nothing in such a step needs the scheduler's general machinery
(preemption, copy-on-write, forks, prefix-cache hits), so ``StretchPlanner`` works out
step after step with integer bookkeeping only: what each step schedules (the numbers an
executor's cost model reads), which requests it admits, which blocks it allocates in which
order, which requests fill blocks, which sample and which finish. ``apply_stretch`` then
applies the planned steps: tokens appended in bulk, admissions, block allocations, prefix
commits and frees in exactly the order single steps make them. The state afterwards
(block ids, free-queue order and prefix-cache contents included) is the one that many
rounds of ``schedule`` and ``update_from_output`` leave.

Decoders in front of the running list (in running order, before the first request that is
still prefilling) are kept as aggregates, bucketed by the step of their next allocation,
block fill and finish; a request joins them as soon as everything in front of it decodes.
The others are stepped one by one.

A step is planned only when it is certain to be such a step: every running allocation fits
in the free blocks (frees during the stretch are counted, conservatively when blocks are
shared), every running decoder fits in the budget, no prompt needs a fork (``n > 1``), and
the waiting head either stays out without being tried (no budget left, no seat, or a
swapped head whose blocks are not free) or is a new request whose admission is certain: no
stop tokens, its first chunk's blocks are free, and its prefix lookup cannot hit (no prefix
cache, or a hash cache that holds nothing under its first block and no running request
that could commit one). A radix lookup touches the tree, so it ends a stretch.

Arrivals during a stretch reach the planner through ``arrive`` after the step they
follow. When a request finishes and the caller asks (it may send requests then), that step
is the last. Stop tokens are the caller's to check: it knows the tokens and may plan a
shorter stretch again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotune.engine.kv_cache.hash_cache import HashPrefixCache
from slotune.engine.request import Request, RequestStatus

if TYPE_CHECKING:
    from slotune.engine.scheduler import Scheduler

Chunk = tuple[int, int]  # (tokens, prior context) of a request taking more than one token

_STAYS = None  # the waiting head is not admitted in this step, and nothing changes
_UNSURE = False  # the next step might do something a plan cannot: end before it


class StretchPlan:
    """Planned steps, as lists indexed by step (0-based), and per request.

    ``requests`` are the running requests at the start in running order, then the ones the
    stretch admits, in admission order (so index order is running order). Request ``i``
    samples one token in each step from ``first_sample[i]`` through ``last_sample[i]``
    (``first_sample[i] == -1``: it does not sample) and computes ``scheduled[i]`` tokens.
    """

    __slots__ = (
        "_index",
        "admits",
        "agg_computed",
        "agg_start",
        "allocs",
        "arrivals",
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
        "num_start",
        "num_steps",
        "num_tokens",
        "progress",
        "requests",
        "scheduled",
        "start_computed",
    )

    def __init__(self, requests: list[Request]) -> None:
        self.requests = requests
        self.num_start = len(requests)
        self.num_steps = 0
        self.num_tokens: list[int] = []
        self.num_prefill: list[int] = []
        self.num_samples: list[int] = []
        self.num_requests: list[int] = []
        self.num_decodes: list[int] = []
        self.context_sum: list[int] = []
        self.chunks: list[list[Chunk]] = []
        self.allocs: list[list[tuple[int, int]]] = []  # per step: (request index, blocks)
        self.admits: list[list[tuple[int, int]]] = []  # per step: (request index, tokens)
        self.fills: list[list[int]] = []  # per step: requests that filled a block
        self.finishes: list[list[int]] = []  # per step: request indices, in running order
        self.arrivals: list[list[Request]] = []  # per step: requests arriving after it
        self.scheduled: list[int] = [0] * len(requests)
        self.first_sample = [-1] * len(requests)
        self.last_sample = [-1] * len(requests)
        self.start_computed = [r.num_computed_tokens for r in requests]
        # how far each request has computed: one token per step from step agg_start
        # (1-based; 0: never) on, from agg_computed; before that, (step, computed after)
        self.agg_start = [0] * len(requests)
        self.agg_computed = [0] * len(requests)
        self.progress: dict[int, list[tuple[int, int]]] = {}
        self._index: dict[str, int] | None = None  # built when apply_stretch first asks

    def index(self, request_id: str) -> int:
        """The plan index of a request."""
        if self._index is None:
            self._index = {r.request_id: i for i, r in enumerate(self.requests)}
        return self._index[request_id]

    def computed_after(self, i: int, k: int) -> int:
        """Request ``i``'s computed tokens after the first ``k`` steps."""
        s = self.agg_start[i]
        if s and k >= s - 1:
            return self.agg_computed[i] + k - s + 1
        computed = self.start_computed[i]
        for step, after in self.progress.get(i, ()):
            if step > k:
                break
            computed = after
        return computed

    def admit(self, request: Request) -> int:
        """A request admitted during the stretch; its index."""
        self.requests.append(request)
        self.scheduled.append(0)
        self.first_sample.append(-1)
        self.last_sample.append(-1)
        self.start_computed.append(0)
        self.agg_start.append(0)
        self.agg_computed.append(0)
        return len(self.requests) - 1


class _Other:
    """A running request behind a prefilling one, stepped one by one while planning."""

    __slots__ = (
        "computed",
        "extra",
        "has_output",
        "index",
        "max_num_tokens",
        "n",
        "slots",
        "total",
    )

    def __init__(self, index: int, req: Request, slots: int, extra: int = 0) -> None:
        self.index = index
        self.computed = req.num_computed_tokens
        self.total = len(req.all_token_ids)
        self.slots = slots
        self.extra = extra  # blocks allocated during the stretch
        self.has_output = bool(req.output_token_ids)
        self.max_num_tokens = req.max_num_tokens
        self.n = req.sampling_params.n


def _is_decoder(req: Request) -> bool:
    return len(req.all_token_ids) - req.num_computed_tokens == 1 and bool(req.output_token_ids)


class StretchPlanner:
    """Plans one step at a time (``plan_step``) so a caller can stop at its horizon."""

    def __init__(self, scheduler: Scheduler, stop_at_finish: bool) -> None:
        self.sched = scheduler
        kv = scheduler.kv_cache
        self.kv = kv
        self.bs = scheduler.block_size
        self.budget = scheduler.config.max_num_batched_tokens
        self.threshold = scheduler.threshold
        self.max_model_len = scheduler.max_model_len
        self.cache = kv.cache
        # the cache whose missing lookups a plan can make (see _certain_miss)
        self.hash_cache = kv.cache if isinstance(kv.cache, HashPrefixCache) else None
        self.free = kv.num_free_blocks
        self.free_exact = True  # False once a finish frees blocks still shared
        self.stop_at_finish = stop_at_finish
        self.ended = False
        self.waiting: list[Request] = list(scheduler.waiting)
        self.next_waiting = 0
        self.first_hashes: set[int] | None = None  # hash cache: see _certain_miss
        self.unknown_first_block = False
        running = scheduler.running
        self.plan = StretchPlan(list(running))
        num = len(running)
        # the aggregate: decoders in front of the running list
        self.alloc_at: dict[int, list[int]] = {}
        self.finish_at: dict[int, list[int]] = {}
        self.fill_at: dict[int, list[int]] = {}
        self.finish_step = [0] * num
        self.base = [0] * num  # context of request i in step j: base[i] + j
        self.extra = [0] * num  # blocks allocated during the stretch
        self.sum_base = 0
        self.alive = 0
        req_blocks = kv.req_blocks
        prefix = 0
        for req in running:
            if not _is_decoder(req):
                break
            self._join(
                prefix,
                req.num_computed_tokens,
                len(req.all_token_ids),
                req.max_num_tokens,
                req_blocks[req.request_id].num_slots,
                1,
            )
            prefix += 1
        self.others = [
            _Other(i, r, req_blocks[r.request_id].num_slots)
            for i, r in enumerate(running[prefix:], prefix)
        ]

    @classmethod
    def start(cls, scheduler: Scheduler, stop_at_finish: bool) -> StretchPlanner | None:
        """A planner with its first step planned, or None when that step is not certain."""
        s = scheduler
        if not (s.running or s.waiting) or s.kv_cache.cow_pending or s.pending_outputs:
            return None
        head = s.waiting[0] if s.waiting else None
        if head is not None and not _admission_may_be_certain(s, head):
            has_seat = len(s.running) + s.fork_seats + head.seats <= s.max_num_seqs
            if s.prefill_first or (has_seat and _budget_left_estimate(s) > 0):
                return None  # the next step tries the head: don't plan a failing step
        planner = cls(s, stop_at_finish)
        return planner if planner.plan_step() else None

    def _join(self, i: int, computed: int, total: int, max_tokens: int, slots: int, s: int) -> None:
        """Request ``i`` decodes in the aggregate from (1-based) step ``s`` on."""
        last = s + max_tokens - total - 1  # the step that samples its last token
        self.finish_step[i] = last
        self.finish_at.setdefault(last, []).append(i)
        alloc = s + slots - computed
        if alloc <= last:
            self.alloc_at.setdefault(alloc, []).append(i)
        if self.cache is not None:
            fill = s - 1 + self.bs - computed % self.bs
            if fill <= last:
                self.fill_at.setdefault(fill, []).append(i)
        self.base[i] = base = computed + 1 - s
        self.sum_base += base
        self.alive += 1
        plan = self.plan
        plan.agg_start[i] = s
        plan.agg_computed[i] = computed
        if plan.first_sample[i] < 0:
            plan.first_sample[i] = s - 1

    def arrive(self, requests: list[Request]) -> None:
        """Requests that arrive after the last planned step (they wait from the next one)."""
        self.plan.arrivals[-1].extend(requests)
        self.waiting.extend(requests)

    def plan_step(self) -> bool:
        """Plan the next step; False (and nothing planned) if it is not certain."""
        if self.ended:
            return False
        has_waiting = self.next_waiting < len(self.waiting)
        if not (self.alive or self.others or has_waiting) or self.alive > self.budget:
            return self._end_before(None, 0)
        if (
            has_waiting
            and self.sched.prefill_first
            and self.waiting[self.next_waiting].status is not RequestStatus.SWAPPED
        ):
            return self._end_before(None, 0)  # prompts come first: it is looked up
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
        context = self.sum_base + j * alive
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
        if new_blocks > self.free:
            return self._end_before(prefix_allocs, j)  # someone would be preempted
        admitted: list[tuple[_Other, int]] = []  # (request, tokens) in admission order
        free_left = self.free - new_blocks
        seated = alive + len(self.others)
        while budget > 0 and self.next_waiting + len(admitted) < len(self.waiting):
            head = self.waiting[self.next_waiting + len(admitted)]
            decision = self._admission(head, budget, seated + len(admitted), free_left)
            if decision is _STAYS:
                break
            if decision is _UNSURE:
                return self._end_before(prefix_allocs, j)
            n, blocks = decision  # type: ignore[misc]
            o = _Other(-1, head, blocks * bs, blocks)
            admitted.append((o, n))
            stepped.append((o, n, o.slots))
            free_left -= blocks
            new_blocks += blocks
            if n == o.total:
                num_samples += 1
            if n == 1:
                num_decodes += 1
                context += 1
            else:
                chunks.append((n, 0))
            prefill += n
            num_requests += 1
            num_tokens += n
            budget -= n
        if not num_tokens:
            return self._end_before(prefix_allocs, j)
        self.free -= new_blocks
        plan.num_steps = j
        plan.num_tokens.append(num_tokens)
        plan.num_prefill.append(prefill)
        plan.num_samples.append(num_samples)
        plan.num_requests.append(num_requests)
        plan.num_decodes.append(num_decodes)
        plan.context_sum.append(context)
        plan.chunks.append(chunks)
        plan.allocs.append(allocs)
        plan.arrivals.append([])
        admits: list[tuple[int, int]] = []
        if admitted:
            self._seat(admitted, admits)
        plan.admits.append(admits)
        self._update(j, prefix_allocs, stepped)
        return True

    def _seat(self, admitted: list[tuple[_Other, int]], admits: list[tuple[int, int]]) -> None:
        """Give the requests admitted in this step their plan indices."""
        plan = self.plan
        for o, n in admitted:
            req = self.waiting[self.next_waiting]
            self.next_waiting += 1
            o.index = plan.admit(req)
            self.finish_step.append(0)
            self.base.append(0)
            self.extra.append(0)
            admits.append((o.index, n))
            if self.first_hashes is not None:
                self._note_first_block(req)
            self.others.append(o)

    def _update(
        self, j: int, prefix_allocs: list[int] | None, stepped: list[tuple[_Other, int, int]]
    ) -> None:
        """What the update after step ``j`` does: fills, samples, finishes, frees."""
        plan = self.plan
        bs = self.bs
        if prefix_allocs:
            extra = self.extra
            for i in prefix_allocs:
                extra[i] += 1
            self._again(self.alloc_at, prefix_allocs, j + bs)
        fills: list[int] = []
        prefix_fills = self.fill_at.pop(j, None)
        if prefix_fills:
            prefix_fills.sort()
            fills = prefix_fills
            self._again(self.fill_at, prefix_fills, j + bs)
        finished: list[int] = []
        done = self.finish_at.pop(j, None)
        if done:
            done.sort()
            for i in done:
                self.sum_base -= self.base[i]
                plan.last_sample[i] = j - 1
                plan.scheduled[i] += j - plan.agg_start[i] + 1
                self._free_blocks_of(i, self.extra[i])
            self.alive -= len(done)
            finished.extend(done)
        caching = self.cache is not None
        progress = plan.progress
        for o, n, slots in stepped:
            i = o.index
            computed = o.computed + n
            o.computed = computed
            if slots != o.slots:
                o.extra += (slots - o.slots) // bs
                o.slots = slots
            plan.scheduled[i] += n
            if caching:
                progress.setdefault(i, []).append((j, computed))
                if computed % bs < n:
                    fills.append(i)
            if computed == o.total:
                if plan.first_sample[i] < 0:
                    plan.first_sample[i] = j - 1
                o.total = computed + 1
                o.has_output = True
                if o.total >= o.max_num_tokens:
                    plan.last_sample[i] = j - 1
                    finished.append(i)
                    self._free_blocks_of(i, o.extra)
        plan.fills.append(fills)
        if finished:
            self.others = [o for o in self.others if plan.last_sample[o.index] < 0]
            if self.stop_at_finish:
                self.ended = True
        plan.finishes.append(finished)
        others = self.others
        while others and others[0].total - others[0].computed == 1 and others[0].has_output:
            o = others.pop(0)
            self.extra[o.index] = o.extra
            self._join(o.index, o.computed, o.total, o.max_num_tokens, o.slots, j + 1)

    def _again(self, buckets: dict[int, list[int]], members: list[int], step: int) -> None:
        """Aggregate decoders allocate (or fill) a block every ``block_size`` steps: put
        ``members`` in the bucket of ``step`` unless they have finished by then."""
        finish_step = self.finish_step
        for i in members:
            if step <= finish_step[i]:
                buckets.setdefault(step, []).append(i)

    def _free_blocks_of(self, i: int, extra: int) -> None:
        """Count the blocks request ``i`` frees when it finishes (only those it alone held
        at the start come back; blocks shared then make the count a lower bound)."""
        freed = extra
        if i < self.plan.num_start:
            rid = self.plan.requests[i].request_id
            refs = [b.ref_cnt for b in self.kv.req_blocks[rid].blocks]
            alone = refs.count(1)
            if alone < len(refs):
                self.free_exact = False
            freed += alone
        self.free += freed

    def _admission(
        self, head: Request, budget: int, seated: int, free_left: int
    ) -> tuple[int, int] | bool | None:
        """What trying the waiting head does in this step: ``_STAYS``, ``_UNSURE``, or
        ``(tokens, blocks)`` of its certain admission."""
        s = self.sched
        seats = head.seats
        if seated + s.fork_seats + seats > s.max_num_seqs:
            return _STAYS  # not tried: no seat before someone finishes
        if head.status is RequestStatus.SWAPPED:
            need = s.swap_in_blocks(head, budget)
            if need is None:
                return _STAYS  # its chunk does not fit the budget: not tried
            if need > free_left and seated and self.free_exact:
                return _STAYS  # tried, fails, changes nothing
            return _UNSURE
        if not _admission_may_be_certain(s, head) or not self._certain_miss(head):
            return _UNSURE
        n = min(len(head.all_token_ids), self.threshold, budget)
        blocks = -(-n // self.bs)
        if blocks > free_left:
            if self.cache is None and seated and self.free_exact:
                return _STAYS  # no lookup; the allocation fails, changing nothing
            return _UNSURE
        return n, blocks

    def _certain_miss(self, head: Request) -> bool:
        """Whether the head's prefix lookup surely finds nothing (and so changes nothing
        beyond committing filled blocks, which ``apply_stretch`` repeats in order)."""
        if self.cache is None:
            return True
        cache = self.hash_cache
        if cache is None:
            return False
        tokens = head.all_token_ids
        if len(tokens) <= self.bs:
            return True  # no full block to look up
        if self.first_hashes is None:
            self.first_hashes = set()
            for req in self.plan.requests:
                self._note_first_block(req)
        if self.unknown_first_block:
            return False
        h0 = cache.first_block_hash(tokens)
        return h0 not in self.first_hashes and not cache.may_hit(h0)

    def _note_first_block(self, req: Request) -> None:
        """A running request may commit its first block before a later lookup."""
        tokens = req.all_token_ids
        if len(tokens) >= self.bs:
            self.first_hashes.add(self.hash_cache.first_block_hash(tokens))  # type: ignore[union-attr]
        elif req.max_num_tokens >= self.bs:
            self.unknown_first_block = True  # its first block holds tokens not sampled yet

    def _end_before(self, prefix_allocs: list[int] | None, j: int) -> bool:
        if prefix_allocs is not None:
            self.alloc_at[j] = prefix_allocs
        self.ended = True
        return False

    def finish(self) -> StretchPlan:
        """The plan so far, with every sampling request's range of steps filled in."""
        plan = self.plan
        last = plan.num_steps - 1
        for i, s in enumerate(plan.agg_start):
            if s and plan.last_sample[i] < 0:
                plan.last_sample[i] = last
                plan.scheduled[i] += last + 1 - s + 1
        for i in range(len(plan.requests)):
            if plan.first_sample[i] >= 0 and plan.last_sample[i] < 0:
                plan.last_sample[i] = last
        return plan


def _admission_may_be_certain(s: Scheduler, head: Request) -> bool:
    """Whether trying ``head`` could be planned at all: a swapped head (it may stay out),
    or a new request without stop tokens or fork, under the chunked policy, with no prefix
    cache or one whose missing lookups change nothing (hash, not radix)."""
    if head.status is RequestStatus.SWAPPED:
        return True
    cache = s.kv_cache.cache
    return (
        head.status is RequestStatus.WAITING
        and not s.prefill_first
        and head.sampling_params.n == 1
        and not head.stop_ids
        and (cache is None or isinstance(cache, HashPrefixCache))
    )


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
