"""Single-knob sensitivity: how a change of one engine setting moves latency, measured
against simulated.

A tuner ranks configurations by their differences, so the simulator must move the right
way when one knob moves. ``MEASURED_PAIRS`` are changes measured on real vLLM 0.15.1 on
H100 in the BLIS sim-to-real study's held-out runs, as quoted in slotune issue 25: they are
for checking only (no fit here ever sees them). ``simulate_pair`` replays the study's
"general" load (``study_workload``: inference-perf's shared-prefix prompts with its prompt
pool, 8 then 20 req/s, as the pairs' runs) under both settings of a pair and returns the
simulated change and each side's step composition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slotune.engine.sim.profile import GpuProfile
from slotune.engine.sim.stack import StackProfile, load_stack
from slotune.workloads.trace import Trace, TraceRequest

SOURCE = "BLIS sim-to-real study (vLLM 0.15.1, H100), held-out runs, as quoted in issue 25"


@dataclass(frozen=True)
class Setting:
    """The engine settings one side of a pair changes."""

    model: str
    tp: int = 1
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    gpu_memory_utilization: float = 0.9


@dataclass(frozen=True)
class MeasuredPair:
    """One knob changed from ``before`` to ``after``; the measured relative change of the
    mean E2E and TTFT (``None`` where the source gives none; a tie is ``0`` with
    ``tie=True``: the source says within ±2 %)."""

    name: str
    before: Setting
    after: Setting
    e2e: float | None
    ttft: float | None = None
    tie: bool = False
    source: str = SOURCE


# Llama-3.1-8B has Llama-3-8B's shapes (only its RoPE scaling and context differ).
_L8 = "llama-3-8b"
_MIX = "mixtral-8x7b"
MEASURED_PAIRS = (
    MeasuredPair(
        "Llama-3.1-8B budget 2048 -> 1024",
        Setting(_L8),
        Setting(_L8, max_num_batched_tokens=1024),
        0.11,
        0.09,
    ),
    MeasuredPair("Llama-3.1-8B TP1 -> TP2", Setting(_L8), Setting(_L8, tp=2), -0.37, -0.27),
    MeasuredPair("Mixtral-8x7B TP2 -> TP4", Setting(_MIX, tp=2), Setting(_MIX, tp=4), -0.44),
    MeasuredPair(
        "Llama-3.1-8B budget 2048 -> 8192",
        Setting(_L8),
        Setting(_L8, max_num_batched_tokens=8192),
        0.0,
        0.0,
        tie=True,
    ),
    MeasuredPair(
        "Mixtral-8x7B budget 2048 -> 8192",
        Setting(_MIX, tp=2),
        Setting(_MIX, tp=2, max_num_batched_tokens=8192),
        0.0,
        0.0,
        tie=True,
    ),
    MeasuredPair(
        "Llama-3.1-8B memory 0.90 -> 0.95",
        Setting(_L8),
        Setting(_L8, gpu_memory_utilization=0.95),
        0.0,
        0.0,
        tie=True,
    ),
    MeasuredPair(
        "Mixtral-8x7B memory 0.90 -> 0.95",
        Setting(_MIX, tp=2),
        Setting(_MIX, tp=2, gpu_memory_utilization=0.95),
        0.0,
        0.0,
        tie=True,
    ),
)


GENERAL_STAGES: tuple[tuple[float, float], ...] = ((8.0, 90.0), (20.0, 90.0))
"""The study's "general" load as ``(rate req/s, seconds)`` stages: 8 then 20 req/s (600 s
each in the study, whose pair figures are whole-run means; shortened here)."""


def study_workload(
    stages: Sequence[tuple[float, float]] = GENERAL_STAGES, seed: int = 0, output_len: int = 248
) -> Trace:
    """The study's "general" load: Poisson arrivals at each stage's rate for its seconds, one
    stage after the other; 9 system prompts of 100 tokens shared round robin, a 447-token
    question; inference-perf's pool of 100 prompts sent in turn (prompt ``k mod 100`` as
    request ``k``), ``output_len`` tokens decoded."""
    if not stages or any(not (rate > 0 and seconds > 0) for rate, seconds in stages):
        raise ValueError(f"study_workload: stages must be (rate > 0, seconds > 0) pairs: {stages}")
    rng = np.random.default_rng(seed)
    arrivals: list[float] = []
    start = 0.0
    for rate, seconds in stages:
        gaps = rng.exponential(1.0 / rate, max(1, int(rate * seconds)))
        arrivals += [start + t for t in np.cumsum(gaps) if t < seconds]
        start += seconds
    groups, pool, system, question = 9, 100, 100, 447
    reqs = tuple(
        TraceRequest(
            request_id=f"r{k}",
            prompt_len=system + question,
            output_len=output_len,
            arrival_time=float(t),
            prompt_segments=((k % pool % groups, system), (groups + k % pool, question)),
        )
        for k, t in enumerate(arrivals)
    )
    load = "+".join(f"{rate:g}rps" for rate, _ in stages)
    return Trace(name=f"study-general-{load}", requests=reqs, seed=seed)


def simulate(
    setting: Setting,
    trace: Trace,
    stack: StackProfile | str | None = None,
    gpu: str | GpuProfile = "h100",
) -> dict[str, float]:
    """Mean TTFT, ITL and E2E (seconds) of ``trace`` under ``setting``, and the steps'
    composition: how many (``steps``), the share that carry prefill tokens (``mixed``: the
    steps vLLM runs as piecewise graphs with eager attention) and the largest in tokens."""
    from slotune.engine.config import EngineConfig
    from slotune.workloads.arrivals import ArrivalSpec
    from slotune.workloads.metrics import request_metrics
    from slotune.workloads.runner.engine_loop import run_simulated

    stack = stack if isinstance(stack, StackProfile) else load_stack(stack)
    config = EngineConfig(
        max_num_batched_tokens=setting.max_num_batched_tokens,
        max_num_seqs=setting.max_num_seqs,
        max_model_len=4096,
        gpu_memory_utilization=setting.gpu_memory_utilization,
    )
    result = run_simulated(
        config,
        trace,
        gpu=gpu,
        model=setting.model,
        tp=setting.tp,
        stack=stack,
        arrivals=ArrivalSpec(timestamps=True),
    )
    m = request_metrics(result)
    outs = np.array([r.output_len for r in trace.requests], dtype=float)
    ok = np.isfinite(m["e2e"])
    itl = (m["e2e"][ok] - m["ttft"][ok]) / np.maximum(outs[ok] - 1, 1)
    steps = result.steps
    return {
        "ttft": float(np.mean(m["ttft"][ok])),
        "itl": float(np.mean(itl)),
        "e2e": float(np.mean(m["e2e"][ok])),
        "steps": float(len(steps)),
        "mixed": float((steps["num_prefill_tokens"] > 0).mean()) if len(steps) else 0.0,
        "largest_step": float(steps["num_scheduled_tokens"].max()) if len(steps) else 0.0,
    }


def simulate_pair(
    pair: MeasuredPair, trace: Trace | None = None, stack: StackProfile | str | None = None
) -> dict[str, Any]:
    """The simulated relative change of mean TTFT, ITL and E2E from ``pair.before`` to
    ``pair.after`` on ``trace`` (default ``study_workload()``), beside the measured one,
    and each side's step composition (``steps``, ``mixed``, ``largest_step`` as ``simulate``
    gives them, suffixed ``_before`` and ``_after``)."""
    trace = trace or study_workload()
    a, b = simulate(pair.before, trace, stack), simulate(pair.after, trace, stack)
    out: dict[str, Any] = {"pair": pair.name, "tie": pair.tie}
    for m in ("ttft", "itl", "e2e"):
        out[f"{m}_sim"] = b[m] / a[m] - 1
    out["e2e_meas"], out["ttft_meas"] = pair.e2e, pair.ttft
    for key in ("steps", "mixed", "largest_step"):
        out[f"{key}_before"], out[f"{key}_after"] = a[key], b[key]
    return out


def direction_ok(measured: float, simulated: float, tie_band: float = 0.05) -> bool:
    """Whether ``simulated`` moves as ``measured`` did: the same sign where the measured
    change is beyond ±``tie_band``, within ±``tie_band`` where it is a tie."""
    if abs(measured) <= 0.02:
        return abs(simulated) <= tie_band
    if abs(measured) <= tie_band:
        return True  # too small to call a direction
    return (simulated > 0) == (measured > 0) and abs(simulated) > 0.01
