"""Pipeline against tensor parallelism for one instance on the same GPUs.

    .venv/bin/python benchmarks/cluster_pp.py                  # llama-3-70b on 4 × H100

Replays a bundled trace through one instance of ``--gpus`` GPUs split as TP × PP (with
``pp`` micro-batches per step, and with 8) and prints the KV pool, TTFT and TPOT
percentiles and goodput under ``--slo`` (Markdown).
"""

from __future__ import annotations

import argparse

from slotune.cluster import ClusterSpec, InstanceSpec, run_cluster
from slotune.engine.config import EngineConfig
from slotune.workloads import load_trace, parse_slo, summarize
from slotune.workloads.arrivals import ArrivalSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--trace", default="long-context")
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--slo", default="ttft=2s,tpot=50ms")
    args = ap.parse_args()
    trace = load_trace(args.trace)
    slo = parse_slo(args.slo)
    print(
        f"{args.model}, {args.gpus} × H100, {args.trace} at {args.rate:g} req/s, SLO {args.slo}\n"
    )
    print(
        "| TP × PP (micro-batches) | KV blocks | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) "
        "| goodput (req/s) |"
    )
    print("|---|---|---|---|---|")
    for pp in (1, 2, 4):
        tp = args.gpus // pp
        for mb in (None, 8) if pp > 1 else (None,):
            inst = InstanceSpec(EngineConfig(), model=args.model, tp=tp, pp=pp, micro_batches=mb)
            try:
                c = run_cluster(ClusterSpec((inst,)), trace, arrivals=ArrivalSpec(rate=args.rate))
            except ValueError as exc:
                print(f"| {tp} × {pp} | does not fit: {exc} | | | |")
                continue
            s = summarize(c.result, slo)
            blocks = c.instances[0].engine_stats["num_total_blocks"]
            ttft, tpot = s["ttft_ms"], s["tpot_ms"]
            print(
                f"| {tp} × {pp} ({mb or pp}) | {blocks} | {ttft['p50']:.0f} / {ttft['p99']:.0f} "
                f"| {tpot['p50']:.1f} / {tpot['p99']:.1f} | {s['goodput']:.2f} |"
            )


if __name__ == "__main__":
    main()
