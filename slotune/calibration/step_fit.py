"""Fit a whole GPU profile to measured step times (see ``on_device``).

The cost model's constants are moved by scipy's bounded least squares on the log ratio
of predicted to measured step time, the grid's shapes and the recorded workload steps
weighing the same in total, so that neither the many small steps of a real run nor the
grid's extremes dominate. Every constant is positive and spans decades, so each moves on
a log scale between its bounds (see ``transforms``). The loss stays squared: the errors
left are the cost model's own, not outliers, and a soft-L1 loss traded a lower median
for a higher p90 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import statistics

from slotune.calibration.measure import Measurement, StepShape
from slotune.calibration.transforms import Param, from_unit, to_unit
from slotune.engine.sim.batch import batch_totals
from slotune.engine.sim.cost_model import CostModel
from slotune.engine.sim.hardware import GpuSpec
from slotune.engine.sim.models import ModelSpec
from slotune.engine.sim.profile import (
    ELEMENTWISE_OPS,
    AttentionProfile,
    ElementwiseProfile,
    GpuProfile,
    LinearProfile,
    SystemProfile,
)

_US = (1e-3, 1e6)  # bounds of a time constant, µs
_EFF = (1e-4, 1.0)  # bounds of an efficiency
STEP_PARAMS = (
    *(
        Param(name, *(_EFF if name.endswith("_eff") else _US), log=True)
        for name in (
            "linear_overhead_us",
            "linear_mem_eff",
            "linear_compute_eff",
            "linear_half_tokens",
            "elementwise_overhead_us",
            "elementwise_eff",
            "prefill_overhead_us",
            "prefill_prefix_eff",
            "prefill_causal_eff",
            "decode_overhead_us",
            "decode_per_seq_us",
            "decode_eff",
            "cpu_step_us",
            "cpu_per_request_us",
            "decode_per_call_us",
            "prefill_per_chunk_us",
        )
    ),
    # context ranges a batch's decodes spread over, one attention call each
    Param("decode_call_ranges", 1.0, 256.0, log=True),
)
STEP_START = {
    "linear_overhead_us": 10.0,
    "linear_mem_eff": 0.5,
    "linear_compute_eff": 0.5,
    "linear_half_tokens": 8.0,
    "elementwise_overhead_us": 5.0,
    "elementwise_eff": 0.3,
    "prefill_overhead_us": 20.0,
    "prefill_prefix_eff": 0.2,
    "prefill_causal_eff": 0.2,
    "decode_overhead_us": 20.0,
    "decode_per_seq_us": 5.0,
    "decode_eff": 0.2,
    "cpu_step_us": 200.0,
    "cpu_per_request_us": 20.0,
    "decode_per_call_us": 5.0,
    "prefill_per_chunk_us": 5.0,
    "decode_call_ranges": 4.0,
}


def build_profile(
    spec: GpuSpec, values: dict[str, float], block_size: int, note: str = "", exact: bool = False
) -> GpuProfile:
    """The profile of ``spec`` with the named constants of ``STEP_PARAMS``, rounded to
    the digits a profile file keeps (``exact``: unrounded, as the fit moves them)."""

    def r(x: float, digits: int) -> float:
        return x if exact else round(x, digits)

    elementwise = ElementwiseProfile(
        overhead_us=r(values["elementwise_overhead_us"], 4),
        eff=r(values["elementwise_eff"], 6),
    )
    return GpuProfile(
        gpu=spec,
        linear=LinearProfile(
            overhead_us=r(values["linear_overhead_us"], 4),
            mem_eff=r(values["linear_mem_eff"], 6),
            compute_eff=r(values["linear_compute_eff"], 6),
            half_tokens=r(values["linear_half_tokens"], 4),
            tile_tokens=1,
        ),
        elementwise=dict.fromkeys(ELEMENTWISE_OPS, elementwise),
        attention=AttentionProfile(
            prefill_overhead_us=r(values["prefill_overhead_us"], 4),
            prefill_prefix_eff=r(values["prefill_prefix_eff"], 6),
            prefill_causal_eff=r(values["prefill_causal_eff"], 6),
            q_tile=1,
            decode_overhead_us=r(values["decode_overhead_us"], 4),
            decode_per_seq_us=r(values["decode_per_seq_us"], 4),
            decode_eff=r(values["decode_eff"], 6),
            block_indirection_tokens=0.0,
            reference_block_size=block_size,
            decode_per_call_us=r(values["decode_per_call_us"], 4),
            decode_call_ranges=r(values["decode_call_ranges"], 4),
            prefill_per_chunk_us=r(values["prefill_per_chunk_us"], 4),
        ),
        system=SystemProfile(
            cpu_step_us=r(values["cpu_step_us"], 4),
            cpu_per_request_us=r(values["cpu_per_request_us"], 4),
            reserved_gib=0.0,
        ),
        note=note,
    )


def predict(
    profile: GpuProfile, model: ModelSpec, block_size: int, shapes: list[StepShape]
) -> list[float]:
    """The cost model's durations of ``shapes``, costed as the simulated executor costs them."""
    cost = CostModel(profile, model, 1, block_size)
    return [
        cost.step_seconds(s.num_tokens, s.num_requests, s.num_requests, *_totals(s)) for s in shapes
    ]


def _totals(shape: StepShape) -> tuple[int, int, list[tuple[int, int]]]:
    """The shape's decodes and chunks in the executor's terms (``batch_totals``)."""
    return batch_totals([*shape.prefills, *((1, d) for d in shape.decodes)])


def fit(
    spec: GpuSpec, model: ModelSpec, block_size: int, measurements: list[Measurement]
) -> dict[str, float]:
    """Constants minimising the weighted squared log error of the predicted step times;
    the grid and the recorded workload steps weigh the same in total."""
    import numpy as np
    from scipy.optimize import least_squares

    targets = np.log([m.seconds for m in measurements])
    shapes = [m.shape for m in measurements]
    counts = {src: sum(m.source == src for m in measurements) for src in ("grid", "workload")}
    root_weights = np.sqrt([1.0 / counts[m.source] for m in measurements])

    def residuals(z: np.ndarray) -> np.ndarray:
        profile = build_profile(spec, from_unit(STEP_PARAMS, z), block_size, exact=True)
        return root_weights * (np.log(predict(profile, model, block_size, shapes)) - targets)

    sol = least_squares(residuals, to_unit(STEP_PARAMS, STEP_START), bounds=(0.0, 1.0))
    return from_unit(STEP_PARAMS, sol.x)


def line_fit(rows: list[tuple[int, float]]) -> tuple[float, float]:
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
