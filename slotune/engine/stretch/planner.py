"""The stretch planner: works out step after step with integer bookkeeping only."""

from __future__ import annotations

import enum
import functools
from dataclasses import fields
from typing import NamedTuple

from slotune.engine.chunking import MeasuredStepTime
from slotune.engine.config import EngineConfig
from slotune.engine.kv_cache.hash_cache import HashPrefixCache
from slotune.engine.kv_cache.radix_cache import RadixPrefixCache
from slotune.engine.queues import PriorityWaiting
from slotune.engine.request import Request, RequestStatus
from slotune.engine.rules import (
    alloc_step,
    blocks_for,
    counts_as_prefill,
    fill_step,
    fills_block,
    first_chunk,
    is_decoder,
    is_decoding,
    length_step,
    needs_blocks,
    num_samples,
    reaches_length,
    swaps,
)
from slotune.engine.scheduler import Scheduler
from slotune.engine.sim.batch import batch_totals
from slotune.engine.stretch.plan import (
    Admit,
    Alloc,
    PlannedStep,
    Preempt,
    StretchPlan,
    WaitingView,
)

# Every EngineConfig field with the values the stretch equivalence tests cover (None: any).
# A new field, or a value not listed, makes the planner refuse until it is tested.
_TESTED_CONFIG: dict[str, frozenset[object] | None] = {
    "max_num_batched_tokens": None,
    "long_prefill_token_threshold": None,
    "block_size": None,
    "max_num_seqs": None,
    "max_model_len": None,
    # a step that preempts is planned where every victim is recomputed (under recompute, and
    # under hybrid below the swap threshold); a swap ends the stretch; swapped and
    # recompute-preempted heads are planned as above
    "preemption_mode": frozenset({"recompute", "swap", "hybrid"}),
    "swap_space_gb": None,
    "prefix_caching": frozenset({"none", "hash", "radix"}),
    "policy": frozenset({"chunked", "prefill_first"}),
    "gpu_memory_utilization": None,
    "num_gpu_blocks": None,
    "kv_cache_dtype": None,
    "num_speculative_tokens": frozenset({0}),  # a stretch plans one token per decode step
    "prompt_lookup_min": None,
    "prompt_lookup_max": None,
    "speculative_model": None,  # read only with speculation, refused above
    "speculative_acceptance": None,
    "scheduling_policy": frozenset({"fcfs"}),
    "swap_threshold_tokens": None,  # whether a hybrid victim swaps: a plan's never do
    "top_tier_kv_share": frozenset({0.0}),
    "top_tier_token_share": frozenset({0.0}),
    # a decode budget: a step preempts only victims that wait at the queue's front and
    # admits only requests that sort behind every running one; the stretch ends where a
    # watched request (one preempted before it, or in it and waiting still) comes due
    # (``Engine.run_stretch``, ``DueWatch``); waiting read in its priority order
    "decode_budget_ms": None,
    # each planned step takes the budget the scheduler's step_budget gives (a fixed
    # step-time model only: see refusal)
    "adaptive_chunk_ms": None,
}
_TESTED_CACHES = (type(None), HashPrefixCache, RadixPrefixCache)


@functools.cache
def untested_config(config: EngineConfig) -> str | None:
    """Why the planner refuses ``config`` (a field or value its tests do not cover), or
    None if it plans for it."""
    for f in fields(config):
        if f.name not in _TESTED_CONFIG:
            return f"EngineConfig.{f.name} is new to the stretch planner"
        tested = _TESTED_CONFIG[f.name]
        value = getattr(config, f.name)
        if tested is not None and value not in tested:
            return f"EngineConfig.{f.name}={value!r} is not covered by the stretch tests"
    return None


def refusal(scheduler: Scheduler) -> str | None:
    """Why the planner refuses to plan for ``scheduler`` now, or None: a configuration or
    prefix cache its tests do not cover, a running request that asks for logprobs (a
    stretch reports none), or adaptive chunking priced by the real engine's fit (it
    changes with each step run)."""
    if type(scheduler.kv_cache.cache) not in _TESTED_CACHES:
        return f"prefix cache {type(scheduler.kv_cache.cache).__name__} is not covered"
    untested = untested_config(scheduler.config)  # cached: before the walk of the running
    if untested is not None:
        return untested
    if any(r.sampling_params.logprobs for r in scheduler.running):
        return "a running request asks for logprobs"
    if scheduler.chunk_target_s is not None and isinstance(scheduler.step_time, MeasuredStepTime):
        return "adaptive chunking on a step-time fit that learns from every step"
    return None


class HeadWaits(enum.Enum):
    """What trying the waiting head does in a step, when it is not a certain admission."""

    STAYS = "stays"  # not admitted in this step, and nothing changes
    UNSURE = "unsure"  # the step might do something a plan cannot: end before it


class Admission(NamedTuple):
    """A certain admission of the waiting head: its first chunk, the free blocks it takes
    (its prefix-cache hit's included) and the tokens that hit holds."""

    tokens: int
    blocks: int
    hit: int = 0


class _Other:
    """A running request that prefills, stepped one by one while planning."""

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


class _Victim:
    """A request the stretch preempted (recompute), waiting: its plan index, its tokens
    and whether it has output; where it held all of its blocks alone, how many it freed,
    how many of them were cached (full and computed), the free blocks before it freed
    them and the blocks popped from the free queue's front by then (see
    ``StretchPlanner._victim_hit``; ``cached`` -1: not known)."""

    __slots__ = (
        "blocks",
        "cached",
        "checked_at",
        "free",
        "has_output",
        "index",
        "only_free",
        "popped",
        "request",
        "sole",
        "total",
    )

    def __init__(self, index: int, request: Request, total: int, has_output: bool) -> None:
        self.index = index
        self.request = request
        self.total = total
        self.has_output = has_output
        self.blocks = self.free = self.popped = 0
        self.cached = -1
        # _sole_chain and _hits_only_free, found when the plan had checked_at requests
        # (only an admission adds a running request that may share its first block)
        self.checked_at = -1
        self.sole = self.only_free = False


class StretchPlanner:
    """Plans one step at a time (``plan_step``) so a caller can stop at its horizon."""

    # slots: its attributes are read in every planned step (an instance dict of more than
    # 30 keys loses CPython's shared keys, and every attribute read slows down)
    __slots__ = (
        "adaptive",
        "admitted",
        "adopted",
        "alive",
        "alloc_at",
        "base",
        "bs",
        "budget",
        "cache",
        "ended",
        "extra",
        "fill_at",
        "finish_at",
        "finish_step",
        "first_hashes",
        "free",
        "free_exact",
        "hash_cache",
        "hit_lasts",
        "hit_len",
        "hit_of",
        "kv",
        "last_decoder",
        "last_key",
        "next_waiting",
        "num_adopted",
        "num_freed",
        "open_firsts",
        "others",
        "plan",
        "preempted",
        "sched",
        "step_allocs",
        "step_blocks",
        "step_preempts",
        "step_retry",
        "stepped",
        "stop_at_finish",
        "sum_base",
        "victims",
        "waiting",
    )

    def __init__(self, scheduler: Scheduler, stop_at_finish: bool) -> None:
        self.sched = scheduler
        kv = scheduler.kv_cache
        self.kv = kv
        self.bs = scheduler.block_size
        self.budget = scheduler.config.max_num_batched_tokens  # the ceiling when adaptive
        self.adaptive = scheduler.chunk_target_s is not None
        self.cache = kv.cache
        # the cache whose missing lookups a plan can make (see _certain_miss)
        self.hash_cache = kv.cache if isinstance(kv.cache, HashPrefixCache) else None
        self.free = kv.num_free_blocks
        self.free_exact = True  # False once a finish frees blocks still shared
        self.num_freed = 0  # blocks the planned finishes give back (see _free_blocks_of)
        self.stop_at_finish = stop_at_finish
        self.ended = False
        self.waiting = WaitingView(scheduler.waiting)
        self.next_waiting = 0
        # hash cache: the first-block hashes of the plan's requests, each with how many
        # requests have it (see _certain_miss)
        self.first_hashes: dict[int, int] | None = None
        # see _note_first_block; by first token (a long stretch notes thousands)
        self.open_firsts: dict[int, list[list[int]]] = {}
        # a preempted head's hit: the head, and its hit_lifetimes (see _preempted_head)
        self.hit_of: Request | None = None
        self.hit_lasts: list[int] | None = None
        self.hit_len = 0  # its hit in the step being planned
        # a planned admission adopted cached blocks (taken from inside the free queue, now
        # held): later lookups may hit them, and hit_lifetimes no longer holds
        self.adopted = False
        running = scheduler.running
        key = scheduler.key
        # under a queue order (a decode budget), the key the last seated request sorts by
        self.last_key = max(map(key, running), default=None) if key is not None else None
        self.plan = StretchPlan(list(running))
        num = len(running)
        # the aggregate: the running decoders, wherever they sit in the running list
        self.alloc_at: dict[int, list[int]] = {}
        self.finish_at: dict[int, list[int]] = {}
        self.fill_at: dict[int, list[int]] = {}
        self.finish_step = [0] * num
        self.base = [0] * num  # context of request i in step j: base[i] + j
        self.extra = [0] * num  # blocks allocated during the stretch
        self.sum_base = 0
        self.alive = 0
        # the plan index of the last aggregate decoder (-1: none; None: found again on use)
        self.last_decoder: int | None = -1
        self.others: list[_Other] = []  # the running requests that prefill, in running order
        for i, req in enumerate(running):
            slots = kv.num_slots(req.request_id)
            if is_decoder(req):
                computed = req.num_computed_tokens
                self._join(i, computed, computed + 1, req.max_num_tokens, slots, 1)
            else:
                self.others.append(_Other(i, req, slots))
        # the step being planned (``plan_step`` resets them; see serve_running)
        self.step_allocs: list[Alloc] = []
        self.step_blocks = 0  # blocks it allocates so far
        self.stepped: list[tuple[_Other, int, int]] = []  # (request, tokens, slots after)
        self.admitted: list[tuple[_Other, int]] = []  # (request, tokens) in admission order
        self.step_retry: tuple[int, int] | None = None  # the head tried: PlannedStep.retry
        self.preempted = False  # whether the step being planned preempts (Passes.preempted)
        self.step_preempts: list[Preempt] | None = None  # its PlannedStep.preempts
        # the requests the stretch preempted (the last is the waiting head), each with its
        # tokens; no later step of the stretch admits one
        self.victims: list[_Victim] = []
        self.num_adopted = 0  # cached blocks planned admissions took from inside the free queue

    @classmethod
    def start(cls, scheduler: Scheduler, stop_at_finish: bool) -> StretchPlanner | None:
        """A planner with its first step planned, or None when that step is not certain
        (or the configuration is one the planner refuses, see ``refusal``)."""
        s = scheduler
        if not (s.running or s.waiting) or s.kv_cache.cow_pending or s.pending_outputs:
            return None
        head = s.waiting[0] if s.waiting else None
        # a head that is tried (it has a seat; prefill-first tries it first) but whose
        # admission cannot be planned: don't plan a failing step
        if (
            head is not None
            and not _admission_may_be_certain(s, head)
            and s.has_seat_for(head, len(s.running))
            and (s.prefill_first or _budget_left_estimate(s) > 0)
        ):
            return None
        if refusal(s) is not None:  # after the head: it walks every running request
            return None
        planner = cls(s, stop_at_finish)
        return planner if planner.plan_step() else None

    def _join(self, i: int, computed: int, total: int, max_tokens: int, slots: int, s: int) -> None:
        """Request ``i`` decodes in the aggregate from (1-based) step ``s`` on."""
        last = length_step(s, total, max_tokens)  # the step that samples its last token
        self.finish_step[i] = last
        self.finish_at.setdefault(last, []).append(i)
        alloc = alloc_step(s, computed, slots)
        if alloc <= last:
            self.alloc_at.setdefault(alloc, []).append(i)
        if self.cache is not None:
            fill = fill_step(s, computed, self.bs)
            if fill <= last:
                self.fill_at.setdefault(fill, []).append(i)
        self.base[i] = base = computed + 1 - s
        self.sum_base += base
        self.alive += 1
        if self.last_decoder is not None and i > self.last_decoder:
            self.last_decoder = i
        member = self.plan.requests[i]
        member.agg_start = s
        member.agg_computed = computed
        if member.first_sample < 0:
            member.first_sample = s - 1

    def arrive(self, requests: list[Request]) -> None:
        """Requests that arrive after the last planned step (they wait from the next one)."""
        self.plan.steps[-1].arrivals.extend(requests)
        self.waiting.extend(requests)

    def plan_step(self) -> bool:
        """Plan the next step; False (and nothing planned) if it is not certain."""
        if self.ended:
            return False
        if not (self.alive or self.others or self.victims or self.next_waiting < len(self.waiting)):
            return self._end_before(None, 0)
        plan = self.plan
        j = len(plan.steps) + 1  # 1-based, as the buckets
        prefix_allocs = self.alloc_at.pop(j, None)
        if prefix_allocs:
            prefix_allocs.sort()
            self.step_allocs = [(i, 1) for i in prefix_allocs]
        else:
            self.step_allocs = []
        self.step_blocks = len(self.step_allocs)
        stepped = self.stepped
        if stepped:  # cleared, not replaced: a new list every step shows in the counts
            stepped.clear()
            self.admitted.clear()
        budget = self._step_budget(j) if self.adaptive else self.budget
        self.preempted = False
        try:
            left = self.sched.run_passes(self, budget)
        except _Unsure:
            return self._end_before(prefix_allocs, j)
        if self.preempted and prefix_allocs:
            kept = {i for i, _ in self.step_allocs}
            prefix_allocs = [i for i in prefix_allocs if i in kept]
        num_tokens = budget - left
        if not num_tokens:
            return self._end_before(prefix_allocs, j)
        alive = self.alive
        num_sampled = alive
        prefill = 0
        if stepped:  # the aggregate decoders are added in closed form below
            for o, n, _ in stepped:
                if o.computed + n == o.total:
                    num_sampled += num_samples(o.has_output, o.n)
                if o.index < 0 or counts_as_prefill(n, o.has_output):  # (re)starts do
                    prefill += n
            num_decodes, context, chunks = batch_totals([(n, o.computed) for o, n, _ in stepped])
        else:
            num_decodes = context = 0
            chunks = []
        self.free -= self.step_blocks
        step = PlannedStep(
            num_tokens,
            prefill,
            num_sampled,
            alive + len(stepped),
            alive + num_decodes,
            # each aggregate decoder reads its context in step j: base + j (see _join)
            self.sum_base + j * alive + context,
            chunks,
            self.step_allocs,
            [],
            [],
            [],
            [],
        )
        if self.step_retry is not None:
            step.retry = self.step_retry
            self.step_retry = None
        if self.preempted:
            step.preempts = self.step_preempts
        plan.steps.append(step)
        if self.admitted:
            self._seat(self.admitted, step.admits)
        self._update(j, step, prefix_allocs, stepped)
        return True

    def _step_budget(self, j: int) -> int:
        """Adaptive chunking: step ``j``'s budget, from the running requests as
        ``Scheduler.step_budget`` counts them (the aggregate decoders read ``base + j``
        each; every other running request prefills)."""
        prior = self.others[0].computed if self.others else 0
        return self.sched.budget_for(self.alive, self.sum_base + j * self.alive, prior)

    # -- the step being planned: its passes (``Passes``), which ``Scheduler.run_passes``
    # calls in the scheduler's order with the scheduler's budget. A pass that would
    # swap, fork or try the waiting head uncertainly raises ``_Unsure``; aggregate
    # decoders take their tokens first (they lead the running list).

    def head(self) -> Request | None:
        return self.waiting[self.next_waiting] if self.next_waiting < len(self.waiting) else None

    def serve_running(self, budget: int) -> int:
        alive = self.alive
        if alive > budget:
            raise _Unsure  # some aggregate decoders would not get their token
        left = self._serve_others(budget - alive) if self.others else budget - alive
        if self.step_blocks > self.free:
            return self._make_room(budget)
        return left

    def _serve_others(self, budget: int) -> int:
        """The prefilling requests take their tokens in running order (their allocations
        noted as if all fit: ``_make_room`` corrects that). The aggregate decoders took
        theirs first, so each of these sees the budget less every decoder's token, where
        the scheduler's pass, in running order, leaves it those of the decoders behind it
        too: the same chunk unless the budget binds it, so a bound chunk (or a request the
        spent budget leaves out) with a decoder behind it ends the stretch."""
        s = self.sched
        bs = self.bs
        allocs = self.step_allocs
        num_prefix_allocs = len(allocs)
        stepped = self.stepped
        new_blocks = 0
        for o in self.others:
            computed = o.computed
            left = o.total - computed
            if budget <= 0:
                if self._last_decoder() > o.index:
                    raise _Unsure  # the pass would give it the tokens of decoders behind it
                break
            n = s.running_tokens(left, computed, budget)
            if (
                n == budget
                and self._last_decoder() > o.index
                and s.running_tokens(left, computed, budget + 1) != n
            ):
                raise _Unsure  # as above: its chunk would be larger
            slots = o.slots
            if needs_blocks(computed, n, slots):
                slots = blocks_for(computed + n, bs) * bs
                need = (slots - o.slots) // bs
                allocs.append((o.index, need))
                new_blocks += need
            if n == left and num_samples(o.has_output, o.n) > 1:
                raise _Unsure  # a fork: a general step's job
            budget -= n
            stepped.append((o, n, slots))
        if new_blocks:
            self.step_blocks += new_blocks
            k = num_prefix_allocs
            if k and allocs[k][0] < allocs[k - 1][0]:
                allocs.sort()  # in running order, as the pass allocates
        return budget

    def _last_decoder(self) -> int:
        """The plan index of the last aggregate decoder in running order (-1: none)."""
        last = self.last_decoder
        if last is None:
            buckets = self.finish_at.values()
            last = self.last_decoder = max((max(b) for b in buckets if b), default=-1)
        return last

    def _make_room(self, budget: int) -> int:
        """The running requests' allocations do not all fit: replay ``Scheduler._make_room``
        in running order (victims from its tail, aggregate decoders or not) and keep only
        what the step then serves. What it leaves of ``budget`` (the running pass's);
        raises ``_Unsure`` where that is not exact."""
        s = self.sched
        if s.prefill_first or s.preemption_mode == "swap" or not self.free_exact:
            raise _Unsure  # swaps, or a free count that is only a lower bound
        hybrid = s.preemption_mode == "hybrid"
        # under a queue order (a decode budget) each victim must wait at the queue's front,
        # where the plan puts it: it sorts before the head it would go in front of
        head = self._waiting_head_rank() if s.key is not None else None
        j = len(self.plan.steps) + 1
        members = self.plan.requests
        others = {o.index: o for o in self.others}
        order = self._aggregate(others)
        assert len(order) == self.alive + len(others)
        # what the pass visits if all fits: the requests the budget leaves out follow
        # every decoder (``_serve_others``)
        served = self.alive + len(self.stepped)
        need = dict(self.step_allocs)
        avail, exact = self.free, True
        tail = len(order)
        # (allocations before it, request index, blocks it frees, all it held, free before)
        victims: list[tuple[int, int, int, bool, int]] = []
        num_allocs = 0
        k = 0
        while k < min(served, tail):
            i = order[k]
            n = need.get(i, 0)
            while n > avail:
                if not exact:
                    raise _Unsure  # a victim's blocks shared with an earlier victim
                tail -= 1
                v = order[tail]
                if v == i and not tail:
                    raise _Unsure  # alone, it finishes with "length"
                if members[v].request.sampling_params.n != 1:
                    raise _Unsure  # a fork's seats
                if s.key is not None:
                    rank = self._rank(members[v].request)
                    if head is not None and not rank < head:
                        raise _Unsure  # it waits behind the head: not where the plan puts it
                    head = rank
                o = others.get(v)
                if hybrid:  # its computed tokens as ``_preempt_victims`` counts them
                    computed = o.computed if o is not None else self.base[v] + j - 1
                    if swaps(s.preemption_mode, computed, s.swap_threshold):
                        raise _Unsure  # it would be swapped out
                freed, alone = self._victim_frees(v, o)
                exact = exact and alone
                victims.append((num_allocs, v, freed, alone, avail))
                if v == i:
                    break
                avail += freed
            if tail <= k:
                break  # the request itself was preempted
            if n:
                avail -= n
                num_allocs += 1
            k += 1
        self.free_exact = exact
        self.preempted = True
        self._preempt_victims(victims)
        last_served = order[k - 1] if k else -1
        stepped = self.stepped
        cut = len(stepped)
        while cut and stepped[cut - 1][0].index > last_served:
            cut -= 1
        del stepped[cut:]
        gone = {v for _, v, _, _, _ in victims}
        kept = [(i, n) for i, n in self.step_allocs if i not in gone]
        self.step_allocs = kept
        self.step_blocks = sum(n for _, n in kept)
        return budget - self.alive - sum(n for _, n, _ in self.stepped)

    def _waiting_head_rank(self) -> tuple | None:
        """Where the waiting head sorts in the queue's order (None: nothing waits): the
        last victim of the stretch, else the first request still waiting."""
        if self.victims:
            return self._rank(self.victims[-1].request)
        if self.next_waiting < len(self.waiting):
            return self._rank(self.waiting[self.next_waiting])
        return None

    def _rank(self, req: Request) -> tuple:
        """Where ``req`` sorts in the decode budget's waiting queue."""
        waiting = self.sched.waiting
        assert isinstance(waiting, PriorityWaiting)
        return waiting.rank(req)

    def _aggregate(self, others: dict[int, _Other]) -> list[int]:
        """The aggregate decoders of the step being planned and ``others``, in running
        order."""
        return sorted([*(i for bucket in self.finish_at.values() for i in bucket), *others])

    def _victim_frees(self, i: int, other: _Other | None) -> tuple[int, bool]:
        """The blocks request ``i`` frees when preempted (``other``: it, if it prefills;
        None for an aggregate decoder), and whether that is all it holds (blocks shared at
        the start stay held: see ``_free_blocks_of``)."""
        extra = other.extra if other is not None else self.extra[i]
        if i >= self.plan.num_start:
            return extra, True
        alone, held = self.kv.blocks_held_alone(self.plan.requests[i].request.request_id)
        return extra + alone, alone == held

    def _preempt_victims(self, victims: list[tuple[int, int, int, bool, int]]) -> None:
        """Take the ``victims`` (in the order the scheduler takes them, from the tail; see
        ``_make_room``) out of the running requests of the step being planned and put them
        at the waiting front."""
        j = len(self.plan.steps) + 1
        members = self.plan.requests
        others = {o.index: o for o in self.others}
        preempts = self.step_preempts = []
        # the blocks popped from the free queue's front so far, but for the free count
        popped = self.kv.num_free_blocks + self.num_freed - self.num_adopted
        for num_allocs, i, freed, alone, free in victims:
            member = members[i]
            o = others.pop(i, None)
            if o is None:  # an aggregate decoder: out of its buckets
                computed = self.base[i] + j - 1
                total, has_output = computed + 1, True
                self.alive -= 1
                if i == self.last_decoder:
                    self.last_decoder = None
                self.sum_base -= self.base[i]
                member.scheduled += j - member.agg_start
                for buckets in (self.alloc_at, self.fill_at, self.finish_at):
                    for bucket in buckets.values():
                        if i in bucket:
                            bucket.remove(i)
            else:
                computed, total, has_output = o.computed, o.total, o.has_output
            member.preempted = j - 1
            member.preempted_with_output = has_output
            member.last_sample = j - 2
            if member.first_sample < 0 or member.first_sample > j - 2:
                member.first_sample = member.last_sample = -1
            preempts.append((num_allocs, i, computed))
            victim = _Victim(i, member.request, total, has_output)
            if alone:  # its blocks go to the free queue's tail, its first block last
                victim.blocks = freed
                victim.cached = min(computed // self.bs, freed)
                victim.free = free
                victim.popped = popped - free
            self.free += freed
            self.num_freed += freed
            popped += freed
            self.victims.append(victim)
        self.others = list(others.values())

    def serve_waiting(self, budget: int, kinds: int) -> int:
        waiting = self.waiting
        victims = self.victims
        if budget <= 0 or not (victims or self.next_waiting < len(waiting)):
            return budget
        s = self.sched
        admitted = self.admitted
        free_left = self.free - self.step_blocks
        seated = self.alive + len(self.others)
        while budget > 0:
            k = len(admitted)  # the heads in front: the victims (the last first), then waiting
            victim = victims[-1 - k] if k < len(victims) else None
            if victim is not None:
                head = victim.request
            elif self.next_waiting + k - len(victims) < len(waiting):
                head = waiting[self.next_waiting + k - len(victims)]
            else:
                break
            num_seated = seated + k
            avail = s.head_budget(head, kinds, budget, num_seated)
            if avail <= 0:
                break
            if victim is None:
                decision = self._admission(head, avail, num_seated, free_left)
                if isinstance(decision, Admission) and not self._seated_last(head):
                    raise _Unsure
            else:
                decision = self._readmission(victim, avail, num_seated, free_left)
                if isinstance(decision, Admission) and not self._seated_last(head):
                    raise _Unsure  # it takes its place in the running order by its key
            if decision is HeadWaits.STAYS:
                break
            if decision is HeadWaits.UNSURE:
                raise _Unsure
            n, blocks, hit = decision
            o = _Other(-1, head, blocks * self.bs, blocks)
            o.computed = hit  # a readmission starts from its hit (all of whose blocks it takes)
            if victim is not None:  # the request as the stretch preempted it
                o.total, o.has_output = victim.total, victim.has_output
            admitted.append((o, n))
            self.stepped.append((o, n, o.slots))
            free_left -= blocks
            self.step_blocks += blocks
            budget -= n
        return budget

    def _seated_last(self, head: Request) -> bool:
        """Whether admitting ``head`` seats it behind every running request, as the plan
        does: always in admission order; under a decode budget (running requests in
        ``rules.queue_key`` order) for a request, new or readmitted, that sorts last so
        far."""
        key = self.sched.key
        if key is None:
            return True
        if self.sched.budget_s is None:
            return False
        head_key = key(head)
        if self.last_key is not None and head_key < self.last_key:
            return False
        self.last_key = head_key
        return True

    def _readmission(
        self, victim: _Victim, budget: int, seated: int, free_left: int
    ) -> Admission | HeadWaits:
        """Trying a request the stretch preempted, as ``_preempted_head`` does for one
        preempted before: its lookup finds the hit ``_victim_hit`` knows, or, where that
        is not known but only free blocks can be found (``_hits_only_free``), at least as
        many blocks as its first chunk from token 0 takes: then it can only stay out."""
        s = self.sched
        if not seated or s.prefill_first:
            return HeadWaits.UNSURE  # alone it would be finished if it did not fit
        head, bs = victim.request, self.bs
        hit = self._victim_hit(victim, free_left)
        if hit < 0:
            n = first_chunk(victim.total, s.threshold, budget, s.prefill_first)
            if n is None or self.kv.blocks_needed(n) <= free_left or not self.free_exact:
                return HeadWaits.UNSURE
            if not self._hits_only_free(victim):
                return HeadWaits.UNSURE
            if self.cache is not None:  # its lookup commits filled blocks: apply does too
                self.step_retry = (0, n)
            return HeadWaits.STAYS
        hit_tokens = hit * bs
        n = first_chunk(victim.total - hit_tokens, s.threshold, budget, s.prefill_first)
        if n is None:
            return HeadWaits.UNSURE
        takes = self.kv.admission_takes(hit_tokens + n, hit, hit)
        if takes > free_left:
            if not self.free_exact:
                return HeadWaits.UNSURE
            if self.cache is not None:
                self.step_retry = (hit_tokens, n)
            return HeadWaits.STAYS
        if head.stop_ids or head.sampling_params.logprobs:
            return HeadWaits.UNSURE  # a stop is a general step's job (its n is 1)
        if hit:
            self.adopted = True
            self.num_adopted += hit
        return Admission(n, takes, hit_tokens)

    def _victim_hit(self, victim: _Victim, free_left: int) -> int:
        """The blocks a lookup of ``victim`` finds now (-1: not known). Under a hash cache
        only its own blocks hold its chain's keys when it alone ever committed under its
        first block and no lookup replayed it, and no other request of the plan shares
        that block; they went to the free queue's tail when it was preempted, its first
        block last, and the pool hands out the front first."""
        total = victim.total
        if self.cache is None or total <= self.bs:
            return 0
        if self.hash_cache is None or victim.cached < 0:
            return -1
        self._check_sharing(victim)
        if not victim.sole:
            return -1
        popped = self.kv.num_free_blocks + self.num_freed - free_left - self.num_adopted
        left = victim.free + victim.blocks - (popped - victim.popped)
        return max(0, min(victim.cached, (total - 1) // self.bs, left))

    def _sole_chain(self, victim: _Victim) -> bool:
        """Whether ``victim`` alone holds keys of its chain (see ``_victim_hit``)."""
        assert self.hash_cache is not None
        req = victim.request
        held = self.kv.req_blocks.get(req.request_id)
        return self._first_block_alone(req) and self.hash_cache.sole_committer(
            req.all_token_ids, held.cache_state if held else None
        )

    def _first_block_alone(self, req: Request) -> bool:
        """Whether no other request of the plan has (or may come to have) the first block
        of ``req``, under a hash cache; False when that block holds tokens the stretch
        samples."""
        tokens = req.all_token_ids
        if len(tokens) < self.bs:
            return False
        assert self.hash_cache is not None
        if self._may_share_open_first(tokens):
            return False
        return self._first_hashes().get(self.hash_cache.first_block_hash(tokens), 0) <= 1

    def _hits_only_free(self, victim: _Victim) -> bool:
        """Whether a lookup of ``victim`` finds only free blocks: no cache, or a hash cache
        and no other request of the plan (so none running) that shares (or may come to
        share) its first block. A tree's lookup touches the tree."""
        if self.cache is None or victim.total <= self.bs:
            return True
        if self.hash_cache is None:
            return False
        self._check_sharing(victim)
        return victim.only_free

    def _check_sharing(self, victim: _Victim) -> None:
        """Find ``victim.sole`` and ``victim.only_free`` again if a request joined since."""
        num = len(self.plan.requests)
        if victim.checked_at != num:
            victim.checked_at = num
            victim.only_free = self._first_block_alone(victim.request)
            victim.sole = victim.only_free and self._sole_chain(victim)

    def _seat(self, admitted: list[tuple[_Other, int]], admits: list[Admit]) -> None:
        """Give the requests admitted in this step their plan indices."""
        plan = self.plan
        for o, n in admitted:
            victim = self.victims.pop() if self.victims else None
            if victim is None:
                req = self.waiting[self.next_waiting]
                self.next_waiting += 1
            else:
                req = victim.request
            o.index = plan.admit(req, o.computed)
            if victim is not None:
                plan.requests[victim.index].next_stay = o.index
            self.finish_step.append(0)
            self.base.append(0)
            self.extra.append(0)
            admits.append((o.index, n))
            if self.first_hashes is not None and victim is None:  # a victim's is noted
                self._note_first_block(req)
            self.others.append(o)

    def _update(
        self,
        j: int,
        step: PlannedStep,
        prefix_allocs: list[int] | None,
        stepped: list[tuple[_Other, int, int]],
    ) -> None:
        """What the update after step ``j`` does: fills, samples, finishes, frees."""
        members = self.plan.requests
        bs = self.bs
        if prefix_allocs:
            extra = self.extra
            for i in prefix_allocs:
                extra[i] += 1
            self._again(self.alloc_at, prefix_allocs, j + bs)
        fills = step.fills
        prefix_fills = self.fill_at.pop(j, None)
        if prefix_fills:
            prefix_fills.sort()
            fills = step.fills = prefix_fills
            self._again(self.fill_at, prefix_fills, j + bs)
        finished = step.finishes
        done = self.finish_at.pop(j, None)
        if done:
            done.sort()
            for i in done:
                self.sum_base -= self.base[i]
                member = members[i]
                member.last_sample = j - 1
                member.scheduled += j - member.agg_start + 1
                self._free_blocks_of(i, self.extra[i])
            self.alive -= len(done)
            if done[-1] == self.last_decoder:
                self.last_decoder = None
            finished.extend(done)
        caching = self.cache is not None
        num_prefix_fills = len(fills)
        num_prefix_finishes = len(finished)
        # of the requests stepped one by one: those that finished or decode from now on
        leaving: list[_Other] | None = None
        for o, n, slots in stepped:
            i = o.index
            member = members[i]
            computed = o.computed + n
            o.computed = computed
            if slots != o.slots:
                o.extra += (slots - o.slots) // bs
                o.slots = slots
            member.scheduled += n
            if caching:
                if member.progress is None:
                    member.progress = []
                member.progress.append((j, computed))
                if fills_block(computed, n, bs):
                    fills.append(i)
            if computed == o.total:
                if member.first_sample < 0:
                    member.first_sample = j - 1
                o.total = computed + 1
                o.has_output = True
                if reaches_length(o.total, o.max_num_tokens):
                    member.last_sample = j - 1
                    finished.append(i)
                    self._free_blocks_of(i, o.extra)
            if is_decoding(o.total - o.computed, o.has_output):  # finished ones too
                if leaving is None:
                    leaving = []
                leaving.append(o)
        if num_prefix_fills and len(fills) > num_prefix_fills:
            fills.sort()  # in running order, as the update commits them
        if finished:
            if num_prefix_finishes and len(finished) > num_prefix_finishes:
                finished.sort()
            if self.stop_at_finish:
                self.ended = True
        if leaving:
            left = set(map(id, leaving))
            self.others = [o for o in self.others if id(o) not in left]
            extra = self.extra
            for o in leaving:
                if members[o.index].last_sample < 0:  # not finished: it joins the decoders
                    extra[o.index] = o.extra
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
            rid = self.plan.requests[i].request.request_id
            alone, held = self.kv.blocks_held_alone(rid)
            if alone < held:
                self.free_exact = False
            freed += alone
        self.free += freed
        self.num_freed += freed

    def _admission(
        self, head: Request, budget: int, seated: int, free_left: int
    ) -> Admission | HeadWaits:
        """What trying the waiting head with ``budget`` tokens (its ``head_budget``) does
        in this step, next to ``seated`` running requests with ``free_left`` blocks."""
        s = self.sched
        if head.status is RequestStatus.SWAPPED:
            need = s.swap_in_need(head, budget)
            if need is None:
                return HeadWaits.STAYS  # its chunk does not fit the budget: not tried
            if need > free_left and seated and self.free_exact:
                return HeadWaits.STAYS  # tried, fails, changes nothing
            return HeadWaits.UNSURE
        if head.status is RequestStatus.PREEMPTED:
            return self._preempted_head(head, budget, seated, free_left)
        if not _admission_may_be_certain(s, head) or not self._certain_miss(head):
            return HeadWaits.UNSURE
        n = s.chunk(head, 0, budget)
        if n is None:  # not reached: prefill-first admissions are not planned
            return HeadWaits.UNSURE
        blocks = self.kv.blocks_needed(n)
        if blocks > free_left:
            if not (seated and self.free_exact):
                return HeadWaits.UNSURE
            if self.cache is not None:  # its lookup commits filled blocks: apply does too
                self.step_retry = (0, n)
            return HeadWaits.STAYS  # the allocation fails, changing nothing
        return Admission(n, blocks)

    def _preempted_head(
        self, head: Request, budget: int, seated: int, free_left: int
    ) -> Admission | HeadWaits:
        """A recompute-preempted head (under the chunked policy): STAYS when trying it
        surely fails, noting its lookup (``PlannedStep.retry``), whose commits
        ``apply_stretch`` makes; an ``Admission`` with its hit when it surely fits. Its
        blocks are still cached, so its lookup may hit; the hit cannot grow (no running
        request can commit into its chain: ``_chain_closed``) and shrinks only as the
        planned allocations hand its free blocks out (``hit_lifetimes``), so its length in
        this step is known, and so is what its first chunk would take."""
        if self.adopted or not (seated and self.free_exact) or self.sched.prefill_first:
            # alone it would be finished; the free count is only a lower bound; or
            # (prefill-first) it is tried before the running requests allocate
            return HeadWaits.UNSURE
        if self.hit_of is not head:
            self.hit_of = head
            self.hit_lasts = self.kv.hit_lifetimes(head) if self._chain_closed(head) else None
            self.hit_len = len(self.hit_lasts or ())
        lasts = self.hit_lasts
        if lasts is None:
            return HeadWaits.UNSURE
        # the blocks handed out so far (only grows): the free count's fall, but for frees
        allocated = self.kv.num_free_blocks + self.num_freed - free_left
        num_hit = self.hit_len
        while num_hit and lasts[num_hit - 1] < allocated:  # the prefix minima only fall
            num_hit -= 1
        self.hit_len = num_hit
        hit_tokens = num_hit * self.bs
        n = self.sched.chunk(head, hit_tokens, budget)
        if n is None:
            return HeadWaits.UNSURE
        takes = self.kv.admission_takes(hit_tokens + n, num_hit, num_hit)
        if takes > free_left:
            self.step_retry = (hit_tokens, n)
            return HeadWaits.STAYS
        params = head.sampling_params
        if params.n != 1 or params.logprobs or head.stop_ids:
            return HeadWaits.UNSURE  # admitted, but a fork or a stop is a general step's job
        self.adopted = num_hit > 0
        self.num_adopted += num_hit
        return Admission(n, takes, hit_tokens)

    def _chain_closed(self, head: Request) -> bool:
        """Whether no running or admitted request can commit a block that a lookup of
        ``head`` would find (none shares its first block), under a hash cache or none."""
        return self._lookup_start(head)[0]

    def _certain_miss(self, head: Request) -> bool:
        """Whether the head's prefix lookup surely finds nothing (and so changes nothing
        beyond committing filled blocks, which ``apply_stretch`` repeats in order)."""
        closed, h0 = self._lookup_start(head)
        if not closed or h0 is None:
            return closed
        assert self.hash_cache is not None  # only a hash cache gives h0
        return not self.hash_cache.may_hit(h0)

    def _lookup_start(self, head: Request) -> tuple[bool, int | None]:
        """``_chain_closed``, and the hash a lookup of ``head`` starts from (None: no
        cache, or no full block to look up)."""
        if self.cache is None:
            return True, None
        cache = self.hash_cache
        if cache is None:
            return False, None
        tokens = head.all_token_ids
        if len(tokens) <= self.bs:
            return True, None  # no full block to look up
        if self._may_share_open_first(tokens):
            return False, None
        h0 = cache.first_block_hash(tokens)
        return h0 not in self._first_hashes(), h0

    def _first_hashes(self) -> dict[int, int]:
        """``first_hashes``, noted on first use."""
        if self.first_hashes is None:
            self.first_hashes = {}
            for req in {id(m.request): m.request for m in self.plan.requests}.values():
                self._note_first_block(req)
        return self.first_hashes

    def _may_share_open_first(self, tokens: list[int]) -> bool:
        """Whether a request of the plan whose first block is still open may share the
        first block of ``tokens`` (see ``_note_first_block``)."""
        self._first_hashes()
        known = self.open_firsts.get(tokens[0], ()) if tokens else ()
        return any(tokens[: len(k)] == k for k in known)

    def _note_first_block(self, req: Request) -> None:
        """A running request may commit its first block before a later lookup. One whose
        first block is still open (it will hold tokens not sampled yet) can only be shared
        by a lookup that starts with all of its tokens so far (a different first block
        hashes differently)."""
        tokens = req.all_token_ids
        if len(tokens) >= self.bs:
            assert self.hash_cache is not None and self.first_hashes is not None
            h0 = self.hash_cache.first_block_hash(tokens)
            self.first_hashes[h0] = self.first_hashes.get(h0, 0) + 1
        elif req.max_num_tokens >= self.bs:
            self.open_firsts.setdefault(tokens[0], []).append(tokens)

    def _end_before(self, prefix_allocs: list[int] | None, j: int) -> bool:
        if prefix_allocs is not None:
            self.alloc_at[j] = prefix_allocs
        self.ended = True
        return False

    def finish(self) -> StretchPlan:
        """The plan so far, with every sampling request's range of steps filled in."""
        plan = self.plan
        last = plan.num_steps - 1
        for member in plan.requests:
            if member.first_sample > last:  # joined the decoders for a step not planned
                member.first_sample = -1
            elif member.last_sample < 0 and member.first_sample >= 0:
                member.last_sample = last
                s = member.agg_start
                if s:
                    member.scheduled += last + 1 - s + 1
        return plan


class _Unsure(Exception):
    """A pass of the step being planned would do what a plan cannot."""


def _admission_may_be_certain(s: Scheduler, head: Request) -> bool:
    """Whether trying ``head`` could be planned at all: a swapped head (it may stay out);
    under the chunked policy, with no prefix cache or a hash cache (not radix: a lookup
    touches the tree), a recompute-preempted head (it may stay out) or a new request
    without stop tokens, fork or logprobs (its missing lookups change nothing)."""
    if head.status is RequestStatus.SWAPPED:
        return True
    cache = s.kv_cache.cache
    if s.prefill_first or not (cache is None or isinstance(cache, HashPrefixCache)):
        return False
    if head.status is RequestStatus.PREEMPTED:
        return True
    return (
        head.status is RequestStatus.WAITING
        and not head.num_external_tokens
        and head.sampling_params.n == 1
        and not head.sampling_params.logprobs
        and not head.stop_ids
    )


def _budget_left_estimate(s: Scheduler) -> int:
    """Roughly the budget the next step leaves after the running requests, counting the
    latest admitted (still prefilling) ones exactly and the others as decoders."""
    budget = s.step_budget()
    running = s.running
    num = len(running)
    for req in reversed(running):
        n = len(req.all_token_ids) - req.num_computed_tokens
        if is_decoding(n, bool(req.output_token_ids)):
            break
        num -= 1
        budget -= s.running_tokens(n, req.num_computed_tokens, max(budget, 0))
    return budget - num
