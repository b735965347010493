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
The rules both follow are functions in ``slotune.engine.rules``, shared with the stretch
planner. So is the step itself: ``run_passes`` (the order of a step's passes, over a
``Passes`` object: the scheduler's own or the planner's) and the sizing the passes ask for
(``head_budget``, ``running_tokens``, ``chunk``, ``swap_in_need``). ``seat_head``,
``finish``, ``preempt_running``, ``count_steps`` and ``drop_finished`` are what
``slotune.engine.stretch.apply_stretch`` uses to apply planned steps.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Protocol

from slotune.engine.chunking import StepTime, adaptive_budget
from slotune.engine.config import EngineConfig
from slotune.engine.executor import ExecutorOutput
from slotune.engine.kv_cache.manager import BlockCopy, KVCacheManager
from slotune.engine.outputs import RequestOutput
from slotune.engine.queues import BudgetWatch, PriorityWaiting
from slotune.engine.request import Request, RequestStatus
from slotune.engine.rules import (
    counts_as_prefill,
    fills_block,
    first_chunk,
    has_seat,
    is_decoder,
    is_decoding,
    needs_blocks,
    num_samples,
    prompts_first,
    queue_key,
    reaches_length,
    running_chunk,
    swaps,
)
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.spec_decode import NgramProposer, Proposer, SlotProposer, speculates

RUNNING = RequestStatus.RUNNING
SWAPPED = RequestStatus.SWAPPED
WAITING = RequestStatus.WAITING
FINISHED_STOPPED = RequestStatus.FINISHED_STOPPED
FINISHED_LENGTH = RequestStatus.FINISHED_LENGTH

# which waiting requests a pass over the waiting queue may admit
ADMIT_ANY, ADMIT_PROMPTS, ADMIT_SWAPPED = 0, 1, 2


class Passes(Protocol):
    """A step's passes over the queues, for ``Scheduler.run_passes`` to call in order: the
    scheduler's own (filling a ``SchedulerOutput``) or the stretch planner's (planning a
    step). Each pass takes tokens from the step's budget and returns what it leaves; it
    schedules a request only by taking budget (at least one token)."""

    def head(self) -> Request | None:
        """The waiting head at the start of the step."""
        ...

    def serve_running(self, budget: int) -> int:
        """Give the running requests their tokens, in running order."""
        ...

    def serve_waiting(self, budget: int, kinds: int) -> int:
        """Admit waiting requests of ``kinds`` (``ADMIT_*``) from the head on."""
        ...

    @property
    def preempted(self) -> bool:
        """Whether a pass of this step preempted a running request."""
        ...


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


def take_token(
    req: Request, token: int, finished: list[tuple[Request, RequestStatus]]
) -> RequestOutput:
    """Append a sampled token to ``req``, note in ``finished`` if it ends the request (a
    stop token, or its length reached), and report it."""
    req.output_token_ids.append(token)
    all_ids = req.all_token_ids  # its own since it was seated
    all_ids.append(token)
    if token in req.stop_ids:
        finished.append((req, FINISHED_STOPPED))
        return request_output(req, [token], "stop")
    if reaches_length(len(all_ids), req.max_num_tokens):
        finished.append((req, FINISHED_LENGTH))
        return request_output(req, [token], "length")
    return request_output(req, [token], None)


class Scheduler:
    """Owns the request queues; decides each step's batch and applies its results.

    ``running`` is in admission order (the last is preempted first); ``waiting`` is FIFO
    with preempted and swapped requests put back at its front. Under
    ``scheduling_policy="priority"`` or tiers both are in ``queue_key`` order instead:
    the waiting head is the first in that order, and the last running one (the first
    victim) is vLLM's ``max(running, key=(priority, arrival))`` (tier first with
    tiers); running requests take the step's budget in that order too. With tiers the
    lower tiers together take at most ``lower_budget`` tokens a step (and the KV manager
    caps their blocks).
    """

    def __init__(
        self,
        config: EngineConfig,
        kv_cache: KVCacheManager,
        propose: Proposer | SlotProposer | None = None,
        step_time: StepTime | None = None,
    ) -> None:
        """``propose`` drafts tokens when ``config.num_speculative_tokens`` > 0 (default:
        n-gram prompt lookup); a ``SlotProposer`` (a draft model) drafts into its slots.
        ``step_time`` prices steps for adaptive chunking (required when
        ``config.adaptive_chunk_ms`` > 0)."""
        self.config = config
        self.chunk_target_s = config.adaptive_chunk_ms / 1000 if config.adaptive_chunk_ms else None
        if self.chunk_target_s is not None and step_time is None:
            raise ValueError("adaptive_chunk_ms needs a step-time model (step_time)")
        self.step_time = step_time
        self._last_budget: int | None = None  # adaptive chunking's last (its next search's start)
        self.kv_cache = kv_cache
        self.block_size = config.block_size
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = config.max_model_len
        self.prefill_first = config.policy == "prefill_first"
        self.preemption_mode = config.preemption_mode
        self.swap_threshold = config.swap_threshold_tokens
        self.budget_s = config.decode_budget_ms / 1000 if config.decode_budget_ms else None
        self.key = queue_key(
            config.scheduling_policy == "priority", config.tiered, self.budget_s is not None
        )
        self.clock = 0.0  # seconds of steps run (``advance``), for the decode budget
        self.budget_watch = BudgetWatch()
        self.lower_budget = config.lower_tier_token_budget if config.tiered else None
        self.threshold = config.chunk_cap
        self.waiting: deque[Request] | PriorityWaiting = (
            deque() if self.key is None else PriorityWaiting(self.key)
        )
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_request_ids: set[str] = set()
        self.pending_outputs: list[RequestOutput] = []
        self.fork_seats = 0  # future children of running, not yet forked n > 1 requests
        self.lower_left: int | None = None  # tokens the lower tiers may still take this step
        self.num_preemptions = 0
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.num_recomputed_tokens = 0  # computed tokens preemptions dropped (to recompute)
        self.num_swapped_tokens = 0  # computed tokens preemptions swapped out
        self.steps = 0
        self.max_step_tokens = 0
        self.num_spec = config.num_speculative_tokens
        self.propose: Proposer | None = None
        self.draft_model: SlotProposer | None = None
        if self.num_spec and isinstance(propose, SlotProposer):
            self.draft_model = propose
            self.propose = self._propose_in_slots
        elif self.num_spec:
            assert not isinstance(propose, SlotProposer)
            self.propose = propose or NgramProposer(
                config.prompt_lookup_min, config.prompt_lookup_max
            )
        self.num_drafts = 0  # vLLM's SpecDecodingStats
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_tokens_per_pos = [0] * self.num_spec

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)
        if self.budget_s is not None and request.output_token_ids:
            self.budget_watch.add(request)

    def abort_request(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return
        if request.status is RUNNING:
            self.running.remove(request)
            self._leave_running(request)
        else:
            self.waiting.remove(request)
        self.finish(request, RequestStatus.FINISHED_ABORTED)

    # -- schedule ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(
            requests=self.requests,
            block_tables=self.kv_cache.block_tables,
            finished_request_ids=self.finished_request_ids,
        )
        self.finished_request_ids = set()
        budget = (
            self.config.max_num_batched_tokens
            if self.chunk_target_s is None
            else self.step_budget()
        )
        out.token_budget = budget
        self.lower_left = self.lower_budget
        left = self.run_passes(_StepPasses(self, out), budget)
        if self.kv_cache.pending_copy_on_write:
            out.copy_on_write = self.kv_cache.take_copy_on_write()
        total = budget - left
        out.total_num_scheduled_tokens = total
        self.count_steps(1, total)
        return out

    def step_budget(self) -> int:
        """This step's token budget: ``max_num_batched_tokens``, or under adaptive chunking
        what the running decodes leave within the TPOT target (``adaptive_budget``)."""
        if self.chunk_target_s is None or self.step_time is None:
            return self.config.max_num_batched_tokens
        decodes = [r.num_computed_tokens + 1 for r in self.running if is_decoder(r)]
        prior = next((r.num_computed_tokens for r in self.running if not is_decoder(r)), 0)
        return self.budget_for(len(decodes), sum(decodes), prior)

    def budget_for(self, num_decodes: int, context_sum: int, prior: int) -> int:
        """Adaptive chunking's budget for a step whose running requests hold
        ``num_decodes`` decodes reading ``context_sum`` tokens and a first prefilling one
        ``prior`` tokens in (the stretch planner asks it of each planned step)."""
        assert self.chunk_target_s is not None and self.step_time is not None
        self._last_budget = adaptive_budget(
            self.chunk_target_s,
            self.step_time,
            num_decodes,
            context_sum,
            self.config.max_num_batched_tokens,
            prior,
            near=self._last_budget,
        )
        return self._last_budget

    def run_passes(self, passes: Passes, budget: int) -> int:
        """Run a step's passes in the policy's order with ``budget`` tokens; what they
        leave. Chunked: the running requests, then (unless one was preempted) any waiting
        ones. Prefill-first: a prompt at the waiting head first; only when that scheduled
        nothing, the running requests, then (unless one was preempted) swapped ones.

        The scheduler's ``schedule`` and the stretch planner both call this, so a planned
        step takes its passes in the scheduler's order by construction."""
        if not self.prefill_first:
            budget = passes.serve_running(budget)
            if not passes.preempted:
                budget = passes.serve_waiting(budget, ADMIT_ANY)
            return budget
        start = budget
        if prompts_first(True, passes.head()):
            budget = passes.serve_waiting(budget, ADMIT_PROMPTS)
        if budget == start:  # the prompt pass scheduled nothing
            budget = passes.serve_running(budget)
            if not passes.preempted:
                budget = passes.serve_waiting(budget, ADMIT_SWAPPED)
        return budget

    def head_budget(self, head: Request, kinds: int, budget: int, num_seated: int) -> int:
        """The tokens the waiting ``head`` may take in a pass admitting ``kinds`` with
        ``budget`` left, next to ``num_seated`` running requests; 0 or less when the pass
        stops at it (a kind it does not admit, no seat, the lower tiers' share spent)."""
        swapped = head.status is SWAPPED
        if (kinds == ADMIT_PROMPTS and swapped) or (kinds == ADMIT_SWAPPED and not swapped):
            return 0
        if not self.has_seat_for(head, num_seated):
            return 0
        if head.tier > 0 and self.lower_left is not None:
            return min(budget, self.lower_left)
        return budget

    def running_tokens(self, num_left: int, computed: int, budget: int) -> int:
        """``running_chunk`` of a running request with ``num_left`` tokens to compute after
        ``computed``, under this configuration's threshold and model length."""
        return running_chunk(num_left, computed, self.threshold, budget, self.max_model_len)

    def count_steps(self, num_steps: int, max_tokens: int) -> None:
        """Count ``num_steps`` steps, the largest of which schedules ``max_tokens``."""
        self.steps += num_steps
        if max_tokens > self.max_step_tokens:
            self.max_step_tokens = max_tokens

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        running = self.running
        kv = self.kv_cache
        req_blocks = kv.req_blocks
        cow_pending = kv.cow_pending
        bs = self.block_size
        scheduled = out.num_scheduled_tokens
        samples = out.num_samples
        prefill = 0
        tiers = self.lower_left is not None
        lower_left = self.lower_left or 0  # what the lower tiers may still take
        limited = False  # whether ``req`` takes from the lower tiers' share (tiers only)
        for req in running:  # preemption only pops entries after ``req`` (or ``req`` itself)
            if budget <= 0:
                break
            computed = req.num_computed_tokens
            total = len(req.all_token_ids)
            n = total - computed
            rid = req.request_id
            has_output = bool(req.output_token_ids)
            if tiers:
                limited = req.tier > 0
                if limited and lower_left < 1:
                    continue  # the lower tiers' share of this step is spent
            if is_decoding(n, has_output):  # the hot path
                if self.propose is not None:
                    cap = min(budget, lower_left) if limited else budget
                    drafted = self._schedule_draft(req, out, cap)
                    if drafted:
                        budget -= drafted
                        if limited:
                            lower_left -= drafted
                        continue
                # needs_blocks only at a block boundary (or a fork's shared block)
                if (computed % bs == 0 or cow_pending) and not (
                    kv.allocate_slots(req, 1) or self._make_room(req, 1, out)
                ):
                    break
                scheduled[rid] = 1
                samples[rid] = 1
                budget -= 1
                if limited:
                    lower_left -= 1
                continue
            n = self.running_tokens(n, computed, min(budget, lower_left) if limited else budget)
            if (
                (needs_blocks(computed, n, req_blocks[rid].num_slots) or cow_pending)
                and not kv.allocate_slots(req, n)
                and not self._make_room(req, n, out)
            ):
                break  # ``req`` itself left the running list
            scheduled[rid] = n
            if computed + n == total:
                samples[rid] = num_samples(has_output, req.sampling_params.n)
            if counts_as_prefill(n, has_output):
                prefill += n
            budget -= n
            if limited:
                lower_left -= n
        out.num_prefill_tokens += prefill
        if tiers:
            self.lower_left = lower_left
        return budget

    def _schedule_draft(self, req: Request, out: SchedulerOutput, budget: int) -> int:
        """Schedule decoding ``req`` with a draft: its tokens (1 + draft), or 0 for none (no
        draft, or no room for one without preempting: it decodes plainly)."""
        assert self.propose is not None
        num_tokens = len(req.all_token_ids)
        k = min(
            self.num_spec,
            budget - 1,
            self.threshold - 1,  # vLLM caps a drafted step by the long prefill threshold too
            req.max_num_tokens - num_tokens - 1,  # a step appends up to k + 1 tokens
            self.max_model_len - num_tokens,
        )
        if k <= 0:
            return 0
        if self.draft_model is not None and not (  # it writes the draft's KV: slots first
            speculates(req) and self.kv_cache.allocate_slots(req, 1 + k)
        ):
            return 0
        draft = self.propose(req, k)
        if not draft or not self.kv_cache.allocate_slots(req, 1 + len(draft)):
            return 0
        rid = req.request_id
        out.num_scheduled_tokens[rid] = 1 + len(draft)
        out.num_samples[rid] = 1
        out.spec_token_ids[rid] = draft
        return 1 + len(draft)

    def _propose_in_slots(self, req: Request, k: int) -> list[int]:
        assert self.draft_model is not None
        table = self.kv_cache.block_tables[req.request_id]
        return self.draft_model.propose_in_slots(req, k, table)

    def _make_room(self, req: Request, num_new_tokens: int, out: SchedulerOutput) -> bool:
        """Preempt the most recently admitted running requests until ``req`` fits.

        False when ``req`` itself had to go. Alone, it can never fit: it finishes with
        reason "length" rather than waiting forever.
        """
        while True:
            victim = self.running.pop()
            self._leave_running(victim)
            if victim is req and not self.running:
                self.finish(req, RequestStatus.FINISHED_LENGTH, emit=True)
                return False
            self._preempt(victim, out)
            if victim is req:
                return False
            if self.kv_cache.allocate_slots(req, num_new_tokens):
                return True

    def advance(self, seconds: float) -> None:
        """A step of ``seconds`` ran. With a decode budget, the waiting requests that now
        earn priority move ahead (between steps, so each step sees settled queues)."""
        self.clock += seconds
        budget_s = self.budget_s
        if budget_s is None:
            return
        due = self.budget_watch.due(self.clock, budget_s)
        if due:
            assert isinstance(self.waiting, PriorityWaiting)  # a budget orders the queue
            self.waiting.requeue(due, _boost)

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        out.preempted_request_ids.append(victim.request_id)
        copies = self.preempt(victim)
        if copies:
            out.swap_out.extend(copies)

    def preempt_running(self, victim: Request) -> None:
        """Take ``victim`` out of the running requests and preempt it, as ``_make_room``
        does (``apply_stretch`` applies a planned preemption with it). A victim is the
        last running request: it is looked for from the end."""
        running = self.running
        k = len(running) - 1
        while running[k] is not victim:
            k -= 1
        del running[k]
        self._leave_running(victim)
        self.preempt(victim)

    def preempt(self, victim: Request) -> list[BlockCopy] | None:
        """Preempt ``victim`` (out of the running list already): swap it out, or drop its
        blocks to recompute it, and put it at the waiting front. The swap copies, or None
        when it is recomputed."""
        victim.preempted_at = self.clock
        if self.budget_s is not None:
            self.budget_watch.add(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        computed = victim.num_computed_tokens
        if swaps(self.preemption_mode, computed, self.swap_threshold):
            copies = self.kv_cache.swap_out(victim)
            if copies is not None:
                self.num_swap_outs += 1
                self.num_swapped_tokens += computed
                victim.status = SWAPPED
                self.waiting.appendleft(victim)
                return copies
        self.num_recomputed_tokens += computed
        self.kv_cache.free(victim)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(victim)
        return None

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, kinds: int) -> int:
        waiting = self.waiting
        while waiting and budget > 0:
            req = waiting[0]
            avail = self.head_budget(req, kinds, budget, len(self.running))
            if avail <= 0:
                break  # with tiers: all behind a spent lower-tier share are lower tiers
            swapped = req.status is SWAPPED
            n = self._admit_swapped(req, out, avail) if swapped else self._admit(req, out, avail)
            if n is None:
                break
            if n == 0:
                continue  # it could never fit and was finished
            self.seat_head()
            rid = req.request_id
            out.num_scheduled_tokens[rid] = n
            if req.num_computed_tokens + n == len(req.all_token_ids):
                out.num_samples[rid] = num_samples(
                    bool(req.output_token_ids), req.sampling_params.n
                )
            if not swapped or counts_as_prefill(n, bool(req.output_token_ids)):
                out.num_prefill_tokens += n  # a (re)start is a prefill, whatever its size
            budget -= n
            if req.tier > 0 and self.lower_left is not None:
                self.lower_left -= n
        return budget

    def seat_head(self) -> Request:
        """Move the waiting head (admitted, its blocks allocated) to the running requests."""
        req = self.waiting.popleft()
        req.status = RUNNING
        req.own_token_ids()
        if self.key is None:
            self.running.append(req)
        else:
            self._seat(req)
        self.fork_seats += req.seats - 1
        return req

    def _seat(self, req: Request) -> None:
        if self.key is None:
            self.running.append(req)
        else:
            bisect.insort_right(self.running, req, key=self.key)

    def has_seat_for(self, req: Request, num_seated: int) -> bool:
        """Whether ``req`` fits next to ``num_seated`` running requests and the seats
        reserved for forks still to come."""
        return has_seat(num_seated, self.fork_seats, req.seats, self.max_num_seqs)

    def swap_in_need(self, req: Request, budget: int) -> int | None:
        """The GPU blocks admitting swapped ``req`` with ``budget`` tokens left would take;
        None when its chunk does not fit the budget (it is not tried)."""
        n = self.chunk(req, req.num_computed_tokens, budget)
        return None if n is None else self.kv_cache.swap_in_blocks(req, n)

    def chunk(self, req: Request, computed: int, budget: int) -> int | None:
        """``first_chunk`` of a waiting request that has ``computed`` tokens."""
        n = len(req.all_token_ids) - computed
        return first_chunk(n, self.threshold, budget, self.prefill_first)

    def _admit(self, req: Request, out: SchedulerOutput, budget: int) -> int | None:
        """Allocate a waiting (new or recompute-preempted) request's first chunk."""
        kv = self.kv_cache
        if req.num_external_tokens and req.status is WAITING:
            return self._admit_external(req, out, budget)
        hit = kv.get_computed_blocks(req)
        num_hit = hit.num_tokens if hit is not None else 0
        n = self.chunk(req, num_hit, budget)
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

    def _admit_external(self, req: Request, out: SchedulerOutput, budget: int) -> int | None:
        """A new request whose first ``num_external_tokens`` of KV arrived from another
        instance: they take blocks here but no compute (no prefix-cache lookup)."""
        external = req.num_external_tokens
        n = self.chunk(req, external, budget)
        if n is None:
            return None
        req.num_computed_tokens = external
        if not self.kv_cache.allocate_slots(req, n):
            req.num_computed_tokens = 0
            return self._never_fits(req)
        out.new_request_ids.append(req.request_id)
        return n

    def _admit_swapped(self, req: Request, out: SchedulerOutput, budget: int) -> int | None:
        n = self.chunk(req, req.num_computed_tokens, budget)
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
        self.finish(req, RequestStatus.FINISHED_LENGTH, emit=True)
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
        take_token_ = take_token
        spec = out.spec_token_ids
        for rid, n in out.num_scheduled_tokens.items():
            req = requests[rid]
            if spec and rid in spec:
                n = self._take_verified(req, spec[rid], result, outputs, finished)
                if caching and fills_block(req.num_computed_tokens, n, bs):
                    uncommitted[rid] = req
                continue
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            if caching and fills_block(computed, n, bs):
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
            outputs.append(take_token_(req, tok, finished))
        if finished:
            for req, status in finished:
                self.finish(req, status)
            self.drop_finished()
        return outputs

    def _take_verified(
        self,
        req: Request,
        draft: list[int],
        result: ExecutorOutput,
        outputs: list[RequestOutput],
        finished: list[tuple[Request, RequestStatus]],
    ) -> int:
        """Append the verified tokens of a drafted step; roll back the KV of the rejected
        ones (only verified tokens count as computed, so only they can reach the prefix
        cache). Returns how many tokens' KV the step kept."""
        rid = req.request_id
        tokens = result.sampled_token_ids.get(rid)
        if not tokens or len(tokens) > len(draft) + 1 or tokens[:-1] != draft[: len(tokens) - 1]:
            raise RuntimeError(
                f"executor returned {tokens!r} for request {rid!r} with draft {draft!r}; "
                "expected the accepted draft prefix and one more token"
            )
        accepted = len(tokens) - 1
        self.num_drafts += 1
        self.num_draft_tokens += len(draft)
        self.num_accepted_tokens += accepted
        for pos in range(accepted):
            self.num_accepted_tokens_per_pos[pos] += 1
        before = req.num_computed_tokens
        appended: list[int] = []
        reason = None
        for token in tokens:
            appended.append(token)
            reason = take_token(req, token, finished).finish_reason
            if reason is not None:
                break
        req.num_computed_tokens = len(req.all_token_ids) - 1  # the last one has no KV yet
        self.kv_cache.rollback(req)
        output = request_output(req, appended, reason)
        logprobs = result.logprobs.get(rid)
        if logprobs:
            output.logprobs = logprobs[: len(appended)]
        outputs.append(output)
        return req.num_computed_tokens - before

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
            output = take_token(member, tokens[index], finished)
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
                priority=parent.priority,
                tier=parent.tier,
                queue_seq=parent.queue_seq,
            )
            child.max_num_tokens = parent.max_num_tokens
            child.own_token_ids()
            self.kv_cache.fork(parent, child)
            self.requests[child.request_id] = child
            self._seat(child)
            family.append(child)
        return family

    # -- leaving -------------------------------------------------------------------------

    def _leave_running(self, request: Request) -> None:
        if request.needs_fork:
            self.fork_seats -= request.sampling_params.n - 1

    def drop_finished(self) -> None:
        """Take the requests that finished out of the running list."""
        self.running = [r for r in self.running if r.status is RUNNING]

    def finish(self, request: Request, status: RequestStatus, emit: bool = False) -> None:
        """Free everything the request holds; its id reaches executors with the next step."""
        if emit:
            self.pending_outputs.append(request_output(request, [], status.value))
        request.status = status
        self.kv_cache.free(request)
        del self.requests[request.request_id]
        self.finished_request_ids.add(request.request_id)


class _StepPasses:
    """The scheduler's own passes (``Passes``), filling one step's ``out``."""

    __slots__ = ("out", "sched")

    def __init__(self, sched: Scheduler, out: SchedulerOutput) -> None:
        self.sched = sched
        self.out = out

    def head(self) -> Request | None:
        waiting = self.sched.waiting
        return waiting[0] if waiting else None

    def serve_running(self, budget: int) -> int:
        return self.sched._schedule_running(self.out, budget)

    def serve_waiting(self, budget: int, kinds: int) -> int:
        return self.sched._schedule_waiting(self.out, budget, kinds)

    @property
    def preempted(self) -> bool:
        return bool(self.out.preempted_request_ids)


def _boost(req: Request) -> None:
    req.boosted = True
