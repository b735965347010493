"""Checks of the engine's bookkeeping that must hold after every step."""

from __future__ import annotations

from collections import Counter

from slotune.engine import Engine
from slotune.engine.request import Request, RequestStatus
from slotune.engine.scheduler_output import SchedulerOutput


def check_kv_cache(engine: Engine) -> None:
    kv = engine.kv_cache
    pool = kv.pool
    holders: Counter[int] = Counter()
    assert set(kv.block_tables) == set(kv.req_blocks)
    for rid, rb in kv.req_blocks.items():
        assert kv.block_tables[rid] is rb.block_ids
        assert rb.block_ids == [b.block_id for b in rb.blocks], rid
        assert rb.num_slots == len(rb.blocks) * kv.block_size
        holders.update(rb.block_ids)
    for block in pool.blocks:
        assert block.ref_cnt == holders[block.block_id], (
            f"block {block.block_id}: ref_cnt {block.ref_cnt}, "
            f"held by {holders[block.block_id]} block tables"
        )
    free = [b for b in pool.blocks if b.ref_cnt == 0]
    assert len(free) == pool.num_free_blocks
    assert len(free) + sum(1 for b in pool.blocks if b.ref_cnt > 0) == pool.num_blocks
    queued = pool.free_queue.blocks()
    assert len(queued) == pool.free_queue.num_free_blocks
    assert all(b.ref_cnt == 0 and b.kept_by is None for b in queued)
    kept = [b for b in free if b.kept_by is not None]
    assert len(kept) + len(queued) == len(free)
    cache = kv.cache
    if engine.config.prefix_caching == "radix":
        assert cache.num_evictable == len(kept)  # type: ignore[union-attr]
    if engine.config.prefix_caching == "hash":
        for block in pool.blocks:
            if block.block_hash is not None:
                assert cache._blocks[block.block_hash] is block  # type: ignore[union-attr]
    if kv.lower_tier_blocks is not None:  # the lower tiers' distinct blocks, within the cap
        tiers = {r.request_id: r.tier for r in engine.scheduler.requests.values()}
        lower = Counter(
            b for rid, rb in kv.req_blocks.items() if tiers[rid] > 0 for b in rb.block_ids
        )
        assert kv.lower_held == lower
        assert len(lower) <= kv.lower_tier_blocks, (len(lower), kv.lower_tier_blocks)
    else:
        assert not kv.lower_held
    swapped_cpu = [c for ids in kv.swapped.values() for c in ids]
    assert len(set(swapped_cpu)) == len(swapped_cpu)
    assert len(swapped_cpu) + kv.num_free_cpu_blocks == kv.num_cpu_blocks


def check_scheduler(engine: Engine) -> None:
    s = engine.scheduler
    kv = engine.kv_cache
    assert len(s.running) + s.fork_seats <= engine.config.max_num_seqs
    running = {r.request_id for r in s.running}
    waiting = {r.request_id for r in s.waiting}
    assert len(running) == len(s.running) and len(waiting) == len(s.waiting)
    assert not running & waiting
    assert set(s.requests) == running | waiting
    assert set(kv.req_blocks) == running
    for req in s.running:
        assert req.status is RequestStatus.RUNNING
        assert kv.req_blocks[req.request_id].num_slots >= req.num_computed_tokens
        assert req.num_computed_tokens <= req.num_tokens
    for req in s.waiting:
        if req.status is RequestStatus.SWAPPED:
            assert req.request_id in kv.swapped
        else:
            assert req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert req.num_computed_tokens == 0
    assert set(kv.swapped) <= waiting
    assert set(kv.uncommitted) <= running
    assert kv.cow_pending <= running


def check_step(engine: Engine, so: SchedulerOutput) -> None:
    config = engine.config
    scheduled = so.num_scheduled_tokens
    assert so.total_num_scheduled_tokens == sum(scheduled.values())
    assert so.total_num_scheduled_tokens <= so.token_budget <= config.max_num_batched_tokens
    if not config.adaptive_chunk_ms:
        assert so.token_budget == config.max_num_batched_tokens
    assert all(n >= 1 for n in scheduled.values())
    if config.long_prefill_token_threshold:
        assert all(n <= config.long_prefill_token_threshold for n in scheduled.values())
    assert set(so.num_samples) <= set(scheduled)
    assert len(scheduled) <= config.max_num_seqs
    if config.policy == "prefill_first" and so.num_prefill_tokens:
        assert so.num_prefill_tokens == so.total_num_scheduled_tokens, "prefill step with decodes"


def check_all(engine: Engine, so: SchedulerOutput | None) -> None:
    if so is not None:
        check_step(engine, so)
    check_kv_cache(engine)
    check_scheduler(engine)


def check_drained(engine: Engine) -> None:
    kv = engine.kv_cache
    assert not engine.has_unfinished_requests()
    assert kv.num_free_blocks == kv.num_gpu_blocks
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)
    assert kv.num_free_cpu_blocks == kv.num_cpu_blocks
    assert not kv.req_blocks and not kv.swapped and not kv.uncommitted and not kv.cow_pending
    assert engine.scheduler.fork_seats == 0
    check_all(engine, None)


class QueueSnapshot:
    """The queues before a step, to check the step against brute-force references: the
    requests it admits are the first of the waiting queue (FIFO; under priority
    scheduling, tiers or a decode budget the lowest ``(not boosted, tier, priority,
    arrival)`` of all waiting, found by sorting), and its victims are the last admitted
    (else the highest of all running in that order, found by sorting)."""

    def __init__(self, engine: Engine) -> None:
        s = engine.scheduler
        self.by_priority = engine.config.scheduling_policy == "priority"
        self.tiered = engine.config.tiered
        self.budgeted = engine.config.decode_budget_ms > 0
        self.by_rank = self.by_priority or self.tiered or self.budgeted
        self.waiting = list(s.waiting)
        self.running = list(s.running)
        # each request's place now: a decode budget may boost it after the step
        self.keys = {r.request_id: self._live_key(r) for r in [*self.waiting, *self.running]}

    def _live_key(self, req: Request) -> tuple[bool, int, int, float]:
        return (
            not req.boosted if self.budgeted else False,
            req.tier if self.tiered else 0,
            req.priority if self.by_priority else 0,
            req.arrival_time,
        )

    def _key(self, req: Request) -> tuple[bool, int, int, float]:
        return self.keys[req.request_id]

    def check(self, engine: Engine, so: SchedulerOutput) -> None:
        if self.tiered:
            tiers = {r.request_id: r.tier for r in [*self.waiting, *self.running]}
            lower = sum(n for rid, n in so.num_scheduled_tokens.items() if tiers[rid] > 0)
            assert lower <= engine.config.lower_tier_token_budget
            self._check_tiers(so)
            return
        requests = engine.scheduler.requests
        admitted = set(so.new_request_ids) | set(so.resumed_request_ids)
        order = [rid for rid in so.num_scheduled_tokens if rid in admitted]
        victims = list(so.preempted_request_ids)
        if any(r.request_id not in requests for r in self.waiting if r.request_id not in admitted):
            return  # one could never fit and was finished from the head: no plain order
        if self.by_rank:
            want_ranks = sorted(self._key(r) for r in self.waiting)[: len(order)]
            got = [self._key(r) for r in self.waiting if r.request_id in admitted]
            got_in_order = sorted(got)
            assert got_in_order == want_ranks, (got_in_order, want_ranks)
            by_id = {r.request_id: r for r in self.waiting}
            assert [self._key(by_id[rid]) for rid in order] == want_ranks
            running = {r.request_id: r for r in self.running}
            if all(v in running for v in victims):
                want = sorted((self._key(r) for r in self.running), reverse=True)[: len(victims)]
                assert [self._key(running[v]) for v in victims] == want
        else:
            assert order == [r.request_id for r in self.waiting[: len(order)]]
            running_ids = [r.request_id for r in self.running]
            if all(v in running_ids for v in victims):
                assert victims == running_ids[::-1][: len(victims)]

    def _check_tiers(self, so: SchedulerOutput) -> None:
        """With tiers a lower tier's share may run out while a higher-tier request still
        fits, so admissions need not be the first in order; they are in order, and every
        victim is of the lowest tier running and ranks at least as late as any request of
        its tier."""
        admitted = set(so.new_request_ids) | set(so.resumed_request_ids)
        by_id = {r.request_id: r for r in self.waiting}
        keys = [self._key(by_id[rid]) for rid in so.num_scheduled_tokens if rid in admitted]
        assert keys == sorted(keys)
        running = {r.request_id: r for r in self.running}
        left = list(self.running)
        for v in so.preempted_request_ids:
            if v not in running:
                return
            assert self._key(running[v]) == max(self._key(r) for r in left)
            left.remove(running[v])
