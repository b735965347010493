"""Pipeline parallelism priced beside tensor parallelism: ``pp`` stages of ``tp`` GPUs.

Each stage holds ``ceil(layers / pp)`` of the model's layers (and, priced on every stage,
the embeddings and LM head: the last stage is the slowest, and a pipeline runs at its
slowest stage), so a GPU keeps ``1/pp`` of the layers' weights and KV cache: the pool
grows. A step's batch is split into ``m`` micro-batches (at most one per request; default
``pp``, as many as stages) that flow through the stages GPipe-style: each takes ``1/m`` of
a stage's step time, so the step takes ``(m + pp − 1) / m`` stage steps — ``pp − 1`` of
them the bubble — plus the ``pp − 1`` hops of the first micro-batch's activations between
stages (alpha-beta over the GPUs' interconnect, as TP's all-reduce). Splitting a step
evenly ignores the per-kernel overheads every micro-batch pays again, so small steps come
out optimistic. Dense models only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.engine.executor import KVCacheCapacity
from slotune.engine.sim.cost_model import CostModel
from slotune.engine.sim.executor import SimExecutor
from slotune.engine.sim.models import ModelSpec
from slotune.engine.sim.profile import GpuProfile
from slotune.engine.sim.stack import StackProfile

DTYPE_BYTES = 2  # activations in bf16


def stage_model(model: ModelSpec, pp: int) -> ModelSpec:
    """What one of ``pp`` stages holds: ``ceil(layers / pp)`` layers, as many of them
    sliding-window as the model's share rounded down."""
    if pp < 1 or pp > model.num_layers:
        raise ValueError(f"pp: must be between 1 and the model's {model.num_layers} layers")
    if model.moe is not None and pp > 1:
        raise ValueError(f"pp: pipeline parallelism is priced for dense models only ({model.name})")
    layers = math.ceil(model.num_layers / pp)
    sliding = model.num_sliding_layers * layers // model.num_layers
    return replace(model, num_layers=layers, num_sliding_layers=sliding)


def pipeline_seconds(stage_s: float, pp: int, micro_batches: int, hop_s: float) -> float:
    """A step of ``micro_batches`` through ``pp`` stages of ``stage_s`` each (for the whole
    batch): ``(m + pp − 1)`` slots of ``stage_s / m`` and ``pp − 1`` activation hops."""
    m = max(micro_batches, 1)
    return stage_s * (m + pp - 1) / m + (pp - 1) * hop_s


class PipelineCost:
    """A stage's ``CostModel`` priced as a pipeline of ``pp`` stages (``step_seconds``);
    everything else is the stage's."""

    def __init__(self, stage: CostModel, pp: int, micro_batches: int) -> None:
        self.stage, self.pp, self.micro_batches = stage, pp, micro_batches
        system = stage.profile.system
        self._hop_latency = float(system.allreduce_latency_us or 0.0) * 1e-6
        self._hop_bw = stage.profile.gpu.interconnect_gbps * 1e9 / 2  # one direction
        self._row_bytes = stage.model.hidden_size * DTYPE_BYTES

    def hop_seconds(self, num_tokens: int, micro_batches: int) -> float:
        return self._hop_latency + num_tokens / micro_batches * self._row_bytes / self._hop_bw

    def step_seconds(
        self,
        num_tokens: int,
        num_samples: int,
        num_requests: int,
        num_decodes: int = 0,
        decode_context_sum: int = 0,
        prefill_chunks: Sequence[tuple[int, int]] = (),
        num_swapped_blocks: int = 0,
        num_cow_blocks: int = 0,
    ) -> float:
        t = self.stage.step_seconds(
            num_tokens,
            num_samples,
            num_requests,
            num_decodes,
            decode_context_sum,
            prefill_chunks,
            num_swapped_blocks,
            num_cow_blocks,
        )
        m = max(min(self.micro_batches, num_requests), 1)
        return pipeline_seconds(t, self.pp, m, self.hop_seconds(num_tokens, m))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stage, name)


class PipelineSimExecutor(SimExecutor):
    """The simulated executor on ``pp`` pipeline stages of ``tp`` GPUs each."""

    def __init__(
        self,
        gpu: str | GpuProfile = "h100",
        model: str = "llama-3-8b",
        tp: int = 1,
        stack: str | StackProfile | None = None,
        *,
        pp: int = 2,
        micro_batches: int | None = None,
        quantization: str | None = None,
    ) -> None:
        super().__init__(gpu, model, tp, stack, quantization=quantization)
        self.full_model = self.model
        self.model = stage_model(self.model, pp)
        self.pp = pp
        self.micro_batches = micro_batches or pp
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches: must be >= 1 (got {micro_batches})")
        self.cost_model = PipelineCost(  # type: ignore[assignment]
            CostModel(self.profile, self.model, tp, stack=self.stack), pp, self.micro_batches
        )

    def initialize_cache(self, config: EngineConfig, capacity: KVCacheCapacity) -> None:
        super().initialize_cache(config, capacity)
        self.cost_model = PipelineCost(  # type: ignore[assignment]
            self.cost_model, self.pp, self.micro_batches
        )
