"""The recommendation in hardware terms on every bundled trace: MBU, MFU and bound op of the
recommended and the default configuration, next to their simulated latency difference.

    PYTHONPATH=. .venv/bin/python benchmarks/hardware_explain.py            # all bundled traces
    PYTHONPATH=. .venv/bin/python benchmarks/hardware_explain.py --traces agent --trials 8

For each trace: ``slotune tune`` (h100, llama-3-8b, SLO ttft=300ms,tpot=50ms, the weighted
objective at the rate vLLM's defaults sustain, ``--num-requests`` requests as a burst,
``--trials`` TPE trials, seed 0) into a temporary folder, then ``slotune explain --json``
on it; prints a Markdown table (p99 TTFT and TPOT of the two reruns the report stores, and
each run's MBU, MFU and bound op).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TRACES = (
    "sharegpt-like",
    "agent",
    "shared-prefix",
    "long-context",
    "reasoning",
    "shared-prefix-chat",
)


def _slotune(*args: str) -> str:
    cmd = [sys.executable, "-m", "slotune", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _p99(metrics: dict, name: str) -> float:  # type: ignore[type-arg]
    return float(metrics[name]["p99"])


def row(trace: str, out: Path, trials: int, requests: int) -> str:
    _slotune(
        "tune",
        "--gpu",
        "h100",
        "--model",
        "llama-3-8b",
        "--trace",
        trace,
        "--num-requests",
        str(requests),
        "--objective",
        "weighted",
        "--trials",
        str(trials),
        "--seed",
        "0",
        "--slo",
        "ttft=300ms,tpot=50ms",
        "--out",
        str(out),
    )
    best = json.loads((out / "best.json").read_text())
    hw = json.loads(_slotune("explain", str(out / "best.json"), "--json"))
    rec, base = hw["recommended"], hw["vLLM defaults"]
    changed = ", ".join(
        f"{k}={v}" for k, v in best["config"].items() if v != best["baseline"]["config"][k]
    )
    m, b = best["metrics"], best["baseline"]["metrics"]
    ttft = (_p99(m, "ttft_ms"), _p99(b, "ttft_ms"))
    tpot = (_p99(m, "tpot_ms"), _p99(b, "tpot_ms"))

    def hw_cell(h: dict) -> str:  # type: ignore[type-arg]
        share = h["op_seconds"][h["bound_op"]] / sum(h["op_seconds"].values())
        return f"{h['mbu']:.0%} / {h['mfu']:.0%}, {h['bound_op']} ({share:.0%})"

    return (
        f"| {trace} | {changed or '(the defaults)'} | {ttft[0]:.0f} vs {ttft[1]:.0f} | "
        f"{tpot[0]:.1f} vs {tpot[1]:.1f} | {hw_cell(rec)} | {hw_cell(base)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="*", default=list(TRACES))
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--out", type=Path, help="keep the tune folders here (default: a temp)")
    args = parser.parse_args()
    print(
        "| trace | recommended (changed from the defaults) | TTFT p99 ms, rec. vs defaults "
        "| TPOT p99 ms | recommended: MBU / MFU, bound op (share) | defaults: MBU / MFU, "
        "bound op |"
    )
    print("|---|---|---:|---:|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        for trace in args.traces:
            print(row(trace, root / trace, args.trials, args.num_requests), flush=True)


if __name__ == "__main__":
    main()
