"""``tune --verify`` against ``slotune serve``: what a verified configuration costs, and
whether measuring on the server repairs a simulator that is wrong.

The server is the simulated engine behind the real HTTP server, paced in wall-clock time,
on the TRUE stack. The study simulates a WRONG stack: the true one with one constant
multiplied by ``--factor``. Round 1 tunes and verifies on the wrong stack and fits a stack
to the measured runs; round 2 tunes and verifies again from that fitted stack. The table
gives, per round, the Spearman rank correlation between the simulated and the measured
order of the same candidates, the simulated and the measured winner, the constant's
value, and the wall time per verified configuration.

    PYTHONPATH=. .venv/bin/python benchmarks/verify_loop.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

from slotune.api import tune
from slotune.engine.sim.stack import load_stack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--true-stack", default="vllm-0.34")
    ap.add_argument("--field", default="decode_seq_layer_us")
    ap.add_argument("--factor", type=float, default=30.0)
    ap.add_argument("--trace", default="sharegpt-like")
    ap.add_argument("--num-requests", type=int, default=60)
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--slo", default="ttft=2s,tpot=30ms")
    ap.add_argument("--seqs", default="8,16,32,64,128,256")
    ap.add_argument("--top", type=int, default=4)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="slotune-verify-"))
    true = load_stack(args.true_stack)
    wrong = dataclasses.replace(
        true, name="wrong", **{args.field: getattr(true, args.field) * args.factor}
    )
    wrong_path = work / "wrong.json"
    wrong_path.write_text(json.dumps(wrong.to_dict()))
    search = work / "search.yaml"
    search.write_text(
        yaml.safe_dump(
            {
                "max_num_seqs": [int(s) for s in args.seqs.split(",")],
                "max_num_batched_tokens": 2048,
                "long_prefill_token_threshold": 0,
                "block_size": 16,
                "preemption_mode": "recompute",
                "prefix_caching": "none",
                "policy": "chunked",
                "kv_cache_dtype": "auto",
            }
        )
    )
    server = (
        f"{sys.executable} -m slotune serve --gpu h100 --sim-model llama-3-8b "
        f"--stack {args.true_stack} {{flags}} --port {{port}}"
    )
    print(
        f"true stack {args.true_stack}: {args.field} = {getattr(true, args.field):.4g}; "
        f"wrong: x{args.factor:g} = {getattr(wrong, args.field):.4g}"
    )
    print("| round | simulated stack | rank correlation | simulated winner | measured winner "
          f"| {args.field} | s per verified config |")  # fmt: skip
    print("|---|---|---:|---|---|---:|---:|")
    stack = str(wrong_path)
    for round_ in (1, 2):
        start = time.perf_counter()
        result = tune(
            gpu="h100",
            model="llama-3-8b",
            target="slotune",
            stack=stack,
            slo=args.slo,
            objective="weighted",
            sampler="grid",
            search=str(search),
            trace=args.trace,
            num_requests=args.num_requests,
            rate=args.rate,
            out=str(work / f"round{round_}"),
            verify=server,
            verify_top=args.top,
            report=False,
        )
        seconds = time.perf_counter() - start
        outcome = result.verified
        verified = [c for c in outcome.candidates if c.ok]
        value = getattr(load_stack(stack), args.field)
        rho = outcome.rank_correlation
        print(
            f"| {round_} | {Path(stack).stem} | {'-' if rho is None else f'{rho:.2f}'} "
            f"| {outcome.simulated_order[0]} | {outcome.winner} | {value:.4g} "
            f"| {seconds / max(len(verified), 1):.1f} (whole round {seconds:.0f} s) |"
        )
        if result.verified_stack is None:
            break
        stack = str(result.verified_stack)
    fitted = getattr(load_stack(stack), args.field)
    print(f"fitted {args.field} after round 1: {fitted:.4g} (true {getattr(true, args.field):.4g})")


if __name__ == "__main__":
    main()
