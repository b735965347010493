"""The simulator against real vLLM serving runs, run by run.

    .venv/bin/python benchmarks/sim_vs_vllm.py                       # every run, default stack
    .venv/bin/python benchmarks/sim_vs_vllm.py --stack eager         # kernels + slotune's host
    .venv/bin/python benchmarks/sim_vs_vllm.py --runs DIR --json out.json

Replays every run under ``--runs`` (default: ``../shared/reference/vllm-runs`` beside the
checkout, the training split of the BLIS sim-to-real study) with its own arrivals, prompt
lengths, shared prefixes, output length, TP, token budget, ``max_num_seqs`` and KV-block
count, and prints a Markdown table of the mean TTFT, ITL and E2E errors per run next to
BLIS's published error on the same run, then the mean absolute error over the runs (of
the mean, p50, p90 and p99) and which runs saturate in the simulator. A run the simulator
cannot express (for example a model family it cannot read) is listed with the reason.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from slotune.validate import load_run, markdown_table, overall, replay, run_row

DEFAULT_RUNS = Path(__file__).resolve().parents[1].parent / "shared/reference/vllm-runs"


def _blis(runs_dir: Path) -> dict[str, dict[str, float]]:
    path = runs_dir / "blis_published_errors.csv"
    if not path.is_file():
        return {}
    with path.open() as f:
        return {
            row["run"]: {k: float(v) for k, v in row.items() if k.endswith("_pct")}
            for row in csv.DictReader(f)
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--stack", default=None, help="stack name or JSON (default vllm-v1)")
    ap.add_argument("--gpu", default=None, help="GPU profile name or JSON (default: the run's)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args()
    folders = sorted(p for p in args.runs.iterdir() if (p / "requests.json").is_file())
    if not folders:
        print(f"no runs under {args.runs}", file=sys.stderr)
        return 2
    rows, skipped = [], []
    for folder in folders:
        t0 = time.perf_counter()
        try:
            run = load_run(folder, gpu=args.gpu)
            row = run_row(replay(run, gpu=args.gpu, stack=args.stack))
        except ValueError as e:
            skipped.append((folder.name, str(e)))
            continue
        row["replay_s"] = time.perf_counter() - t0
        rows.append(row)
        print(f"{folder.name}: {row['replay_s']:.1f} s", file=sys.stderr)
    print(markdown_table(rows, _blis(args.runs)))
    total = overall(rows)
    print("| metric | MAE of the mean | median | MAE p50 | MAE p90 | MAE p99 |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in ("ttft", "itl", "e2e"):
        print(
            f"| {m.upper()} | {total[f'{m}_mean_mae_pct']:.1f} % | "
            f"{total[f'{m}_mean_median_ae_pct']:.1f} % | {total[f'{m}_p50_mae_pct']:.1f} % | "
            f"{total[f'{m}_p90_mae_pct']:.1f} % | {total[f'{m}_p99_mae_pct']:.1f} % |"
        )
    print(
        f"| throughput | {total['throughput_mae_pct']:.1f} % | "
        f"{total['throughput_median_ae_pct']:.1f} % | | | |"
    )
    sat = [r["run"] for r in rows if r["saturated"]]
    print(f"\n{len(rows)} runs replayed; saturating in the simulator: {sat or 'none'}")
    for name, why in skipped:
        print(f"- not replayed: {name}: {why}")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "overall": total}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
