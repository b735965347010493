"""Time `build_report` on a tune output folder and report the file size.

    .venv/bin/python benchmarks/report_build.py [--trials 200] [--requests 1000] [--repeat 3]
    .venv/bin/python benchmarks/report_build.py --folder OUT --repeat 4 --base main

Without ``--folder`` it writes a synthetic tune output folder (the same one the report tests
use) into a temporary directory. Each build is a fresh process (imports not counted, as
`slotune tune` has them already), ``--repeat`` times; with ``--base REV`` the same builds
run on a checkout of another commit (``sim_speed.base_tree``), the two trees interleaved,
and the pages must be the same byte for byte.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim_speed import ROOT, base_tree, json_in_tree

from tests.reports.synthetic import write_out_dir

_BUILD = """
import json, sys, time
from slotune.reports import build_report
start = time.perf_counter()
path = build_report(sys.argv[1], sys.argv[2])
print(json.dumps({"s": time.perf_counter() - start, "size": path.stat().st_size}))
"""


def build(tree: Path, folder: Path, output: Path) -> dict[str, float]:
    """One build of ``folder``'s report by the code in ``tree``, in a process of its own."""
    return json_in_tree(tree, _BUILD, str(folder), str(output))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--requests", type=int, default=1000, help="requests per stored run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", type=Path, help="a tune output folder (default: synthetic)")
    parser.add_argument("--base", help="git revision to compare with, interleaved (e.g. main)")
    args = parser.parse_args()
    trees = {"this": ROOT}
    if args.base:
        trees["base"] = base_tree(args.base)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder
        if folder is None:
            folder = Path(tmp) / "out"
            write_out_dir(folder, n_trials=args.trials, n_requests=args.requests)
        steps = sum(1 for _ in (folder / "runs" / "best" / "steps.csv").open()) - 1
        times: dict[str, list[float]] = {name: [] for name in trees}
        pages: dict[str, bytes] = {}
        size = 0.0
        for _ in range(args.repeat):
            for name, tree in trees.items():
                page = Path(tmp) / f"{name}.html"
                run = build(tree, folder, page)
                times[name].append(run["s"])
                size = run["size"]
                pages[name] = page.read_bytes()
    print(f"{folder if args.folder else 'synthetic'}: steps/run={steps}")
    for name, values in times.items():
        print(
            f"{name}: build_report best {min(values):.2f} s, median "
            f"{statistics.median(values):.2f} s over {args.repeat} builds"
        )
    if args.base:
        same = pages["this"] == pages["base"]
        ratio = statistics.median(times["this"]) / statistics.median(times["base"])
        print(f"ratio this / base (medians): {ratio:.2f}; pages the same: {same}")
    print(f"report.html {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
