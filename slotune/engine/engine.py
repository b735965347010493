"""The engine: scheduler + KV-cache manager + an executor, with vLLM's familiar surface."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.engine.executor import Executor, ExecutorOutput, KVCacheCapacity
from slotune.engine.kv_cache.manager import KVCacheManager
from slotune.engine.outputs import RequestOutput, StepStats
from slotune.engine.request import Request
from slotune.engine.sampling_params import SamplingParams
from slotune.engine.scheduler import Scheduler

_NO_OUTPUT = ExecutorOutput(sampled_token_ids={}, duration_s=0.0)


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
    ) -> None:
        """``extra_eos_token_ids``: more end-of-sequence tokens (Llama 3 has several); they
        stop a request as ``eos_token_id`` does, unless it ignores eos."""
        self.config = config
        self.executor = executor
        self.eos_token_id = eos_token_id
        self._extra_eos = frozenset(extra_eos_token_ids) - {eos_token_id}
        self.last_step: StepStats | None = None
        self.num_fast_forward_steps = 0
        self.last_steps: list[StepStats] = []  # every step the last step() or fast_forward() ran
        # executors that can tell a decode stretch's durations and tokens in advance
        self._stretches = all(
            hasattr(executor, name) for name in ("decode_stretch_durations", "sampled_tokens")
        )
        capacity = executor.determine_capacity(config)
        num_gpu_blocks = config.num_gpu_blocks or capacity.num_gpu_blocks
        if num_gpu_blocks < 1:
            raise ValueError(
                f"Engine: the executor found room for {num_gpu_blocks} KV blocks; raise "
                "gpu_memory_utilization, shrink the model, or set num_gpu_blocks"
            )
        num_cpu_blocks = capacity.num_cpu_blocks if config.preemption_mode == "swap" else 0
        self.capacity = KVCacheCapacity(num_gpu_blocks, max(num_cpu_blocks, 0))
        executor.initialize_cache(config, self.capacity)
        self.kv_cache = KVCacheManager(
            self.capacity.num_gpu_blocks,
            self.capacity.num_cpu_blocks,
            config.block_size,
            config.prefix_caching,
        )
        self.scheduler = Scheduler(config, self.kv_cache)
        self._used_ids: set[str] = set()
        self._num_completions: dict[str, int] = {}

    @classmethod
    def simulated(
        cls,
        config: EngineConfig,
        *,
        gpu: str = "h100",
        model: str = "llama-3-8b",
        tp: int = 1,
    ) -> Engine:
        """An engine on a simulated GPU: virtual step durations from the cost model."""
        from slotune.engine.sim import SimExecutor

        return cls(config, SimExecutor(gpu=gpu, model=model, tp=tp))

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
    ) -> None:
        params = params if params is not None else SamplingParams()
        self._validate(request_id, prompt_token_ids, params)
        request = Request(
            request_id,
            list(prompt_token_ids),
            params,
            arrival_time=arrival_time,
            eos_token_id=self.eos_token_id,
        )
        if self._extra_eos and not params.ignore_eos:
            request.stop_ids = request.stop_ids | self._extra_eos
        self._used_ids.add(request_id)
        if params.n > 1:
            self._num_completions[request_id] = params.n
            self._used_ids.update(f"{request_id}#{i}" for i in range(1, params.n))
        self.scheduler.add_request(request)

    def _validate(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        where = f"add_request({request_id!r})"
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"{where}: request_id must be a non-empty string")
        if request_id in self._used_ids:
            raise ValueError(f"{where}: request id already used; every request needs a new id")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"{where}: params must be SamplingParams (got {type(params)})")
        if not prompt:
            raise ValueError(f"{where}: empty prompt; a prompt needs at least one token")
        try:
            if min(array("q", prompt)) < 0:  # C-speed type and range check of every token
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{where}: prompt_token_ids must be non-negative integers") from None
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
        self.scheduler.abort_request(request_id)
        for i in range(1, self._num_completions.get(request_id, 1)):
            self.scheduler.abort_request(f"{request_id}#{i}")

    def has_unfinished_requests(self) -> bool:
        return bool(self.scheduler.requests)

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
        total = out.total_num_scheduled_tokens
        self.last_step = StepStats(  # positional: measurably cheaper once per step
            result.duration_s,
            total,
            out.num_prefill_tokens,
            total - out.num_prefill_tokens,
            len(scheduler.running),
            len(scheduler.waiting),
            usage,
            len(out.preempted_request_ids),
        )
        self.last_steps = [self.last_step]
        return outputs

    def fast_forward(
        self, start_time_s: float, until_time_s: float | None, max_steps: int = 1 << 20
    ) -> list[RequestOutput]:
        """Run a stretch of plain decode steps at once, exactly as ``step()`` would run them
        one by one; ``[]`` (and nothing done) when the next step is not such a step or the
        executor cannot tell durations and tokens in advance (only the simulator can).

        For a virtual clock: step ``j`` ends at ``start_time_s`` plus the durations of steps
        1..j, added left to right. The stretch ends with the first step that ends at or
        after ``until_time_s`` (the next arrival: the caller adds it after that step, as
        after any step), with a finishing request, where blocks would run short, or after
        ``max_steps``. ``last_steps`` holds one ``StepStats`` per step; each output carries
        one token per step (all running requests decode in every step of a stretch).
        """
        scheduler = self.scheduler
        if not self._stretches or scheduler.pending_outputs:
            return []
        k = scheduler.decode_stretch_limit(max_steps)
        if not k:
            return []
        executor: Any = self.executor
        running = scheduler.running
        num = len(running)
        context = sum(r.num_computed_tokens for r in running) + num
        durations = self._stretch_durations(num, context, k, start_time_s, until_time_s)
        k = len(durations)
        tokens = {r.request_id: executor.sampled_tokens(r, len(r.all_token_ids), k) for r in running}
        for r in running:
            stop = r.stop_ids
            if stop and not stop.isdisjoint(tokens[r.request_id][:-1]):
                k = min(k, next(j for j, tok in enumerate(tokens[r.request_id], 1) if tok in stop))
        if k < len(durations):
            del durations[k:]
            for toks in tokens.values():
                del toks[k:]
        kv = self.kv_cache
        used = kv.pool.num_used_blocks
        num_blocks = kv.num_gpu_blocks
        waiting = len(scheduler.waiting)
        outputs = [
            RequestOutput(
                r.parent_id,
                r.index,
                tokens[r.request_id],
                False,
                None,
                len(r.prompt_token_ids),
                r.num_cached_tokens,
                r.num_preemptions,
            )
            for r in running
        ]
        stretch = scheduler.advance_decodes(tokens, k)
        steps = []
        for d, new in zip(durations, stretch.new_blocks, strict=True):
            used += new
            steps.append(StepStats(d, num, 0, num, num, waiting, used / num_blocks, 0))
        if stretch.finished:
            finished = stretch.finished
            for out, r in zip(outputs, running, strict=True):
                reason = finished.get(r.request_id)
                if reason is not None:
                    out.finished = True
                    out.finish_reason = reason
            last = steps[-1]
            steps[-1] = StepStats(
                last.duration_s, num, 0, num, len(scheduler.running), waiting,
                last.kv_cache_usage, 0,
            )
        self.last_steps = steps
        self.last_step = steps[-1]
        self.num_fast_forward_steps += k
        return outputs

    def _stretch_durations(
        self, num: int, context: int, k: int, start: float, until: float | None
    ) -> list[float]:
        """The durations of up to ``k`` decode steps, up to the first ending at ``until``;
        asked for in growing chunks, as the horizon is often only a few steps away."""
        stretch = self.executor.decode_stretch_durations  # type: ignore[attr-defined]
        if until is None:
            return stretch(num, k, context)
        durations: list[float] = []
        t = start
        chunk = 8
        while len(durations) < k:
            done = len(durations)
            for d in stretch(num, min(chunk, k - done), context + done * num):
                durations.append(d)
                t += d
                if t >= until:
                    return durations
            chunk *= 4
        return durations

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
            "num_copy_on_write": kv.num_copy_on_write,
            "prefix_cache_queries_tokens": kv.prefix_cache_queries_tokens,
            "prefix_cache_hit_tokens": kv.prefix_cache_hit_tokens,
            "steps": s.steps,
            "max_step_tokens": s.max_step_tokens,
            "fast_forward_steps": self.num_fast_forward_steps,
        }
