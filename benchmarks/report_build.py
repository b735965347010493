"""Time `build_report` on a 200-trial study and report the file size.

    .venv/bin/python benchmarks/report_build.py [--trials 200] [--requests 1000] [--repeat 3]

Writes a synthetic tune output folder (the same one the report tests use) into a temporary
directory, then builds the report ``--repeat`` times and prints the best and median time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slotune.reports import build_report
from tests.reports.synthetic import write_out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--requests", type=int, default=1000, help="requests per stored run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        write_out_dir(out, n_trials=args.trials, n_requests=args.requests)
        steps = sum(1 for _ in (out / "runs" / "best" / "steps.csv").open()) - 1
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            path = build_report(out)
            times.append(time.perf_counter() - start)
        size = path.stat().st_size
    print(f"trials={args.trials} requests/run={args.requests} steps/run={steps}")
    print(
        f"build_report: best {min(times):.2f} s, median {statistics.median(times):.2f} s "
        f"over {args.repeat} runs; report.html {size / 1e6:.2f} MB"
    )


if __name__ == "__main__":
    main()
