"""The executor protocol: turns a ``SchedulerOutput`` into sampled tokens and a duration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from slotune.engine.config import EngineConfig
from slotune.engine.scheduler_output import SchedulerOutput


@dataclass
class ExecutorOutput:
    """Sampled tokens of the requests that sampled this step, and the step's duration.

    ``sampled_token_ids[rid]`` has ``scheduler_output.num_samples[rid]`` tokens, and
    ``logprobs[rid]`` their logprobs; ``top_logprobs[rid]`` (requests that ask for
    ``SamplingParams.logprobs``) the most likely tokens of the distribution they were drawn
    from, most likely first.
    """

    sampled_token_ids: dict[str, list[int]]
    duration_s: float
    logprobs: dict[str, list[float]] = field(default_factory=dict)
    top_logprobs: dict[str, dict[int, float]] = field(default_factory=dict)
    decode_context_sum: int = 0  # what ``StepStats`` of the same names record
    prefill_context_sum: int = 0


@dataclass(frozen=True)
class KVCacheCapacity:
    num_gpu_blocks: int
    num_cpu_blocks: int


class Executor(Protocol):
    def determine_capacity(self, config: EngineConfig) -> KVCacheCapacity:
        """KV blocks that fit on the device and in ``config.swap_space_gb`` of host memory."""
        ...

    def initialize_cache(self, config: EngineConfig, capacity: KVCacheCapacity) -> None:
        """Allocate the KV cache with the final block counts (after any override)."""
        ...

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput: ...
