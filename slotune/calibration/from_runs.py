"""Fit a serving stack (and GPU-profile corrections) from measured serving runs.

Each evaluation replays every run through the simulator with candidate constants and
compares the mean TTFT, ITL and E2E per load stage with the measured ones; scipy's bounded
least squares (soft-L1 loss on log ratios) moves the constants. The runs are cut to the
first ``window_s`` seconds of each stage (the first ``warmup_s`` of each not scored), so a
fit over ten runs takes minutes, not hours.

The fitted parameters (``PARAMS``): the host's work per step on the GPU's critical path
(what async scheduling cannot hide), the per-request latency outside the engine, the
all-reduce latency per hop (only TP runs move it), the time of the engine's kernels
against the profile's isolated kernel measurements (``gpu_time_scale``) and the engine's
work per decoding request and layer live in the stack, so that a stack fitted on one card
carries to others; decode attention's bandwidth efficiency is a correction of the GPU
profile (whose attention was carried over from another card). Every stack constant is
bounded by its plausible range (``stack.PARAMETER_RANGES``); ``FitResult.at_bounds`` names
those a fit left on a bound. Other constants (``ATTENTION_PARAMS``, the stack's CUDA-graph
overhead) can be named for fits that want them; ``ONE_WORKLOAD_PARAMS`` are those that
runs of one workload can pin.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from slotune.calibration.transforms import Param, from_unit, to_unit
from slotune.engine.sim.profile import GpuProfile, load_profile
from slotune.engine.sim.stack import PARAMETER_RANGES, StackProfile, load_stack
from slotune.validate.replay import Replay, replay
from slotune.validate.runs import MeasuredRun
from slotune.workloads.trace import Trace


def stack_param(field: str) -> Param:
    """The fitted constant ``stack.<field>`` within its plausible range."""
    low, high, _ = PARAMETER_RANGES[field]
    return Param(f"stack.{field}", low, high)


PARAMS = (
    stack_param("host_exposed_us"),
    stack_param("request_in_us"),
    stack_param("allreduce_latency_us"),
    stack_param("gpu_time_scale"),
    Param("gpu.attention.decode_eff", 0.5, 1.0),
    stack_param("decode_seq_layer_us"),
)
# What runs of one workload on one server pin (``tune --verify``'s few configurations,
# ``calibrate --server``'s probe at three concurrencies): the host, the server, the
# all-reduce and the kernels' speed. With the decode constants free as well, the search
# trades them against the host and stalls (BENCHMARKS, issue 29); they need runs across
# models and workloads, as the training runs are.
ONE_WORKLOAD_PARAMS = tuple(
    p for p in PARAMS if p.name not in ("gpu.attention.decode_eff", "stack.decode_seq_layer_us")
)
ATTENTION_PARAMS = (
    Param("gpu.attention.decode_eff", 0.3, 1.0),
    Param("gpu.attention.block_indirection_tokens", 0.0, 4.0),
    Param("gpu.attention.prefill_prefix_eff", 0.1, 1.0),
)
SCORED = ("ttft", "itl", "e2e")


@dataclass(frozen=True)
class FitResult:
    stack: StackProfile
    profile: GpuProfile
    values: dict[str, float]
    cost: float
    evaluations: int
    runs: tuple[str, ...]
    params: tuple[Param, ...] = ()

    @property
    def at_bounds(self) -> list[str]:
        """The fitted constants that ended within 1 % of a bound (a finding: the model
        wants a value outside the plausible range, or the runs do not pin it)."""
        out = []
        for p in self.params:
            v, span = self.values[p.name], p.high - p.low
            if v <= p.low + 0.01 * span or v >= p.high - 0.01 * span:
                out.append(f"{p.name}={v:g} (bounds {p.low:g}-{p.high:g})")
        return out


def apply(
    values: dict[str, float], stack: StackProfile, profile: GpuProfile
) -> tuple[StackProfile, GpuProfile]:
    """``stack`` and ``profile`` with the named constants set."""
    stack_values: dict[str, float] = {}
    for name, v in values.items():
        part, _, field = name.partition(".")
        if part == "stack":
            stack_values[field] = v
        elif part == "gpu":
            section, _, attr = field.partition(".")
            profile = replace(profile, **{section: replace(getattr(profile, section), **{attr: v})})
        else:
            raise ValueError(f"unknown parameter {name!r}")
    return stack.with_values(**stack_values), profile


def current_value(name: str, stack: StackProfile, profile: GpuProfile) -> float:
    """The value a fit starts from: the stack's (or, where it leaves one unset, the GPU
    profile's) or the profile's."""
    part, _, field = name.partition(".")
    if part == "stack":
        return float(getattr(stack.on(profile.system), field))
    section, _, attr = field.partition(".")
    return float(getattr(getattr(profile, section), attr))


def cut_to_windows(run: MeasuredRun, window_s: float) -> MeasuredRun:
    """The run's first ``window_s`` seconds of each stage, stages placed back to back."""
    stages = run.stages or ((0.0, float(run.arrivals.max()) + 1e-9),)
    keep: list[int] = []
    shifted: list[float] = []
    new_stages = []
    offset = 0.0
    arrivals = run.arrivals
    for lo, hi in stages:
        end = min(hi, lo + window_s)
        idx = np.flatnonzero((arrivals >= lo) & (arrivals < end))
        keep.extend(idx.tolist())
        shifted.extend((arrivals[idx] - lo + offset).tolist())
        new_stages.append((offset, offset + (end - lo)))
        offset += end - lo
    reqs = tuple(
        replace(run.trace.requests[i], arrival_time=t) for i, t in zip(keep, shifted, strict=True)
    )
    trace = Trace(name=run.trace.name, requests=reqs, seed=run.trace.seed, source=run.source)
    sel = np.array(keep, dtype=int)
    return replace(
        run,
        trace=trace,
        ttft_s=run.ttft_s[sel],
        e2e_s=run.e2e_s[sel],
        ok=run.ok[sel],
        stages=tuple(new_stages),
    )


def residuals(rp: Replay, warmup_s: float) -> list[float]:
    """Log ratios of predicted to measured mean TTFT, ITL and E2E per stage."""
    out = []
    for lo, hi in rp.run.stages or ((0.0, math.inf),):
        st = rp.stats((lo + warmup_s, hi))
        for m in SCORED:
            p, q = st[m]["pred_mean"], st[m]["meas_mean"]
            out.append(math.log(p / q) if p > 0 and q > 0 else 5.0)
    return out


def fit_from_runs(
    runs: Sequence[MeasuredRun],
    *,
    stack: StackProfile | None = None,
    profile: GpuProfile | None = None,
    params: Sequence[Param] = PARAMS,
    start: dict[str, float] | None = None,
    window_s: float = 150.0,
    warmup_s: float = 20.0,
    max_evaluations: int = 60,
    progress: Callable[[int, float, dict[str, float]], None] | None = None,
) -> FitResult:
    """Fit ``params`` so that the replayed runs match the measured ones (see the module
    docstring). All runs must share one GPU (the profile corrections are that GPU's).
    ``max_evaluations`` bounds the replays of every run, the finite-difference ones
    included."""
    from scipy.optimize import least_squares

    if not runs:
        raise ValueError("fit_from_runs: no runs given")
    gpus = {r.settings.gpu for r in runs}
    if len(gpus) > 1 and profile is None:
        raise ValueError(f"fit_from_runs: the runs are on several GPUs {sorted(gpus)}; fit each")
    base_stack = stack or load_stack(None)
    base_profile = profile or load_profile(runs[0].settings.gpu)
    if not any(r.settings.tp > 1 for r in runs):
        params = [p for p in params if "allreduce" not in p.name]
    cut = [cut_to_windows(r, window_s) for r in runs]
    if start:
        base_stack, base_profile = apply(start, base_stack, base_profile)
    start_values = {p.name: current_value(p.name, base_stack, base_profile) for p in params}
    count = 0

    def evaluate(z: np.ndarray) -> np.ndarray:
        nonlocal count
        values = from_unit(params, z)
        s, prof = apply(values, base_stack, base_profile)
        res: list[float] = []
        for run in cut:
            res.extend(residuals(replay(run, stack=s, profile=prof), warmup_s))
        count += 1
        r = np.array(res)
        if progress is not None:
            progress(count, float(np.sqrt(np.mean(r**2))), values)
        return r

    sol = least_squares(
        evaluate,
        to_unit(params, start_values),
        bounds=(0.0, 1.0),
        loss="soft_l1",
        f_scale=0.1,
        diff_step=0.05,
        max_nfev=max(1, max_evaluations // (len(params) + 1)),
    )
    values = from_unit(params, sol.x)
    s, prof = apply(values, base_stack, base_profile)
    return FitResult(
        stack=s,
        profile=prof,
        values=values,
        cost=float(sol.cost),
        evaluations=count,
        runs=tuple(r.name for r in runs),
        params=tuple(params),
    )


def write_fit(result: FitResult, stack_path: Path, name: str, note: str = "") -> dict[str, Any]:
    """Write the fitted stack JSON (with the GPU-profile corrections and the runs it saw
    recorded under ``fit``)."""
    data = result.stack.with_values(name=name, note=note or result.stack.note).to_dict()
    data["fit"] = {
        "runs": list(result.runs),
        "values": {k: round(v, 4) for k, v in result.values.items()},
        "cost": round(result.cost, 6),
        "bounds": {p.name: [p.low, p.high] for p in result.params},
        "at_bounds": result.at_bounds,
    }
    for key in (
        "host_step_us",
        "host_exposed_us",
        "graph_overhead_scale",
        "request_in_us",
        "allreduce_latency_us",
    ):
        if isinstance(data.get(key), float):
            data[key] = round(data[key], 4)
    stack_path.write_text(json.dumps(data, indent=2) + "\n")
    return data
