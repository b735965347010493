"""Checking mode: a shadow scheduler that runs every step one by one next to the engine.

The shadow gets a copy of every request the engine queues and repeats every single step
with the executor's output. After each stretch it replays the stretch's steps one by one
with the tokens the stretch sampled, compares each step with the plan, and then its whole
state with the engine's: requests, queues, counters, block tables, the free queue's order
and the blocks waiting to enter the prefix cache. Any difference raises ``StretchMismatch``
naming the step. Because the shadow runs the whole run, state a snapshot cannot see (the
prefix cache's insides) shows up as a difference in a later step.

Turn it on with ``SLOTUNE_CHECK_STRETCHES=1`` or ``Engine(..., check_stretches=True)``; it
costs about what running without stretches costs.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from slotune.engine.chunking import StepTime
from slotune.engine.config import EngineConfig
from slotune.engine.executor import ExecutorOutput
from slotune.engine.kv_cache.manager import KVCacheManager
from slotune.engine.outputs import RequestOutput
from slotune.engine.request import Request
from slotune.engine.scheduler import Scheduler
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.stretch.apply import StretchResult
from slotune.engine.stretch.plan import PlannedStep, StretchPlan

ENV = "SLOTUNE_CHECK_STRETCHES"


def enabled_by_env() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


class StretchMismatch(AssertionError):
    """A stretch left the engine somewhere single steps would not have."""


class StretchChecker:
    """The shadow scheduler and the comparisons (see the module docstring)."""

    def __init__(
        self, config: EngineConfig, kv_cache: KVCacheManager, step_time: StepTime | None = None
    ) -> None:
        """``step_time``: the engine's step-time model (adaptive chunking), shared."""
        shadow_kv = KVCacheManager(
            kv_cache.num_gpu_blocks,
            kv_cache.num_cpu_blocks,
            config.block_size,
            config.prefix_caching,
        )
        self.shadow = Scheduler(config, shadow_kv, step_time=step_time)
        self.num_stretches = 0

    def add_request(self, request: Request) -> None:
        self.shadow.add_request(copy.deepcopy(request))

    def abort_request(self, request_id: str) -> None:
        self.shadow.abort_request(request_id)

    def step(
        self,
        out: SchedulerOutput,
        result: ExecutorOutput,
        outputs: list[RequestOutput],
    ) -> None:
        """Repeat a single step of the engine's (its batch ``out``, the executor's
        ``result``, the step's ``outputs``) and compare the batch and the outputs (the
        whole state is compared after each stretch)."""
        shadow = self.shadow
        shadow_out = shadow.schedule()
        where = f"single step {shadow.steps}"
        _same(where, "batch", _batch(shadow_out), _batch(out))
        if not shadow_out.total_num_scheduled_tokens:
            shadow.finished_request_ids |= shadow_out.finished_request_ids
        shadow_outputs = shadow.update_from_output(shadow_out, result)
        shadow.advance(result.duration_s)  # the clock a decode budget reads
        _same(where, "outputs", _outputs(shadow_outputs), _outputs(outputs))

    def copy_arrivals(self, plan: StretchPlan) -> list[list[Request]]:
        """Copies of the requests arriving during the stretch, before it changes them."""
        return [[copy.deepcopy(r) for r in step.arrivals] for step in plan.steps]

    def replay(
        self,
        plan: StretchPlan,
        tokens: list[list[int]],
        result: StretchResult,
        arrivals: list[list[Request]],
        scheduler: Scheduler,
        durations: list[float],
    ) -> None:
        """Run the applied stretch's steps one by one (each ``durations`` long) on the
        shadow and compare."""
        self.num_stretches += 1
        shadow = self.shadow
        sampled: dict[tuple[str, int], list[int]] = {}
        reasons: dict[tuple[str, int], str | None] = {}
        for j, step in enumerate(plan.steps):
            where = f"stretch {self.num_stretches}, step {j} (engine step {shadow.steps})"
            out = shadow.schedule()
            _same(where, "planned batch", _planned(step), _counts(out))
            used = shadow.kv_cache.pool.num_used_blocks
            tokens_of: dict[str, list[int]] = {}
            for rid in out.num_samples:
                i = plan.index(rid, j)
                tokens_of[rid] = [tokens[i][j - plan.requests[i].first_sample]]
            for o in shadow.update_from_output(out, ExecutorOutput(tokens_of, 0.0)):
                key = (o.request_id, o.index)
                sampled.setdefault(key, []).extend(o.new_token_ids)
                reasons[key] = o.finish_reason
            got = (used, len(shadow.running), len(shadow.waiting))
            want = (result.used_blocks[j], result.num_running[j], result.num_waiting[j])
            _same(where, "(used blocks, running, waiting)", got, want)
            shadow.advance(durations[j])  # the clock a decode budget reads
            for req in arrivals[j]:
                shadow.add_request(req)
        stretch: dict[tuple[str, int], list[int]] = {}
        stretch_reasons: dict[tuple[str, int], str | None] = {}
        for o in result.outputs:  # a request preempted and readmitted has one per stay
            key = (o.request_id, o.index)
            stretch.setdefault(key, []).extend(o.new_token_ids)
            stretch_reasons[key] = o.finish_reason
        where = f"stretch {self.num_stretches}"
        _same(where, "tokens", sampled, stretch)
        _same(where, "finish reasons", reasons, stretch_reasons)
        _same(where, "state", snapshot(shadow), snapshot(scheduler))
        # single steps hand the executor each step's finishes; a stretch hands all of its
        # finishes with the next step
        told = shadow.finished_request_ids
        if not told <= scheduler.finished_request_ids:
            _same(where, "finished ids", told, scheduler.finished_request_ids)


def snapshot(s: Scheduler) -> dict[str, Any]:
    """What a scheduler's future depends on, as comparable values."""
    kv = s.kv_cache
    return {
        "requests": {
            rid: (
                r.status,
                r.num_computed_tokens,
                r.all_token_ids,
                r.output_token_ids,
                r.num_cached_tokens,
                r.num_preemptions,
            )
            for rid, r in s.requests.items()
        },
        "running": [r.request_id for r in s.running],
        "waiting": [r.request_id for r in s.waiting],
        "pending outputs": _outputs(s.pending_outputs),
        "counters": (
            s.steps,
            s.max_step_tokens,
            s.num_preemptions,
            s.num_swap_outs,
            s.num_swap_ins,
            s.fork_seats,
        ),
        "block tables": {rid: list(ids) for rid, ids in kv.block_tables.items()},
        "free queue": [b.block_id for b in kv.pool.free_queue.blocks()],
        "swapped": {rid: list(ids) for rid, ids in kv.swapped.items()},
        "uncommitted": list(kv.uncommitted),
        "prefix cache": (kv.prefix_cache_queries_tokens, kv.prefix_cache_hit_tokens),
        "clock": s.clock,
        # a decode budget reads when each request was preempted and whether it went first
        "budget": {rid: (r.boosted, r.preempted_at) for rid, r in s.requests.items()}
        if s.budget_s is not None
        else None,
    }


def _batch(out: SchedulerOutput) -> tuple[Any, ...]:
    return (
        out.num_scheduled_tokens,
        out.num_samples,
        out.num_prefill_tokens,
        out.preempted_request_ids,
        out.new_request_ids,
        out.resumed_request_ids,
    )


def _planned(step: PlannedStep) -> tuple[int, ...]:
    num_preempted = len(step.preempts or ())
    return (
        step.num_tokens,
        step.num_prefill,
        step.num_samples,
        step.num_requests,
        num_preempted,
        0,
        0,
    )


def _counts(out: SchedulerOutput) -> tuple[int, ...]:
    return (
        out.total_num_scheduled_tokens,
        out.num_prefill_tokens,
        sum(out.num_samples.values()),
        len(out.num_scheduled_tokens),
        len(out.preempted_request_ids),
        len(out.swap_in) + len(out.swap_out),
        len(out.copy_on_write),
    )


def _outputs(outputs: list[RequestOutput]) -> list[tuple[Any, ...]]:
    return [(o.request_id, o.index, o.new_token_ids, o.finish_reason) for o in outputs]


def _same(where: str, what: str, got: object, want: object) -> None:
    """``got`` is the shadow's (single steps), ``want`` the engine's."""
    if got == want:
        return
    if isinstance(got, dict) and isinstance(want, dict):
        keys = [k for k in {**got, **want} if got.get(k) != want.get(k)]
        what = f"{what} ({', '.join(map(str, keys[:5]))})"
        got, want = {k: got.get(k) for k in keys[:1]}, {k: want.get(k) for k in keys[:1]}
    raise StretchMismatch(
        f"{where}: {what} differ\n  single steps: {_short(got)}\n  engine: {_short(want)}"
    )


def _short(value: object, limit: int = 600) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."
