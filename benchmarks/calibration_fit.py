"""Calibration fits: how well, and how fast, the fitters reach their optimum.

    .venv/bin/python benchmarks/calibration_fit.py                 # kernel fits only
    .venv/bin/python benchmarks/calibration_fit.py --model DIR     # + a CPU step fit

Kernel fits: the shipped profiles refitted to the reference kernel times (as ``slotune
calibrate --from-kernels`` does); prints the linear ops' mean squared log error and the
constants per GPU, and whether the error tables equal those of the shipped profiles.

Step fit (``--model``, needs ``slotune[engine]``): the real executor is timed on the
calibration grid and two recorded engine runs (process CPU time, one thread), once; the
fit of ``slotune calibrate --model`` is timed on those measurements, and its weighted loss
and median / p90 absolute error on the grid and on the recorded steps are printed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import numpy as np

from slotune.calibration.errors import profile_errors
from slotune.calibration.kernel_fit import fit_all
from slotune.calibration.readers import (
    DEFAULT_REFERENCE,
    FIT_SOURCES,
    LINEAR_OPS,
    gemm_dims,
    median_seconds,
    mlp_shapes,
    read_reference,
)
from slotune.engine.sim.cost_model import gemm_seconds
from slotune.engine.sim.profile import GpuProfile, load_profile


def linear_loss(profile: GpuProfile, reference: Path) -> float:
    """Mean squared log error of the four projections over the GPU's reference files."""
    bw, peak = profile.gpu.hbm_bytes_per_s, profile.gpu.flops_per_s
    errors = []
    for f in FIT_SOURCES[profile.gpu.name]["mlp"]:
        df = read_reference(reference / f)
        s = mlp_shapes(df)
        for column, op in LINEAR_OPS.items():
            k, n = gemm_dims(s, op)
            for m, kk, nn, t in zip(s["m"], k, n, median_seconds(df, column), strict=True):
                if t > 0:
                    pred = gemm_seconds(profile.linear, bw, peak, int(m), int(kk), int(nn))
                    errors.append(math.log(pred / t) ** 2)
    return statistics.fmean(errors)


def kernel_fits(reference: Path) -> None:
    t0 = time.process_time()
    profiles = fit_all(reference)
    print(f"kernel fits: {time.process_time() - t0:.2f} s CPU (scipy import included)\n")
    print("| GPU | linear loss | overhead µs | mem_eff | compute_eff | half_tokens | tables |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for gpu in FIT_SOURCES:
        p = profiles[gpu]
        same = profile_errors(p, reference) == profile_errors(load_profile(gpu), reference)
        lin = p.linear
        print(
            f"| {gpu} | {linear_loss(p, reference):.8f} | {lin.overhead_us} | {lin.mem_eff} | "
            f"{lin.compute_eff} | {lin.half_tokens} | {'= shipped' if same else 'differ'} |"
        )


def step_fit(model_dir: Path) -> None:
    from slotune.calibration.machine import machine_spec
    from slotune.calibration.measure import (
        blocks_needed,
        default_grid,
        measure_steps,
        record_workload,
    )
    from slotune.calibration.step_fit import build_profile, fit, predict
    from slotune.engine.config import EngineConfig
    from slotune.engine.executor import KVCacheCapacity
    from slotune.engine.model.executor import TorchExecutor
    from slotune.engine.sim.models import get_model

    ex = TorchExecutor(model_dir, device="cpu", threads=1, timer=time.process_time)
    shapes = default_grid()
    blocks = blocks_needed(shapes, 16) + 64
    ex.initialize_cache(EngineConfig(block_size=16), KVCacheCapacity(blocks, 0))
    ms = measure_steps(ex, shapes, 16, 5)
    ms += [
        m for i, b in enumerate((64, 512)) for m in record_workload(ex, 16, b, seed=i).measurements
    ]
    spec, model = machine_spec(ex.device), get_model(str(model_dir / "config.json"))
    t0 = time.process_time()
    values = fit(spec, model, 16, ms)
    took = time.process_time() - t0
    pred = predict(build_profile(spec, values, 16), model, 16, [m.shape for m in ms])
    counts = {src: sum(m.source == src for m in ms) for src in ("grid", "workload")}
    pairs = list(zip(ms, pred, strict=True))
    loss = sum(math.log(p / m.seconds) ** 2 / counts[m.source] for m, p in pairs)
    print(f"\nstep fit: {len(ms)} steps, {took:.2f} s CPU, weighted loss {loss:.6f}")
    for src in counts:
        e = [abs(p / m.seconds - 1) * 100 for m, p in pairs if m.source == src]
        print(f"  {src}: median {np.median(e):.1f} %, p90 {np.percentile(e, 90):.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--model", type=Path, help="checkpoint folder for the step fit")
    args = parser.parse_args()
    kernel_fits(args.reference)
    if args.model:
        step_fit(args.model)


if __name__ == "__main__":
    main()
