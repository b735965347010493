"""Does a step cost more the first time its shapes run? The calibration's warm-up question.

    .venv/bin/python benchmarks/calibration_warmup.py --device cuda --preset tiny small

For each preset, one fresh executor runs the same recorded workload (``record_workload``,
budget 512) and the calibration grid several times in one process and prints each pass's
total executor time, its host time around the executor, and the ratio to the last pass. A
first pass dearer than the rest means that a calibration timed on first use prices the
later, warm steps of a real run too dear.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--preset", nargs="+", default=["tiny"], choices=("tiny", "small"))
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()

    from slotune.calibration.measure import default_grid, measure_steps, record_workload
    from slotune.calibration.on_device import calibration_executor
    from slotune.engine.model.init_model import init_model

    work = Path(tempfile.mkdtemp(prefix="calibration_warmup_"))
    block_size = 16
    shapes = default_grid()
    for preset in args.preset:
        model = init_model(work / preset, preset)
        executor = calibration_executor(model, shapes, args.device, block_size=block_size)
        rows = []
        for _ in range(args.passes):
            run = record_workload(executor, block_size, 512, seed=1)
            grid = measure_steps(executor, shapes, block_size, repeats=3)
            rows.append(
                (
                    sum(m.seconds for m in run.measurements),
                    sum(s for _, s in run.host_rows),
                    len(run.measurements),
                    sum(m.seconds for m in grid),
                )
            )
        last = rows[-1]
        print(f"\n{preset} on {args.device}\n")
        print(
            "| pass | workload steps | executor (ms) | vs last | host (ms) | grid (ms) | vs last |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for i, (ex, host, n, grid_s) in enumerate(rows):
            print(
                f"| {i + 1} | {n} | {ex * 1e3:.1f} | {ex / last[0]:.3f} | {host * 1e3:.1f} "
                f"| {grid_s * 1e3:.2f} | {grid_s / last[3]:.3f} |"
            )


if __name__ == "__main__":
    main()
