"""The engine: scheduler + KV-cache manager + an executor, with vLLM's familiar surface."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from slotune.engine.config import EngineConfig
from slotune.engine.executor import Executor, ExecutorOutput, KVCacheCapacity
from slotune.engine.kv_cache.manager import KVCacheManager
from slotune.engine.outputs import RequestOutput, StepStats
from slotune.engine.request import Request
from slotune.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from slotune.engine.sim.profile import GpuProfile
    from slotune.engine.sim.stack import StackProfile
from slotune.engine.chunking import MeasuredStepTime, StepTime
from slotune.engine.scheduler import Scheduler
from slotune.engine.sim.batch import prefill_context_sum
from slotune.engine.stretch import StretchPlan, StretchPlanner, apply_stretch
from slotune.engine.stretch.check import StretchChecker, enabled_by_env
from slotune.engine.stretch.plan import DueWatch, sampled_runs

_NO_OUTPUT = ExecutorOutput(sampled_token_ids={}, duration_s=0.0)


class ArrivalFeed(Protocol):
    """Where ``Engine.run_stretch`` finds the requests that arrive during a stretch."""

    def next_time(self) -> float | None:
        """When the next request is due (None: none is)."""
        ...

    def due(self, now: float) -> list[Request]:
        """The requests due by ``now`` (built with ``Engine.new_request``), taken."""
        ...

    @property
    def at_step_start(self) -> bool:
        """Whether a request joins after a step only if it arrived by that step's start
        (a scheduler that plans each step while the one before runs), not by its end."""
        ...


class Engine:
    """Runs requests to completion one ``step()`` at a time.

    >>> engine = Engine.simulated(EngineConfig(), gpu="h100", model="llama-3-8b")
    >>> engine.add_request("r0", [1, 2, 3], SamplingParams(max_tokens=8, ignore_eos=True))
    >>> while engine.has_unfinished_requests():
    ...     outputs = engine.step()
    """

    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        *,
        eos_token_id: int | None = None,
        extra_eos_token_ids: Sequence[int] = (),
        check_stretches: bool | None = None,
    ) -> None:
        """``extra_eos_token_ids``: more end-of-sequence tokens (Llama 3 has several); they
        stop a request as ``eos_token_id`` does, unless it ignores eos. ``check_stretches``
        (default: the ``SLOTUNE_CHECK_STRETCHES`` environment variable) replays every
        stretch step by step on a shadow scheduler and raises if they differ (see
        ``slotune.engine.stretch.check``)."""
        self.config = config
        self.executor = executor
        self.eos_token_id = eos_token_id
        self._extra_eos = frozenset(extra_eos_token_ids) - {eos_token_id}
        self.last_step: StepStats | None = None
        self.num_stretch_steps = 0
        self.last_steps: list[StepStats] = []  # every step the last step() or run_stretch() ran
        # executors that can tell a stretch's durations and tokens in advance
        self._stretches = all(
            hasattr(executor, name) for name in ("planned_step_seconds", "sampled_token_runs")
        )
        capacity = executor.determine_capacity(config)
        num_gpu_blocks = config.num_gpu_blocks or capacity.num_gpu_blocks
        if num_gpu_blocks < 1:
            raise ValueError(
                f"Engine: the executor found room for {num_gpu_blocks} KV blocks; raise "
                "gpu_memory_utilization, shrink the model, or set num_gpu_blocks"
            )
        num_cpu_blocks = capacity.num_cpu_blocks if config.preemption_mode != "recompute" else 0
        self.capacity = KVCacheCapacity(num_gpu_blocks, max(num_cpu_blocks, 0))
        executor.initialize_cache(config, self.capacity)
        lower_tier_blocks = None
        if config.tiered:
            lower_tier_blocks = config.lower_tier_blocks(num_gpu_blocks)
            if lower_tier_blocks < 1:
                raise ValueError(
                    f"Engine: top_tier_kv_share={config.top_tier_kv_share} of "
                    f"{num_gpu_blocks} KV blocks leaves the lower tiers none; lower it"
                )
        self.kv_cache = KVCacheManager(
            self.capacity.num_gpu_blocks,
            self.capacity.num_cpu_blocks,
            config.block_size,
            config.prefix_caching,
            lower_tier_blocks,
        )
        # adaptive chunking prices steps with the executor's model (the simulator's cost
        # model), else with a fit to the steps this engine ran (the real engine)
        step_time: StepTime | None = getattr(executor, "step_time", None)
        self._measured: MeasuredStepTime | None = None
        if config.adaptive_chunk_ms and step_time is None:
            step_time = self._measured = MeasuredStepTime()
        # an executor that cannot read tokens (the simulator) drafts its own
        self.scheduler = Scheduler(
            config, self.kv_cache, getattr(executor, "propose_draft", None), step_time
        )
        if check_stretches is None:
            check_stretches = enabled_by_env()
        self._checker = (
            StretchChecker(config, self.kv_cache, step_time) if check_stretches else None
        )
        self._used_ids: set[str] = set()
        self._num_completions: dict[str, int] = {}

    @classmethod
    def simulated(
        cls,
        config: EngineConfig,
        *,
        gpu: str | GpuProfile = "h100",
        model: str = "llama-3-8b",
        tp: int = 1,
        stack: str | StackProfile | None = None,
        quantization: str | None = None,
        ep: int = 1,
        spec_acceptance: float | None = None,
    ) -> Engine:
        """An engine on a simulated GPU: virtual step durations from the cost model of
        ``gpu`` and the serving ``stack`` (default: current vLLM V1); ``quantization``
        overrides the model's weight format, ``ep`` is expert parallelism;
        ``spec_acceptance`` the draft acceptance rate when speculation is on."""
        from slotune.engine.sim import SimExecutor

        executor = SimExecutor(
            gpu=gpu,
            model=model,
            tp=tp,
            stack=stack,
            quantization=quantization,
            ep=ep,
            spec_acceptance=spec_acceptance,  # None: the measured default of the kind
        )
        return cls(config, executor)

    @classmethod
    def local(
        cls, config: EngineConfig, *, model: str, device: str = "auto", attention: str = "auto"
    ) -> Engine:
        """An engine running a real model with torch on this machine."""
        from slotune.engine.model import TorchExecutor

        executor = TorchExecutor(model, device=device, attention=attention)
        return cls(
            config,
            executor,
            eos_token_id=executor.eos_token_id,
            extra_eos_token_ids=getattr(executor, "eos_token_ids", ()),
        )

    # -- requests ------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        arrival_time: float = 0.0,
        *,
        priority: int = 0,
        tier: int = 0,
    ) -> None:
        prompt = list(prompt_token_ids)  # the caller may reuse its list; new_request keeps it
        self.enqueue(
            self.new_request(request_id, prompt, params, arrival_time, priority=priority, tier=tier)
        )

    def enqueue(self, request: Request) -> None:
        """Queue a request built by ``new_request``."""
        if self._checker is not None:
            self._checker.add_request(request)
        self.scheduler.add_request(request)

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        arrival_time: float = 0.0,
        *,
        priority: int = 0,
        tier: int = 0,
        tokens_checked: bool = False,
    ) -> Request:
        """A validated request for this engine, its id taken, not yet scheduled: what
        ``add_request`` adds, or what a ``run_stretch`` feed hands in. ``priority`` orders
        it under ``scheduling_policy="priority"`` (lower first); ``tier`` is its service
        tier (0 the highest). ``tokens_checked``: the caller knows every prompt token is
        a non-negative integer (a trace checks its prompts at once), so that check is
        skipped; the others are not. The request keeps ``prompt_token_ids`` itself (no
        engine code changes a prompt): the caller must not change the list afterwards
        (a trace's prompts serve every run of a study without a copy)."""
        params = params if params is not None else SamplingParams()
        self._validate(request_id, prompt_token_ids, params, tokens_checked)
        if priority or tier:
            self._validate_class(request_id, len(prompt_token_ids), priority, tier)
        request = Request(
            request_id,
            prompt_token_ids,
            params,
            arrival_time=arrival_time,
            eos_token_id=self.eos_token_id,
            priority=priority,
            tier=tier,
        )
        if self._extra_eos and not params.ignore_eos:
            request.stop_ids = request.stop_ids | self._extra_eos
        self._used_ids.add(request_id)
        if params.n > 1:
            self._num_completions[request_id] = params.n
            self._used_ids.update(f"{request_id}#{i}" for i in range(1, params.n))
        request.max_num_tokens = min(request.max_num_tokens, self.config.max_model_len)
        return request

    def _validate_class(self, request_id: str, num_prompt: int, priority: int, tier: int) -> None:
        where = f"add_request({request_id!r})"
        for name, value in (("priority", priority), ("tier", tier)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{where}: {name} must be an integer")
        if tier < 0:
            raise ValueError(f"{where}: tier must be >= 0 (got {tier})")
        if tier and not self.kv_cache.can_ever_fit(num_prompt, tier):
            raise ValueError(
                f"{where}: prompt of {num_prompt} tokens needs "
                f"{self.kv_cache.blocks_needed(num_prompt)} KV blocks but tier {tier} may "
                f"hold only {self.kv_cache.lower_tier_blocks}; lower top_tier_kv_share or "
                "shorten the prompt"
            )

    def _validate(
        self, request_id: str, prompt: list[int], params: SamplingParams, tokens_checked: bool
    ) -> None:
        where = f"add_request({request_id!r})"
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"{where}: request_id must be a non-empty string")
        if request_id in self._used_ids:
            raise ValueError(f"{where}: request id already used; every request needs a new id")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"{where}: params must be SamplingParams (got {type(params)})")
        if not prompt:
            raise ValueError(f"{where}: empty prompt; a prompt needs at least one token")
        if not tokens_checked:
            try:
                array("Q", prompt)  # C-speed check: every token a non-negative (64-bit) int
            except (TypeError, OverflowError):
                raise ValueError(
                    f"{where}: prompt_token_ids must be non-negative integers"
                ) from None
        if len(prompt) > self.config.max_model_len:
            raise ValueError(
                f"{where}: prompt of {len(prompt)} tokens exceeds max_model_len="
                f"{self.config.max_model_len}"
            )
        if not self.kv_cache.can_ever_fit(len(prompt)):
            raise ValueError(
                f"{where}: prompt of {len(prompt)} tokens needs "
                f"{self.kv_cache.blocks_needed(len(prompt))} KV blocks but the pool has only "
                f"{self.kv_cache.num_gpu_blocks}; raise num_gpu_blocks or shorten the prompt"
            )
        if params.n > self.config.max_num_seqs:
            raise ValueError(
                f"{where}: SamplingParams.n={params.n} exceeds max_num_seqs="
                f"{self.config.max_num_seqs}; its completions could never run together"
            )
        for i in range(1, params.n):
            if f"{request_id}#{i}" in self._used_ids:
                raise ValueError(f"{where}: the id of completion {i} is already in use")

    def abort_request(self, request_id: str) -> None:
        """Stop a request and all its completions; unknown or finished ids are ignored."""
        ids = [request_id]
        ids += [f"{request_id}#{i}" for i in range(1, self._num_completions.get(request_id, 1))]
        for rid in ids:
            self.scheduler.abort_request(rid)
            if self._checker is not None:
                self._checker.abort_request(rid)

    def forget_request_id(self, request_id: str) -> None:
        """Stop remembering the id of a request that finished or was aborted (and its
        completions' ids), for a long-running caller that makes unique ids itself (the
        server): the engine otherwise keeps every id it was given, to refuse repeats."""
        n = self._num_completions.pop(request_id, 1)
        self._used_ids.discard(request_id)
        self._used_ids.difference_update(f"{request_id}#{i}" for i in range(1, n))

    def has_unfinished_requests(self) -> bool:
        return bool(self.scheduler.requests)

    def num_unfinished_requests(self) -> int:
        """Requests added and not finished or aborted yet (vLLM's
        ``get_num_unfinished_requests``)."""
        return len(self.scheduler.requests)

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache, so that the next requests find it cold; False (nothing
        dropped) while requests are unfinished."""
        if self.has_unfinished_requests() or not self.kv_cache.reset_prefix_cache():
            return False
        if self._checker is not None:
            self._checker.shadow.kv_cache.reset_prefix_cache()
        return True

    # -- stepping ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        scheduler = self.scheduler
        out = scheduler.schedule()
        usage = self.kv_cache.usage
        if out.total_num_scheduled_tokens:
            result = self.executor.execute(out)
        else:
            result = _NO_OUTPUT
            scheduler.finished_request_ids |= out.finished_request_ids  # tell them next time
        outputs = scheduler.update_from_output(out, result)
        scheduler.advance(result.duration_s)
        if self._checker is not None:
            self._checker.step(out, result, outputs)
        total = out.total_num_scheduled_tokens
        if self._measured is not None and total:  # after the shadow: it sees the same fit
            self._measured.observe(total, result.decode_context_sum, result.duration_s)
        self.last_step = StepStats(  # positional: measurably cheaper once per step
            result.duration_s,
            total,
            out.num_prefill_tokens,
            total - out.num_prefill_tokens,
            len(scheduler.running),
            len(scheduler.waiting),
            usage,
            len(out.preempted_request_ids),
            result.decode_context_sum,
            result.prefill_context_sum,
        )
        self.last_steps = [self.last_step]
        return outputs

    def run_stretch(
        self,
        start_time_s: float,
        until_time_s: float | None,
        *,
        stop_at_finish: bool = False,
        max_steps: int = 1 << 20,
        arrivals: ArrivalFeed | None = None,
    ) -> list[tuple[RequestOutput, int]] | None:
        """Run a stretch of steps at once, exactly as ``step()`` would run them one by one;
        None (and nothing done) when the next step is not certain enough for that (see
        ``slotune.engine.stretch``) or the executor cannot tell durations and tokens in
        advance (only the simulator can).

        For a virtual clock: step ``j`` ends at ``start_time_s`` plus the durations of steps
        1..j, added left to right. With ``arrivals``, the requests due by each step's end
        (its start where ``arrivals.at_step_start``) join the waiting queue after it, as a
        caller adding them between steps would do, and the stretch runs on through them.
        It ends with the first step that ends at or after ``until_time_s`` (without
        ``arrivals``: the next arrival, which the caller adds after it; with them: a
        horizon, the requests due at that step's end left to the caller). A stretch also
        ends after ``max_steps``, before a step the planner is unsure of, or with the first
        finish if ``stop_at_finish`` (a caller that may send requests when one finishes).
        ``last_steps`` holds one ``StepStats`` per step. Returns each request's output with
        the index (into ``last_steps``) of the step that sampled its first new token; it
        sampled one token in each step from there.
        """
        if not self._stretches:
            return None
        scheduler = self.scheduler
        planner = StretchPlanner.start(scheduler, stop_at_finish)
        if planner is None:
            return None
        if arrivals is not None and any(r.stop_ids for r in scheduler.running):
            # a stop token would cut the stretch short after its arrivals were handed in
            known = [t for t in (until_time_s, arrivals.next_time()) if t is not None]
            until_time_s, arrivals = min(known, default=None), None
        executor: Any = self.executor
        seconds = executor.planned_step_seconds
        plan = planner.plan
        durations: list[float] = []
        t = start_time_s
        next_arrival = arrivals.next_time() if arrivals is not None else None
        # a decode budget: the step whose end brings a watched request due ends the stretch
        # (the scheduler's clock summed as single steps sum it)
        budget_s = scheduler.budget_s
        watch = (
            DueWatch(scheduler.budget_watch.first_preempted_at(), planner.plan)
            if budget_s is not None
            else None
        )
        clock = scheduler.clock
        while True:
            step = plan.steps[-1]
            d = seconds(
                step.num_tokens,
                step.num_samples,
                step.num_requests,
                step.num_decodes,
                step.context_sum,
                step.chunks,
            )
            durations.append(d)
            t += d
            if until_time_s is not None and t >= until_time_s:
                break
            if watch is not None:
                if step.preempts:
                    watch.note(step, clock)  # its victims were preempted at its start
                clock += d
                watched = watch.first()
                if watched is not None and clock - watched > budget_s:
                    break
            if arrivals is not None:
                cut = t - d if arrivals.at_step_start else t
                if next_arrival is not None and cut >= next_arrival:
                    planner.arrive(arrivals.due(cut))
                    next_arrival = arrivals.next_time()
            if len(durations) >= max_steps or not planner.plan_step():
                break
        plan = planner.finish()
        tokens = self._stretch_tokens(plan)
        stop = _early_stop_step(plan, tokens)
        if stop is not None:  # a stop token ends a request early: plan up to it again
            if arrivals is not None:
                raise RuntimeError("run_stretch: a stop token after arrivals were handed in")
            return self.run_stretch(
                start_time_s, until_time_s, stop_at_finish=stop_at_finish, max_steps=stop
            )
        checker = self._checker
        arrived = checker.copy_arrivals(plan) if checker is not None else []
        result = apply_stretch(scheduler, plan, tokens, durations)
        if checker is not None:
            checker.replay(plan, tokens, result, arrived, scheduler, durations)
        num_blocks = self.kv_cache.num_gpu_blocks
        steps = [
            StepStats(
                d,
                s.num_tokens,
                s.num_prefill,
                s.num_tokens - s.num_prefill,
                running,
                waiting,
                used / num_blocks,
                len(s.preempts or ()),
                s.context_sum,
                prefill_context_sum(s.chunks) if s.chunks else 0,
            )
            for d, s, running, waiting, used in zip(
                durations,
                plan.steps,
                result.num_running,
                result.num_waiting,
                result.used_blocks,
                strict=True,
            )
        ]
        self.last_steps = steps
        self.last_step = steps[-1]
        self.num_stretch_steps += len(steps)
        first = [m.first_sample for m in plan.requests if m.first_sample >= 0]
        return list(zip(result.outputs, first, strict=True))

    def _stretch_tokens(self, plan: StretchPlan) -> list[list[int]]:
        """What each request of the plan samples in its planned steps."""
        return sampled_runs(plan, self.executor.sampled_token_runs)  # type: ignore[attr-defined]

    def stats(self) -> dict[str, Any]:
        kv = self.kv_cache
        s = self.scheduler
        return {
            "num_total_blocks": kv.num_gpu_blocks,
            "num_free_blocks": kv.num_free_blocks,
            "num_cpu_blocks": kv.num_cpu_blocks,
            "num_free_cpu_blocks": kv.num_free_cpu_blocks,
            "num_running": len(s.running),
            "num_waiting": len(s.waiting),
            "num_preemptions": s.num_preemptions,
            "num_swap_outs": s.num_swap_outs,
            "num_swap_ins": s.num_swap_ins,
            "num_recomputed_tokens": s.num_recomputed_tokens,
            "num_swapped_tokens": s.num_swapped_tokens,
            "num_copy_on_write": kv.num_copy_on_write,
            "prefix_cache_queries_tokens": kv.prefix_cache_queries_tokens,
            "prefix_cache_hit_tokens": kv.prefix_cache_hit_tokens,
            "steps": s.steps,
            "max_step_tokens": s.max_step_tokens,
            "stretch_steps": self.num_stretch_steps,
            "spec_num_drafts": s.num_drafts,
            "spec_num_draft_tokens": s.num_draft_tokens,
            "spec_num_accepted_tokens": s.num_accepted_tokens,
            "spec_num_accepted_tokens_per_pos": list(s.num_accepted_tokens_per_pos),
        }


def _early_stop_step(plan: StretchPlan, tokens: list[list[int]]) -> int | None:
    """The number of steps up to the first one that samples a stop token before its
    request's last planned token (a stop token there ends the request early); None if no
    request stops early."""
    steps = None
    for member, toks in zip(plan.requests, tokens, strict=True):
        stop, start = member.request.stop_ids, member.first_sample
        # a request the stretch preempts runs on after its last token: a stop ends it there
        if stop and not stop.isdisjoint(toks if member.preempted >= 0 else toks[:-1]):
            j = next(k for k, tok in enumerate(toks) if tok in stop)
            steps = start + j + 1 if steps is None else min(steps, start + j + 1)
    return steps
