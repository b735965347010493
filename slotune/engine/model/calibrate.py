"""Calibrate the simulator's cost model on this machine by profiling the real executor.

The real executor runs a grid of step shapes (prefill chunks × prior context, decode batch
× context, and a few mixes), and then the steps of two short real engine runs (a small and
a large token budget); the cost model's constants are fitted to all those step times
(Nelder-Mead on squared log error), and the host overhead of the engine around each step
(scheduling, bookkeeping), measured on the same runs, is added as the profile's per-step
and per-request CPU cost. The result is a GPU-profile JSON that ``--gpu`` accepts
wherever a GPU name is accepted, describing this machine and its datasheet-like peaks as
measured here.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slotune.engine.config import EngineConfig
from slotune.engine.executor import ExecutorOutput, KVCacheCapacity
from slotune.engine.model.executor import TorchExecutor
from slotune.engine.request import Request
from slotune.engine.sampling_params import SamplingParams
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.sim.calibration import nelder_mead
from slotune.engine.sim.cost_model import CostModel
from slotune.engine.sim.hardware import GpuSpec
from slotune.engine.sim.models import ModelSpec, get_model
from slotune.engine.sim.profile import (
    ELEMENTWISE_OPS,
    AttentionProfile,
    ElementwiseProfile,
    GpuProfile,
    LinearProfile,
    SystemProfile,
)

GIB = 1 << 30
_GREEDY = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


@dataclass(frozen=True)
class StepShape:
    """One step: prefill chunks as ``(chunk, prior context)`` and decodes by prior context."""

    prefills: tuple[tuple[int, int], ...] = ()
    decodes: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(c for c, _ in self.prefills) + len(self.decodes)

    def label(self) -> str:
        parts = [f"prefill {c}@{p}" for c, p in self.prefills]
        if self.decodes:
            parts.append(f"decode {len(self.decodes)}x@{self.decodes[0]}")
        return " + ".join(parts)


@dataclass(frozen=True)
class Measurement:
    shape: StepShape
    seconds: float
    source: str = "grid"  # or "workload": a step of a recorded engine run


@dataclass(frozen=True)
class CalibrationResult:
    profile: GpuProfile
    measurements: list[Measurement]
    predicted: list[float]
    host_step_s: float
    host_per_request_s: float

    def errors_pct(self) -> list[float]:
        return [
            100.0 * (p - m.seconds) / m.seconds
            for m, p in zip(self.measurements, self.predicted, strict=True)
        ]


def default_grid(max_context: int = 2048) -> list[StepShape]:
    """Prefill tokens × context, decode batch × context, and mixed steps."""
    grid = [
        StepShape(prefills=((chunk, prior),))
        for chunk in (16, 64, 256, 512)
        for prior in (0, 512, 1536)
        if chunk + prior <= max_context
    ]
    grid += [
        StepShape(decodes=(ctx,) * batch)
        for batch in (1, 4, 16, 48)
        for ctx in (32, 512, 1024)
        if ctx < max_context
    ]
    grid += [
        StepShape(prefills=((chunk, 0),), decodes=(256,) * batch)
        for chunk in (64, 256)
        for batch in (8, 32)
    ]
    return grid


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


def blocks_needed(shapes: list[StepShape], block_size: int) -> int:
    entries = [[c + p for c, p in s.prefills] + [d + 1 for d in s.decodes] for s in shapes]
    return max(sum(-(-n // block_size) for n in e) for e in entries)


# -- the machine's peaks ---------------------------------------------------------------------
def machine_spec(device: torch.device, name: str | None = None) -> GpuSpec:
    """Datasheet-like figures measured here: copy bandwidth and large-matmul FLOP/s.

    The cost model counts 2-byte elements; on a float32 CPU model the fitted
    efficiencies absorb the difference, so they read as fractions of these peaks.
    """
    bandwidth = _copy_bandwidth(device)
    flops = _matmul_flops(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        memory_gib = props.total_memory / GIB
        desc = f"{props.name} (calibrated)"
    else:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
        desc = f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return GpuSpec(
        name=name or f"calibrated-{device.type}",
        description=desc,
        memory_gib=round(memory_gib, 2),
        hbm_gbps=round(bandwidth / 1e9, 3),
        bf16_tflops=round(flops / 1e12, 5),
        fp8_tflops=None,
        host_link_gbps=round(bandwidth / 1e9, 3),
        interconnect_gbps=round(bandwidth / 1e9, 3),
        interconnect="none",
        source=f"measured by slotune calibrate on {platform.node() or 'this machine'}",
    )


def _best_time(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _copy_bandwidth(device: torch.device) -> float:
    n = (1 << 28 if device.type == "cuda" else 1 << 25) // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / _best_time(lambda: dst.copy_(src), device)


def _matmul_flops(device: torch.device) -> float:
    n = 4096 if device.type == "cuda" else 1024
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _best_time(lambda: torch.mm(a, b), device)


# -- fitting ----------------------------------------------------------------------------------
_PARAMS = (  # name, initial value, kind: "pos" (log) or "eff" (logit)
    ("linear_overhead_us", 10.0, "pos"),
    ("linear_mem_eff", 0.5, "eff"),
    ("linear_compute_eff", 0.5, "eff"),
    ("linear_half_tokens", 8.0, "pos"),
    ("elementwise_overhead_us", 5.0, "pos"),
    ("elementwise_eff", 0.3, "eff"),
    ("prefill_overhead_us", 20.0, "pos"),
    ("prefill_prefix_eff", 0.2, "eff"),
    ("prefill_causal_eff", 0.2, "eff"),
    ("decode_overhead_us", 20.0, "pos"),
    ("decode_per_seq_us", 5.0, "pos"),
    ("decode_eff", 0.2, "eff"),
    ("cpu_step_us", 200.0, "pos"),
    ("cpu_per_request_us", 20.0, "pos"),
)


def _encode(value: float, kind: str) -> float:
    if kind == "pos":
        return math.log(value)
    return math.log(value / (1 - value))


def _decode(x: float, kind: str) -> float:
    if kind == "pos":
        return math.exp(min(x, 50.0))
    return 1.0 / (1.0 + math.exp(-max(min(x, 50.0), -50.0)))


def build_profile(
    spec: GpuSpec, values: dict[str, float], block_size: int, note: str = ""
) -> GpuProfile:
    elementwise = ElementwiseProfile(
        overhead_us=round(values["elementwise_overhead_us"], 4),
        eff=round(values["elementwise_eff"], 6),
    )
    return GpuProfile(
        gpu=spec,
        linear=LinearProfile(
            overhead_us=round(values["linear_overhead_us"], 4),
            mem_eff=round(values["linear_mem_eff"], 6),
            compute_eff=round(values["linear_compute_eff"], 6),
            half_tokens=round(values["linear_half_tokens"], 4),
            tile_tokens=1,
        ),
        elementwise=dict.fromkeys(ELEMENTWISE_OPS, elementwise),
        attention=AttentionProfile(
            prefill_overhead_us=round(values["prefill_overhead_us"], 4),
            prefill_prefix_eff=round(values["prefill_prefix_eff"], 6),
            prefill_causal_eff=round(values["prefill_causal_eff"], 6),
            q_tile=1,
            decode_overhead_us=round(values["decode_overhead_us"], 4),
            decode_per_seq_us=round(values["decode_per_seq_us"], 4),
            decode_eff=round(values["decode_eff"], 6),
            block_indirection_tokens=0.0,
            reference_block_size=block_size,
        ),
        system=SystemProfile(
            cpu_step_us=round(values["cpu_step_us"], 4),
            cpu_per_request_us=round(values["cpu_per_request_us"], 4),
            reserved_gib=0.0,
        ),
        note=note,
    )


def predict(
    profile: GpuProfile, model: ModelSpec, block_size: int, shapes: list[StepShape]
) -> list[float]:
    """The cost model's durations of ``shapes``, costed as the simulated executor costs them."""
    cost = CostModel(profile, model, 1, block_size)
    out = []
    for shape in shapes:
        n = len(shape.prefills) + len(shape.decodes)
        out.append(
            cost.step_seconds(
                shape.num_tokens,
                n,
                n,
                len(shape.decodes),
                sum(d + 1 for d in shape.decodes),
                list(shape.prefills),
            )
        )
    return out


def fit(
    spec: GpuSpec, model: ModelSpec, block_size: int, measurements: list[Measurement]
) -> dict[str, float]:
    """Constants minimising the weighted mean squared log error of the predicted step
    times; the grid and the recorded workload steps weigh the same in total."""
    kinds = [k for _, _, k in _PARAMS]
    names = [n for n, _, _ in _PARAMS]
    targets = [math.log(m.seconds) for m in measurements]
    shapes = [m.shape for m in measurements]
    counts = {src: sum(m.source == src for m in measurements) for src in ("grid", "workload")}
    weights = [1.0 / counts[m.source] for m in measurements]

    def values_of(x: list[float]) -> dict[str, float]:
        return {n: _decode(v, k) for n, v, k in zip(names, x, kinds, strict=True)}

    def loss(x: list[float]) -> float:
        profile = build_profile(spec, values_of(x), block_size)
        predicted = predict(profile, model, block_size, shapes)
        return sum(
            w * (math.log(p) - t) ** 2 for w, p, t in zip(weights, predicted, targets, strict=True)
        )

    x = [_encode(v, k) for _, v, k in _PARAMS]
    best = loss(x)
    for step in (1.0, 0.5, 0.25, 0.1):
        candidate = nelder_mead(loss, x, step=step, iters=1500)
        value = loss(candidate)
        if value < best:
            x, best = candidate, value
    return values_of(x)


# -- host overhead around the executor ------------------------------------------------------
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
) -> WorkloadSteps:
    """Run a chat-like synthetic workload through a real engine and record every step.

    Its steps are the shapes the simulator will meet in practice (decodes of mixed
    context beside prefill chunks), so fitting on them as well as on the grid keeps the
    cost model right where it matters; the wall time of each ``engine.step`` beyond the
    executor's own is the engine's host overhead (scheduling, KV bookkeeping, outputs).
    """
    import random

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

    executor.execute = recording  # type: ignore[method-assign]
    try:
        engine = Engine(config, executor)
        for i in range(num_requests):
            prompt = [
                rng.randrange(3, 250) for _ in range(int(rng.lognormvariate(4.3, 0.8)) % 600 + 4)
            ]
            params = SamplingParams(max_tokens=rng.randint(8, 96), ignore_eos=True)
            engine.add_request(f"cal{i}", prompt, params)
        measurements: list[Measurement] = []
        host: list[tuple[int, float]] = []
        timer = executor.timer
        while engine.has_unfinished_requests():
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


def _line_fit(rows: list[tuple[int, float]]) -> tuple[float, float]:
    """Non-negative intercept and slope of ``seconds ~ a + b · requests`` (least squares)."""
    if not rows:
        return 0.0, 0.0
    xs = [float(r) for r, _ in rows]
    ys = [s for _, s in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    slope = max(0.0, slope)
    return max(0.0, my - slope * mx), slope


# -- all together ---------------------------------------------------------------------------
def calibrate(
    model_path: str | Path,
    device: str = "auto",
    attention: str = "auto",
    block_size: int = 16,
    grid: list[StepShape] | None = None,
    repeats: int = 5,
    progress: Callable[[str], None] | None = None,
    threads: int | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> CalibrationResult:
    """Profile, record, fit. ``timer`` is the executor's step timer (see TorchExecutor)."""
    say = progress or (lambda _msg: None)
    executor = TorchExecutor(
        model_path, device=device, attention=attention, threads=threads, timer=timer
    )
    shapes = grid if grid is not None else default_grid()
    capacity = KVCacheCapacity(
        num_gpu_blocks=blocks_needed(shapes, block_size) + 64, num_cpu_blocks=0
    )
    executor.initialize_cache(EngineConfig(block_size=block_size), capacity)
    say(f"measuring the peaks of {executor.device}")
    spec = machine_spec(executor.device)
    say(f"profiling {len(shapes)} step shapes")
    measurements = measure_steps(executor, shapes, block_size, repeats)
    say("recording the steps of a real engine run, small and large budget")
    runs = [
        record_workload(executor, block_size, budget, seed=i) for i, budget in enumerate((64, 512))
    ]
    measurements += [m for run in runs for m in run.measurements]
    host_step, host_req = _line_fit([row for run in runs for row in run.host_rows])
    model = get_model(str(Path(model_path) / "config.json"))
    say("fitting the cost model")
    values = fit(spec, model, block_size, measurements)
    values["cpu_step_us"] += host_step * 1e6
    values["cpu_per_request_us"] += host_req * 1e6
    note = (
        f"Calibrated by slotune calibrate on {spec.description} with {Path(model_path).name} "
        f"({executor.dtype}, attention={executor.backend.name if executor.backend else '?'}, "
        f"block_size={block_size}) over {len(shapes)} grid shapes and "
        f"{len(measurements) - len(shapes)} steps of two recorded engine runs; host overhead "
        f"{host_step * 1e6:.0f} us/step + {host_req * 1e6:.1f} us/request included."
    )
    profile = build_profile(spec, values, block_size, note)
    predicted = predict(profile, model, block_size, [m.shape for m in measurements])
    # The host part was measured around the executor, so compare like with like:
    host = [
        host_step + host_req * (len(m.shape.prefills) + len(m.shape.decodes)) for m in measurements
    ]
    predicted = [p - h for p, h in zip(predicted, host, strict=True)]
    return CalibrationResult(profile, measurements, predicted, host_step, host_req)


def profile_json(result: CalibrationResult) -> dict[str, Any]:
    """The profile, with the grid's measured and predicted times and the error summary of
    the recorded workload steps (informational: the loader reads only the profile)."""
    data = result.profile.to_dict()
    data["stack"] = "eager"  # measured through slotune's own engine, steps timed in full
    pairs = list(zip(result.measurements, result.predicted, strict=True))
    data["calibration"] = [
        {"shape": m.shape.label(), "measured_ms": m.seconds * 1e3, "predicted_ms": p * 1e3}
        for m, p in pairs
        if m.source == "grid"
    ]
    workload = sorted(abs(p / m.seconds - 1) * 100 for m, p in pairs if m.source == "workload")
    if workload:
        data["calibration_workload_steps"] = {
            "count": len(workload),
            "median_abs_error_pct": workload[len(workload) // 2],
            "p90_abs_error_pct": workload[int(0.9 * (len(workload) - 1))],
            "total_measured_s": sum(m.seconds for m, _ in pairs if m.source == "workload"),
            "total_predicted_s": sum(p for m, p in pairs if m.source == "workload"),
        }
    return data
