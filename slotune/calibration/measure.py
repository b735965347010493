"""Time the real executor on chosen step shapes and on the steps of real engine runs.

Nothing here imports torch: the executor is passed in (see ``on_device.calibrate``).
"""

from __future__ import annotations

import random
import statistics
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slotune.engine.config import EngineConfig
from slotune.engine.request import Request
from slotune.engine.sampling_params import SamplingParams, exact_length
from slotune.engine.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from slotune.engine.executor import ExecutorOutput
    from slotune.engine.model.executor import TorchExecutor

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


@dataclass(frozen=True)
class StepShape:
    """One step: prefill chunks as ``(chunk, prior context)`` and decodes by prior context."""

    prefills: tuple[tuple[int, int], ...] = ()
    decodes: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(c for c, _ in self.prefills) + len(self.decodes)

    @property
    def num_requests(self) -> int:
        return len(self.prefills) + len(self.decodes)

    def label(self) -> str:
        parts = [f"prefill {c}@{p}" for c, p in self.prefills]
        if self.decodes:
            mean = round(sum(self.decodes) / len(self.decodes))
            parts.append(f"decode {len(self.decodes)}x@{mean}")
        return " + ".join(parts)


@dataclass(frozen=True)
class Measurement:
    shape: StepShape
    seconds: float
    source: str = "grid"  # or "workload": a step of a recorded engine run


# Requests a recorded run holds at once. All of them at once, the contexts grow in step and
# a batch spreads less than a server's: 8 decodes formed 2.2 of the reference attention's
# groups (one call each) against 3.7 in a closed loop of 8 users, and the profile priced
# those users' steps 7 % cheap (BENCHMARKS, issue 25).
IN_FLIGHT = 16
CONTEXT_RATIO = 16.0
"""A grid decode batch's longest context over its shortest, the contexts spaced evenly on
a log scale around the batch's mean: a served batch mixes requests of many lengths (eight
draws of prompt lengths lognormal with sigma 1 span about 17×), and an engine's attention
may cost more for that mix than for one length at the same total (the reference backend
runs one attention call per group of similar contexts)."""


def spread_contexts(mean: int, batch: int) -> tuple[int, ...]:
    """``batch`` decode contexts spanning ``CONTEXT_RATIO`` evenly in log, averaging ``mean``."""
    if batch == 1:
        return (mean,)
    steps = [CONTEXT_RATIO ** (i / (batch - 1)) for i in range(batch)]
    scale = mean * batch / sum(steps)
    return tuple(max(1, round(scale * x)) for x in steps)


def default_grid(max_context: int = 2048) -> list[StepShape]:
    """Prefill tokens × context, decode batch × mean context (contexts spread as a served
    batch's are), and mixed steps."""
    grid = [
        StepShape(prefills=((chunk, prior),))
        for chunk in (16, 64, 256, 512)
        for prior in (0, 512, 1536)
        if chunk + prior <= max_context
    ]
    grid += [StepShape(decodes=(ctx,)) for ctx in (32, 512, 1024) if ctx < max_context]
    grid += [
        StepShape(decodes=spread_contexts(ctx, batch))
        for batch in (4, 16, 48)
        for ctx in (32, 256, 512)
        if max(spread_contexts(ctx, batch)) < max_context
    ]
    grid += [
        StepShape(prefills=((chunk, 0),), decodes=spread_contexts(256, batch))
        for chunk in (64, 256)
        for batch in (8, 32)
    ]
    return grid


def blocks_needed(shapes: list[StepShape], block_size: int) -> int:
    """KV blocks the largest of ``shapes`` holds."""
    entries = [[c + p for c, p in s.prefills] + [d + 1 for d in s.decodes] for s in shapes]
    return max(sum(-(-n // block_size) for n in e) for e in entries)


def measure_steps(
    executor: TorchExecutor, shapes: list[StepShape], block_size: int, repeats: int = 3
) -> list[Measurement]:
    """Median executor time of each shape (after one warm-up run of it)."""
    out = []
    for shape in shapes:
        so = _scheduler_output(shape, block_size)
        executor.execute(so)
        times = [executor.execute(so).duration_s for _ in range(repeats)]
        out.append(Measurement(shape, statistics.median(times)))
    return out


def _scheduler_output(shape: StepShape, block_size: int) -> SchedulerOutput:
    so = SchedulerOutput()
    next_block = 0
    entries = [(c, p) for c, p in shape.prefills] + [(1, d) for d in shape.decodes]
    for i, (n, prior) in enumerate(entries):
        rid = f"cal{i}"
        req = Request(rid, [(7 * j + i) % 256 + 3 for j in range(prior + n)], _GREEDY)
        req.num_computed_tokens = prior
        blocks = -(-(prior + n) // block_size)
        so.requests[rid] = req
        so.num_scheduled_tokens[rid] = n
        so.block_tables[rid] = list(range(next_block, next_block + blocks))
        so.num_samples[rid] = 1
        next_block += blocks
    so.total_num_scheduled_tokens = shape.num_tokens
    return so


@dataclass(frozen=True)
class WorkloadSteps:
    """Steps of a real engine run: the executor's measurements and the host time around it
    as ``(running requests, seconds)`` rows."""

    measurements: list[Measurement]
    host_rows: list[tuple[int, float]]


def record_workload(
    executor: TorchExecutor,
    block_size: int,
    budget: int,
    num_requests: int = 48,
    seed: int = 0,
    in_flight: int = IN_FLIGHT,
) -> WorkloadSteps:
    """Run a chat-like synthetic workload through a real engine and record every step.

    Its steps are the shapes the simulator will meet in practice (decodes of mixed
    context beside prefill chunks), so fitting on them as well as on the grid keeps the
    cost model right where it matters; the wall time of each ``engine.step`` beyond the
    executor's own is the engine's host overhead (scheduling, KV bookkeeping, outputs).
    The engine holds ``in_flight`` requests, a new one joining as one finishes, as served
    traffic does (see ``IN_FLIGHT``).
    """
    from slotune.engine.engine import Engine

    rng = random.Random(seed)
    config = EngineConfig(
        block_size=block_size,
        max_num_batched_tokens=budget,
        max_num_seqs=64,
        max_model_len=1024,
        num_gpu_blocks=num_requests * 1024 // block_size,
        prefix_caching="none",
    )
    shapes: list[StepShape] = []
    execute = executor.execute

    def recording(so: SchedulerOutput) -> ExecutorOutput:
        prefills, decodes = [], []
        for rid, n in so.num_scheduled_tokens.items():
            prior = so.requests[rid].num_computed_tokens
            if n == 1:
                decodes.append(prior)
            else:
                prefills.append((n, prior))
        shapes.append(StepShape(tuple(prefills), tuple(decodes)))
        return execute(so)

    executor.execute = recording  # type: ignore[method-assign,assignment]
    try:
        engine = Engine(config, executor)
        waiting: deque[tuple[str, list[int], SamplingParams]] = deque()
        for i in range(num_requests):
            prompt = [
                rng.randrange(3, 250) for _ in range(int(rng.lognormvariate(4.3, 0.8)) % 600 + 4)
            ]
            params = exact_length(rng.randint(8, 96))
            waiting.append((f"cal{i}", prompt, params))
        measurements: list[Measurement] = []
        host: list[tuple[int, float]] = []
        timer = executor.timer
        while waiting or engine.has_unfinished_requests():
            while waiting and engine.num_unfinished_requests() < in_flight:
                engine.add_request(*waiting.popleft())
            t = timer()
            engine.step()
            wall = timer() - t
            stats = engine.last_step
            if stats is not None and stats.num_scheduled_tokens:
                measurements.append(Measurement(shapes[-1], stats.duration_s, "workload"))
                host.append((stats.num_running, max(0.0, wall - stats.duration_s)))
    finally:
        del executor.execute
    return WorkloadSteps(measurements, host)
