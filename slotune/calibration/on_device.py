"""Calibrate the simulator's cost model on this machine by profiling the real executor.

The real executor runs two short real engine runs (a small and a large token budget) once
untimed to warm up, a grid of step shapes (prefill chunks × prior context, decode batch ×
context, and a few mixes), and then the same two engine runs timed step by step; the cost
model's constants are fitted to all those step times (``step_fit``), and the host overhead
of the engine around each step (scheduling, bookkeeping), measured on the same runs, is
added as the profile's per-step and per-request CPU cost. The result is a GPU-profile JSON
that ``--gpu`` accepts wherever a GPU name is accepted, describing this machine and its
datasheet-like peaks as measured here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotune._extras import require
from slotune.calibration.measure import (
    Measurement,
    StepShape,
    WorkloadSteps,
    blocks_needed,
    default_grid,
    measure_steps,
    record_workload,
)
from slotune.calibration.step_fit import build_profile, fit, line_fit, predict
from slotune.engine.config import EngineConfig
from slotune.engine.executor import KVCacheCapacity
from slotune.engine.sim.models import get_model
from slotune.engine.sim.profile import GpuProfile

if TYPE_CHECKING:
    from slotune.engine.model.executor import TorchExecutor


@dataclass(frozen=True)
class CalibrationResult:
    """The fitted profile, every measured step, and its predicted time without the host part."""

    profile: GpuProfile
    measurements: list[Measurement]
    predicted: list[float]
    host_step_s: float
    host_per_request_s: float

    def host_seconds(self, num_requests: int) -> float:
        """The engine's host work around the executor in a step of ``num_requests``: part of
        the profile's price, not of the executor's measured duration."""
        return self.host_step_s + self.host_per_request_s * num_requests


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
    require("torch", extra="engine")
    from slotune.calibration.machine import machine_spec

    say = progress or (lambda _msg: None)
    shapes = grid if grid is not None else default_grid()
    executor = calibration_executor(
        model_path, shapes, device, attention, block_size, threads=threads, timer=timer
    )
    say(f"measuring the peaks of {executor.device}")
    spec = machine_spec(executor.device)
    say("warming up: the recorded engine runs once, untimed")
    record_runs(executor, block_size)
    say(f"profiling {len(shapes)} step shapes")
    measurements = measure_steps(executor, shapes, block_size, repeats)
    say("recording the steps of a real engine run, small and large budget")
    runs = record_runs(executor, block_size)
    measurements += [m for run in runs for m in run.measurements]
    host_step, host_req = line_fit([row for run in runs for row in run.host_rows])
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
    prices = predict(profile, model, block_size, [m.shape for m in measurements])
    result = CalibrationResult(profile, measurements, [], host_step, host_req)
    # The host part was measured around the executor, so compare like with like:
    executor_part = [
        p - result.host_seconds(m.shape.num_requests)
        for p, m in zip(prices, measurements, strict=True)
    ]
    return replace(result, predicted=executor_part)


def calibration_executor(
    model_path: str | Path,
    shapes: list[StepShape],
    device: str = "auto",
    attention: str = "auto",
    block_size: int = 16,
    threads: int | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> TorchExecutor:
    """The real executor the calibration times, with a KV cache for ``shapes``."""
    from slotune.engine.model.executor import TorchExecutor

    executor = TorchExecutor(
        model_path, device=device, attention=attention, threads=threads, timer=timer
    )
    capacity = KVCacheCapacity(
        num_gpu_blocks=blocks_needed(shapes, block_size) + 64, num_cpu_blocks=0
    )
    executor.initialize_cache(EngineConfig(block_size=block_size), capacity)
    return executor


def record_runs(executor: TorchExecutor, block_size: int) -> list[WorkloadSteps]:
    """The recorded engine runs, small and large budget. Run once untimed before the
    measurements: a step's first run of its shapes costs more than its later ones (cuBLAS
    picks a kernel per matrix shape, Triton compiles per variant), and a real run's steps
    are mostly later ones."""
    return [
        record_workload(executor, block_size, budget, seed=i) for i, budget in enumerate((64, 512))
    ]


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
