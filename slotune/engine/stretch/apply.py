"""Applying a planned stretch to the scheduler, exactly as its steps one by one would."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from slotune.engine.outputs import RequestOutput
from slotune.engine.request import Request, RequestStatus
from slotune.engine.scheduler import Scheduler, take_token
from slotune.engine.stretch.plan import StretchPlan


class StretchResult(NamedTuple):
    """What ``apply_stretch`` did, per request and per step."""

    outputs: list[RequestOutput]  # each sampling request's tokens, in running order
    used_blocks: list[int]  # GPU blocks in use after each step's allocations
    num_running: list[int]  # running requests after each step
    num_waiting: list[int]  # waiting requests after each step (before its arrivals)


def apply_stretch(
    scheduler: Scheduler,
    plan: StretchPlan,
    tokens: list[list[int]],
    durations: list[float] | None = None,
) -> StretchResult:
    """Apply the planned steps at once, exactly as that many rounds of ``schedule`` and
    ``update_from_output`` would. ``tokens[i]`` holds what request ``i`` of the plan
    samples in its steps (``[]`` if none); only the last token of a request running at
    the start may be a stop token, which ends it with the plan's last step. Finished
    requests free their blocks step by step; their ids reach the executor with the next
    ``schedule``. With ``durations`` the scheduler's clock advances after each step, before
    its arrivals join (``Scheduler.advance``: a decode budget's due requests move up).
    """
    kv = scheduler.kv_cache
    members = plan.requests
    requests = [m.request for m in members]
    ids = [r.request_id for r in requests]
    steps = plan.steps
    last = plan.num_steps - 1
    outputs: list[RequestOutput | None] = [None] * len(members)
    ending: list[tuple[Request, RequestStatus]] = []
    status_of: dict[int, RequestStatus] = {}

    def take(i: int) -> None:
        outputs[i] = _take_run(requests[i], tokens[i], ending)
        if len(status_of) < len(ending):
            status_of[i] = ending[-1][1]

    for i in range(plan.num_start):
        if tokens[i]:
            take(i)
    last_finishes = steps[last].finishes
    stopped = [
        i
        for i, status in status_of.items()
        if status is RequestStatus.FINISHED_STOPPED and i not in last_finishes
    ]
    if stopped:  # a stop token ends requests with the last step too
        steps[last].finishes = sorted(last_finishes + stopped)
    final = [m.start_computed + m.scheduled if m.preempted < 0 else 0 for m in members]
    pool = kv.pool
    uncommitted = kv.uncommitted
    used: list[int] = []
    running: list[int] = []
    waiting: list[int] = []
    num_running = len(scheduler.running)
    # allocations wait and go in one batch before the next lookup or free: the free
    # queue hands out the same blocks in the same order (frees only append to it)
    pending: list[tuple[str, int]] = []
    num_pending = 0
    in_use = pool.num_used_blocks  # changes only where a step grows, admits or finishes
    for j, step in enumerate(steps):
        allocs = step.allocs
        if step.preempts:  # the allocations before each preemption go first
            done = 0
            for before, i, computed in step.preempts:
                pending += [(ids[x], n) for x, n in allocs[done:before]]
                done = before
                if pending:
                    kv.grow(pending)
                    pending = []
                req = requests[i]
                req.num_computed_tokens = computed  # its filled blocks are committed
                scheduler.preempt_running(req)
                if req.status is not RequestStatus.PREEMPTED:
                    raise RuntimeError(f"apply_stretch: {req.request_id!r} was not recomputed")
                num_running -= 1
            allocs = allocs[done:]
            num_pending = 0
            in_use = pool.num_used_blocks
        for i, n in allocs:
            pending.append((ids[i], n))
            num_pending += n
        if pending and (step.admits or step.finishes or (step.retry and uncommitted)):
            kv.grow(pending)
            pending = []
            num_pending = 0
            in_use = pool.num_used_blocks
        if step.admits:
            for i, n in step.admits:
                _admit_planned(scheduler, plan, i, n, j)
                if tokens[i]:
                    take(i)
                num_running += 1
            in_use = pool.num_used_blocks
        if step.retry and uncommitted:  # its lookup commits them (after the admissions)
            _commit_filled(scheduler, plan, j)
        used.append(in_use + num_pending)
        for i in step.fills:
            uncommitted[ids[i]] = requests[i]
        for i in step.finishes:
            req = requests[i]
            status = status_of.get(i)
            if status is None or members[i].last_sample != j:
                raise RuntimeError(f"apply_stretch: {req.request_id!r} was planned to end")
            req.num_computed_tokens = final[i]
            scheduler.finish(req, status)
            num_running -= 1
        if step.finishes:
            in_use = pool.num_used_blocks
        running.append(num_running)
        waiting.append(len(scheduler.waiting))
        if durations is not None:
            scheduler.advance(durations[j])
        for req in step.arrivals:
            scheduler.add_request(req)
    if pending:
        kv.grow(pending)
    for req, computed in zip(requests, final, strict=True):
        req.num_computed_tokens = computed
    scheduler.count_steps(plan.num_steps, max(s.num_tokens for s in steps))
    if ending:
        scheduler.drop_finished()
    return StretchResult([o for o in outputs if o is not None], used, running, waiting)


def _take_run(
    req: Request, tokens: list[int], ending: list[tuple[Request, RequestStatus]]
) -> RequestOutput:
    """Append a stretch's sampled ``tokens`` to ``req`` and report them."""
    if len(tokens) > 1:
        head = tokens[:-1]
        req.output_token_ids.extend(head)
        req.all_token_ids.extend(head)
    output = take_token(req, tokens[-1], ending)
    output.new_token_ids = tokens
    return output


def _admit_planned(scheduler: Scheduler, plan: StretchPlan, i: int, n: int, j: int) -> None:
    """Admit request ``i`` of the plan (the waiting head) with ``n`` tokens in step ``j``,
    as ``Scheduler.schedule`` does: its lookup finds the planned hit (a new request's
    misses; a recompute-preempted one may find its own blocks still cached)."""
    member = plan.requests[i]
    req = member.request
    if not scheduler.waiting or scheduler.waiting[0] is not req:
        raise RuntimeError(f"apply_stretch: {req.request_id!r} is not the waiting head")
    kv = scheduler.kv_cache
    _set_computed(kv.uncommitted.values(), plan, j)  # the lookup commits them
    hit = kv.get_computed_blocks(req)
    num_hit = hit.num_tokens if hit is not None else 0
    if num_hit != member.start_computed or not kv.allocate_slots(req, n, hit):
        raise RuntimeError(
            f"apply_stretch: {req.request_id!r} was planned to hit {member.start_computed} "
            f"tokens (found {num_hit}) and fit"
        )
    req.num_computed_tokens = num_hit
    if req.status is RequestStatus.WAITING:
        req.num_cached_tokens = num_hit
    scheduler.seat_head()


def _commit_filled(scheduler: Scheduler, plan: StretchPlan, j: int) -> None:
    """What trying the waiting head in step ``j`` changes when it stays out (see
    ``PlannedStep.retry``): its lookup commits the blocks filled so far. The rest of the
    lookup and the failed allocation change nothing a step can tell."""
    _set_computed(scheduler.kv_cache.uncommitted.values(), plan, j)
    scheduler.kv_cache.commit_all()


def _set_computed(requests: Iterable[Request], plan: StretchPlan, j: int) -> None:
    """Give ``requests`` the computed counts the steps before ``j`` leave (a commit reads
    them)."""
    for r in requests:
        r.num_computed_tokens = plan.requests[plan.index(r.request_id, j)].computed_after(j)
