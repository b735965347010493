"""The scheduler: vLLM V1's phase-less token-budget loop, plus vLLM V0's prefill-first policy.

There is no prefill phase and no decode phase: each request has ``num_computed_tokens``
catching up with ``num_tokens`` (prompt plus output so far), and every step hands out at
most ``max_num_batched_tokens`` tokens, running requests first, then waiting ones.

Invariants kept here: a step's scheduled tokens never exceed the budget; running requests
(plus the seats reserved for the forks of ``n > 1`` requests) never exceed
``max_num_seqs``; a preempted request is always one not yet scheduled in this step, so no
scheduled request ever loses its blocks.

``schedule()`` only decides; ``update_from_output()`` applies what the executor computed.
Between the two, every scheduled request's ``num_computed_tokens`` is its pre-step value.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from slotune.engine.config import EngineConfig
from slotune.engine.executor import ExecutorOutput
from slotune.engine.kv_cache.manager import KVCacheManager
from slotune.engine.outputs import RequestOutput
from slotune.engine.request import Request, RequestStatus
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.stretch import StretchPlan

RUNNING = RequestStatus.RUNNING
SWAPPED = RequestStatus.SWAPPED
WAITING = RequestStatus.WAITING
FINISHED_STOPPED = RequestStatus.FINISHED_STOPPED
FINISHED_LENGTH = RequestStatus.FINISHED_LENGTH

_ANY, _PROMPTS, _SWAPPED = 0, 1, 2  # which waiting requests a pass may admit


def request_output(req: Request, tokens: list[int], finish_reason: str | None) -> RequestOutput:
    """What a step reports for ``req``: its new ``tokens``, and why it ended if it did."""
    return RequestOutput(
        req.parent_id,
        req.index,
        tokens,
        finish_reason is not None,
        finish_reason,
        len(req.prompt_token_ids),
        req.num_cached_tokens,
        req.num_preemptions,
    )


def _take_token(
    req: Request, token: int, finished: list[tuple[Request, RequestStatus]]
) -> RequestOutput:
    """Append a sampled token to ``req``, note in ``finished`` if it ends the request (a
    stop token, or its length reached), and report it."""
    req.output_token_ids.append(token)
    all_ids = req.all_token_ids
    all_ids.append(token)
    if token in req.stop_ids:
        finished.append((req, FINISHED_STOPPED))
        return request_output(req, [token], "stop")
    if len(all_ids) >= req.max_num_tokens:
        finished.append((req, FINISHED_LENGTH))
        return request_output(req, [token], "length")
    return request_output(req, [token], None)


class StretchResult(NamedTuple):
    """What ``Scheduler.apply_stretch`` did, per request and per step."""

    outputs: list[RequestOutput]  # each sampling request's tokens, in running order
    used_blocks: list[int]  # GPU blocks in use after each step's allocations
    num_running: list[int]  # running requests after each step
    num_waiting: list[int]  # waiting requests after each step (before its arrivals)


class Scheduler:
    """Owns the request queues; decides each step's batch and applies its results.

    ``running`` is in admission order (the last is preempted first); ``waiting`` is FIFO
    with preempted and swapped requests put back at its front.
    """

    def __init__(self, config: EngineConfig, kv_cache: KVCacheManager) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.block_size = config.block_size
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = config.max_model_len
        self.prefill_first = config.policy == "prefill_first"
        self.swap = config.preemption_mode == "swap"
        self.threshold = config.long_prefill_token_threshold or config.max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_request_ids: set[str] = set()
        self.pending_outputs: list[RequestOutput] = []
        self.fork_seats = 0  # future children of running, not yet forked n > 1 requests
        self.num_preemptions = 0
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.steps = 0
        self.max_step_tokens = 0

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return
        if request.status is RUNNING:
            self.running.remove(request)
            self._leave_running(request)
        else:
            self.waiting.remove(request)
        self._finish(request, RequestStatus.FINISHED_ABORTED)

    # -- schedule ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(
            requests=self.requests,
            block_tables=self.kv_cache.block_tables,
            finished_request_ids=self.finished_request_ids,
        )
        self.finished_request_ids = set()
        budget = self.config.max_num_batched_tokens
        if not self.prefill_first:
            budget = self._schedule_running(out, budget)
            if not out.preempted_request_ids:
                budget = self._schedule_waiting(out, budget, _ANY)
        else:
            if self.waiting and self.waiting[0].status is not SWAPPED:
                budget = self._schedule_waiting(out, budget, _PROMPTS)
            if not out.num_scheduled_tokens:
                budget = self._schedule_running(out, budget)
                if not out.preempted_request_ids:
                    budget = self._schedule_waiting(out, budget, _SWAPPED)
        if self.kv_cache.pending_copy_on_write:
            out.copy_on_write = self.kv_cache.take_copy_on_write()
        total = self.config.max_num_batched_tokens - budget
        out.total_num_scheduled_tokens = total
        self.steps += 1
        if total > self.max_step_tokens:
            self.max_step_tokens = total
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        running = self.running
        kv = self.kv_cache
        req_blocks = kv.req_blocks
        cow_pending = kv.cow_pending
        bs = self.block_size
        scheduled = out.num_scheduled_tokens
        samples = out.num_samples
        prefill = 0
        for req in running:  # preemption only pops entries after ``req`` (or ``req`` itself)
            if budget <= 0:
                break
            computed = req.num_computed_tokens
            total = len(req.all_token_ids)
            n = total - computed
            rid = req.request_id
            if n == 1 and req.output_token_ids:  # a decode: the hot path
                # only a block boundary (or a fork's shared block) can need the allocator
                if (computed % bs == 0 or cow_pending) and not (
                    kv.allocate_slots(req, 1) or self._make_room(req, 1, out)
                ):
                    break
                scheduled[rid] = 1
                samples[rid] = 1
                budget -= 1
                continue
            if n > 1:
                n = min(n, self.threshold, budget, self.max_model_len - computed)
            if (
                (computed + n > req_blocks[rid].num_slots or cow_pending)
                and not kv.allocate_slots(req, n)
                and not self._make_room(req, n, out)
            ):
                break  # ``req`` itself left the running list
            scheduled[rid] = n
            if computed + n == total:
                if req.output_token_ids:
                    samples[rid] = 1
                else:
                    samples[rid] = req.sampling_params.n
            if n > 1 or not req.output_token_ids:
                prefill += n
            budget -= n
        out.num_prefill_tokens += prefill
        return budget

    def _make_room(self, req: Request, num_new_tokens: int, out: SchedulerOutput) -> bool:
        """Preempt the most recently admitted running requests until ``req`` fits.

        False when ``req`` itself had to go. Alone, it can never fit: it finishes with
        reason "length" rather than waiting forever.
        """
        while True:
            victim = self.running.pop()
            self._leave_running(victim)
            if victim is req and not self.running:
                self._finish(req, RequestStatus.FINISHED_LENGTH, emit=True)
                return False
            self._preempt(victim, out)
            if victim is req:
                return False
            if self.kv_cache.allocate_slots(req, num_new_tokens):
                return True

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        victim.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted_request_ids.append(victim.request_id)
        if self.swap:
            copies = self.kv_cache.swap_out(victim)
            if copies is not None:
                out.swap_out.extend(copies)
                self.num_swap_outs += 1
                victim.status = SWAPPED
                self.waiting.appendleft(victim)
                return
        self.kv_cache.free(victim)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(victim)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, kinds: int) -> int:
        waiting = self.waiting
        while waiting and budget > 0:
            req = waiting[0]
            swapped = req.status is SWAPPED
            if (kinds == _PROMPTS and swapped) or (kinds == _SWAPPED and not swapped):
                break
            seats = req.seats
            if len(self.running) + self.fork_seats + seats > self.max_num_seqs:
                break
            n = self._admit_swapped(req, out, budget) if swapped else self._admit(req, out, budget)
            if n is None:
                break
            if n == 0:
                continue  # it could never fit and was finished
            waiting.popleft()
            req.status = RUNNING
            self.running.append(req)
            self.fork_seats += seats - 1
            rid = req.request_id
            out.num_scheduled_tokens[rid] = n
            if req.num_computed_tokens + n == len(req.all_token_ids):
                out.num_samples[rid] = seats
            if not swapped or n > 1 or not req.output_token_ids:
                out.num_prefill_tokens += n  # a (re)start is a prefill, whatever its size
            budget -= n
        return budget

    def _chunk(self, req: Request, computed: int, budget: int) -> int | None:
        n = min(len(req.all_token_ids) - computed, self.threshold)
        if n > budget:
            if self.prefill_first:
                return None
            n = budget
        return n

    def _admit(self, req: Request, out: SchedulerOutput, budget: int) -> int | None:
        """Allocate a waiting (new or recompute-preempted) request's first chunk."""
        kv = self.kv_cache
        hit = kv.get_computed_blocks(req)
        num_hit = hit.num_tokens if hit is not None else 0
        n = self._chunk(req, num_hit, budget)
        if n is None:
            return None
        if not kv.allocate_slots(req, n, hit):
            return self._never_fits(req)
        req.num_computed_tokens = num_hit
        if req.status is WAITING:
            req.num_cached_tokens = num_hit
            out.new_request_ids.append(req.request_id)
        else:
            out.resumed_request_ids.append(req.request_id)
        return n

    def _admit_swapped(self, req: Request, out: SchedulerOutput, budget: int) -> int | None:
        n = self._chunk(req, req.num_computed_tokens, budget)
        if n is None:
            return None
        copies = self.kv_cache.swap_in(req, n)
        if copies is None:
            return self._never_fits(req)
        out.swap_in.extend(copies)
        out.resumed_request_ids.append(req.request_id)
        self.num_swap_ins += 1
        return n

    def _never_fits(self, req: Request) -> int | None:
        """With nothing running every block is free: a request that still can't fit never will."""
        if self.running:
            return None
        self.waiting.popleft()
        self._finish(req, RequestStatus.FINISHED_LENGTH, emit=True)
        return 0

    # -- update --------------------------------------------------------------------------

    def update_from_output(
        self, out: SchedulerOutput, result: ExecutorOutput
    ) -> list[RequestOutput]:
        """Advance computed tokens, append sampled ones, fork ``n > 1`` requests, finish."""
        outputs = self.pending_outputs
        self.pending_outputs = []
        requests = out.requests
        uncommitted = self.kv_cache.uncommitted
        bs = self.block_size
        caching = self.kv_cache.cache is not None
        sampled = result.sampled_token_ids
        logprobs = result.logprobs
        finished: list[tuple[Request, RequestStatus]] = []
        take_token = _take_token
        for rid, n in out.num_scheduled_tokens.items():
            req = requests[rid]
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            if caching and computed % bs < n:
                uncommitted[rid] = req  # it filled a block: cache it before the next lookup
            all_ids = req.all_token_ids
            if computed != len(all_ids):
                continue
            out_ids = req.output_token_ids
            if not out_ids or logprobs:  # a first token (maybe a fork) or logprobs
                self._sample_slow(
                    req, sampled.get(rid), out.num_samples[rid], result, outputs, finished
                )
                continue
            try:
                tok = sampled[rid][0]
            except (KeyError, IndexError):
                self._sample_slow(req, sampled.get(rid), 1, result, outputs, finished)
                continue
            outputs.append(take_token(req, tok, finished))
        if finished:
            for req, status in finished:
                self._finish(req, status)
            self.running = [r for r in self.running if r.status is RUNNING]
        return outputs

    def _sample_slow(
        self,
        req: Request,
        tokens: list[int] | None,
        k: int,
        result: ExecutorOutput,
        outputs: list[RequestOutput],
        finished: list[tuple[Request, RequestStatus]],
    ) -> None:
        """Sampling with a fork (``k > 1``), logprobs, or a missing token (an executor bug)."""
        rid = req.request_id
        if tokens is None or len(tokens) < k:
            raise RuntimeError(
                f"executor returned {tokens!r} for request {rid!r}; expected {k} token(s)"
            )
        logprobs = result.logprobs.get(rid) or []
        top = result.top_logprobs.get(rid)
        family = self._fork(req, k) if k > 1 else [req]
        for index, member in enumerate(family):
            output = _take_token(member, tokens[index], finished)
            if index < len(logprobs):
                output.logprobs = [logprobs[index]]
            if top is not None:
                output.top_logprobs = [top]
            outputs.append(output)

    def _fork(self, parent: Request, k: int) -> list[Request]:
        """Children ``"{id}#{i}"`` that share the parent's blocks (its prompt)."""
        self.fork_seats -= k - 1
        family = [parent]
        for i in range(1, k):
            child = Request(
                f"{parent.request_id}#{i}",
                parent.prompt_token_ids,
                parent.sampling_params,
                arrival_time=parent.arrival_time,
                eos_token_id=parent.eos_token_id,
                parent_id=parent.request_id,
                index=i,
                num_computed_tokens=parent.num_computed_tokens,
                num_cached_tokens=parent.num_cached_tokens,
                num_preemptions=parent.num_preemptions,
                status=RUNNING,
            )
            child.max_num_tokens = parent.max_num_tokens
            self.kv_cache.fork(parent, child)
            self.requests[child.request_id] = child
            self.running.append(child)
            family.append(child)
        return family

    # -- stretches (see ``slotune.engine.stretch``) ----------------------------------------

    def apply_stretch(self, plan: StretchPlan, tokens: list[list[int]]) -> StretchResult:
        """Apply the planned steps at once, exactly as that many rounds of ``schedule`` and
        ``update_from_output`` would. ``tokens[i]`` holds what request ``i`` of the plan
        samples in its steps (``[]`` if none); only the last token of a request running at
        the start may be a stop token, which ends it with the plan's last step. Finished
        requests free their blocks step by step; their ids reach the executor with the
        next ``schedule``.
        """
        kv = self.kv_cache
        requests = plan.requests
        last = plan.num_steps - 1
        last_sample = plan.last_sample
        outputs: list[RequestOutput | None] = [None] * len(requests)
        ending: list[tuple[Request, RequestStatus]] = []
        status_of: dict[int, RequestStatus] = {}

        def take(i: int) -> None:
            outputs[i] = self._take_run(requests[i], tokens[i], ending)
            if len(status_of) < len(ending):
                status_of[i] = ending[-1][1]

        for i in range(plan.num_start):
            if tokens[i]:
                take(i)
        finishes = plan.finishes
        stopped = [
            i
            for i, status in status_of.items()
            if status is FINISHED_STOPPED and i not in finishes[last]
        ]
        if stopped:  # a stop token ends requests with the last step too
            finishes[last] = sorted(finishes[last] + stopped)
        final = [c + n for c, n in zip(plan.start_computed, plan.scheduled, strict=True)]
        pool = kv.pool
        uncommitted = kv.uncommitted
        used: list[int] = []
        running: list[int] = []
        waiting: list[int] = []
        num_running = len(self.running)
        ids = [r.request_id for r in requests]
        # allocations wait and go in one batch before the next lookup or free: the free
        # queue hands out the same blocks in the same order (frees only append to it)
        pending: list[tuple[str, int]] = []
        num_pending = 0
        for j, allocs in enumerate(plan.allocs):
            if allocs:
                for i, n in allocs:
                    pending.append((ids[i], n))
                    num_pending += n
            if pending and (plan.admits[j] or finishes[j]):
                kv.grow(pending)
                pending = []
                num_pending = 0
            for i, n in plan.admits[j]:
                self._admit_planned(plan, i, n, j)
                if tokens[i]:
                    take(i)
                num_running += 1
            used.append(pool.num_used_blocks + num_pending)
            for i in plan.fills[j]:
                uncommitted[requests[i].request_id] = requests[i]
            for i in finishes[j]:
                req = requests[i]
                status = status_of.get(i)
                if status is None or last_sample[i] != j:
                    raise RuntimeError(f"apply_stretch: {req.request_id!r} was planned to end")
                req.num_computed_tokens = final[i]
                self._finish(req, status)
                num_running -= 1
            running.append(num_running)
            waiting.append(len(self.waiting))
            for req in plan.arrivals[j]:
                self.add_request(req)
        if pending:
            kv.grow(pending)
        for req, computed in zip(requests, final, strict=True):
            req.num_computed_tokens = computed
        self.steps += plan.num_steps
        self.max_step_tokens = max(self.max_step_tokens, *plan.num_tokens)
        if ending:
            self.running = [r for r in self.running if r.status is RUNNING]
        return StretchResult([o for o in outputs if o is not None], used, running, waiting)

    @staticmethod
    def _take_run(
        req: Request, tokens: list[int], ending: list[tuple[Request, RequestStatus]]
    ) -> RequestOutput:
        """Append a stretch's sampled ``tokens`` to ``req`` and report them."""
        if len(tokens) > 1:
            head = tokens[:-1]
            req.output_token_ids.extend(head)
            req.all_token_ids.extend(head)
        output = _take_token(req, tokens[-1], ending)
        output.new_token_ids = tokens
        return output

    def _admit_planned(self, plan: StretchPlan, i: int, n: int, j: int) -> None:
        """Admit request ``i`` of the plan (the waiting head) with ``n`` tokens in step
        ``j``, as ``_schedule_waiting`` does when its lookup misses."""
        req = plan.requests[i]
        if self.waiting.popleft() is not req:
            raise RuntimeError(f"apply_stretch: {req.request_id!r} is not the waiting head")
        kv = self.kv_cache
        for r in kv.uncommitted.values():  # the lookup commits them as before this step
            r.num_computed_tokens = plan.computed_after(plan.index(r.request_id), j)
        hit = kv.get_computed_blocks(req)
        if (hit is not None and hit.num_tokens) or not kv.allocate_slots(req, n, hit):
            raise RuntimeError(f"apply_stretch: {req.request_id!r} was planned to miss and fit")
        req.num_computed_tokens = 0
        req.num_cached_tokens = 0
        req.status = RUNNING
        self.running.append(req)

    def swap_in_blocks(self, req: Request, budget: int) -> int | None:
        """The blocks swapping ``req`` in would take with ``budget`` tokens left in a step;
        None if the policy would not try (its chunk does not fit the budget). Trying and
        failing changes nothing."""
        n = self._chunk(req, req.num_computed_tokens, budget)
        if n is None:
            return None
        need = self.kv_cache.blocks_needed(req.num_computed_tokens + n)
        return max(need, len(self.kv_cache.swapped[req.request_id]))

    # -- leaving -------------------------------------------------------------------------

    def _leave_running(self, request: Request) -> None:
        if request.needs_fork:
            self.fork_seats -= request.sampling_params.n - 1

    def _finish(self, request: Request, status: RequestStatus, emit: bool = False) -> None:
        """Free everything the request holds; its id reaches executors with the next step."""
        if emit:
            self.pending_outputs.append(request_output(request, [], status.value))
        request.status = status
        self.kv_cache.free(request)
        del self.requests[request.request_id]
        self.finished_request_ids.add(request.request_id)
