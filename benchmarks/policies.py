"""Scheduling policies on the simulator: hybrid preemption, tier quotas at overload,
adaptive chunking against fixed budgets.

    .venv/bin/python benchmarks/policies.py                  # preemption and tiers
    .venv/bin/python benchmarks/policies.py --part preemption --requests 200
    .venv/bin/python benchmarks/policies.py --part tiers
    .venv/bin/python benchmarks/policies.py --part adaptive

``preemption``: a mixed-length trace (70 % chat-sized requests, 30 % long prompts of
3-6k tokens; seeded), Poisson arrivals, llama-2-7b on a100-80g with the KV pool cut to
``--blocks`` blocks of 16 tokens so requests preempt; recompute-only, swap-only (4 GiB of
host swap) and hybrid at each threshold of ``--thresholds`` (the grid a ``--search`` file
would give the tuner), with the prefix cache of ``--prefix-caching`` (a recomputed
request finds its own freed blocks there while they last). Prints TTFT/TPOT p99, output
throughput, preemptions and the preemption mix (tokens recomputed vs swapped).

``tiers``: the bundled ``agent-tiers`` trace (64 agent sessions, a quarter pro = tier 0)
with every session started at once (overload) on the same cut pool, scored against the
SLO ``--slo``: FCFS, priority scheduling (priority = tier: with tiers on, the queues
are in tier order anyway), a token-budget quota for tier 0, and KV + token quotas (both
of ``--share``), and priority with a decode budget of ``--budget-ms``. Prints each
tier's SLO attainment, goodput and TTFT p99.

``adaptive``: the mixed-length trace at ``--adaptive-rate`` req/s on the full KV pool:
fixed budgets (``--budgets``) against adaptive chunking at each TPOT target of
``--targets`` (ms; ceiling 8192 tokens), scored against ``ttft=--adaptive-ttft`` and that
TPOT target. Prints TTFT/TPOT p99, throughput and attainment.

Every run is single-stepped (the stretch planner declines these policies), so keep the
traces small.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np

from slotune.engine import EngineConfig
from slotune.workloads import load_trace
from slotune.workloads.arrivals import ALL_AT_ONCE, ArrivalSpec
from slotune.workloads.metrics import summarize
from slotune.workloads.runner.engine_loop import run_simulated
from slotune.workloads.slo import parse_slo
from slotune.workloads.trace import Trace, TraceRequest

GPU, MODEL = "a100-80g", "llama-2-7b"


def mixed_trace(num_requests: int, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(num_requests):
        if rng.random() < 0.3:
            prompt = int(rng.integers(3000, 6001))
        else:
            prompt = int(np.clip(rng.lognormal(np.log(300), 0.6), 16, 1500))
        output = int(np.clip(rng.lognormal(np.log(200), 0.6), 16, 1000))
        reqs.append(TraceRequest(f"m{i}", prompt, output))
    return Trace("mixed-length", tuple(reqs), seed=seed)


def _row(name: str, config: EngineConfig, trace: Trace, arrivals: ArrivalSpec, slo) -> dict:
    t0 = time.process_time()
    result = run_simulated(config, trace, gpu=GPU, model=MODEL, arrivals=arrivals)
    s = summarize(result, slo, percentiles=(50, 99))
    row = {
        "case": name,
        "ttft_p99_ms": round(s["ttft_ms"]["p99"], 1),
        "tpot_p99_ms": round(s["tpot_ms"]["p99"], 2),
        "output_tok_s": round(s["output_throughput"], 1),
        "preemptions": s["num_preemptions"],
        **s.get("preemption_mix", {}),
        "cpu_s": round(time.process_time() - t0, 1),
    }
    if slo is not None:
        row["attainment"] = round(s["slo_attainment"], 3)
        for tier, ts in s.get("tiers", {}).items():
            row[f"tier{tier}_attainment"] = round(ts["slo_attainment"], 3)
            row[f"tier{tier}_goodput"] = round(ts["goodput"], 3)
            row[f"tier{tier}_ttft_p99_ms"] = round(ts["ttft_ms"]["p99"], 1)
    return row


def preemption(args: argparse.Namespace) -> list[dict]:
    trace = mixed_trace(args.requests, args.seed)
    longest = max(r.prompt_len + r.output_len for r in trace)
    base = EngineConfig(
        max_num_batched_tokens=2048,
        num_gpu_blocks=args.blocks,
        max_model_len=longest,
        swap_space_gb=4.0,
        prefix_caching=args.prefix_caching,
    )
    arrivals = ArrivalSpec(rate=args.rate)
    cases = [("recompute", base), ("swap", replace(base, preemption_mode="swap"))]
    for t in args.thresholds:
        hybrid = replace(base, preemption_mode="hybrid", swap_threshold_tokens=t)
        cases.append((f"hybrid@{t}", hybrid))
    return [_row(name, c, trace, arrivals, None) for name, c in cases]


def tiers(args: argparse.Namespace) -> list[dict]:
    trace = load_trace("agent-tiers")
    slo = parse_slo(args.slo)
    base = EngineConfig(max_num_batched_tokens=2048, num_gpu_blocks=args.blocks, max_model_len=8192)
    share = args.share
    cases = [
        ("fcfs", base),
        ("priority", replace(base, scheduling_policy="priority")),
        (f"token quota {share}", replace(base, top_tier_token_share=share)),
        (
            f"kv + token quotas {share}",
            replace(base, top_tier_kv_share=share, top_tier_token_share=share),
        ),
        (
            f"priority + decode budget {args.budget_ms:g} ms",
            replace(base, scheduling_policy="priority", decode_budget_ms=args.budget_ms),
        ),
    ]
    return [_row(name, c, trace, ALL_AT_ONCE, slo) for name, c in cases]


def adaptive(args: argparse.Namespace) -> list[dict]:
    trace = mixed_trace(args.requests, args.seed)
    longest = max(r.prompt_len + r.output_len for r in trace)
    base = EngineConfig(max_num_batched_tokens=8192, max_model_len=longest)
    arrivals = ArrivalSpec(rate=args.adaptive_rate)
    rows = []
    for target in args.targets:
        slo = parse_slo(f"ttft={args.adaptive_ttft},tpot={target:g}ms")
        cases = [(f"fixed {b}", replace(base, max_num_batched_tokens=b)) for b in args.budgets]
        cases.append((f"adaptive {target:g} ms", replace(base, adaptive_chunk_ms=target)))
        for name, config in cases:
            rows.append({"tpot_target_ms": target, **_row(name, config, trace, arrivals, slo)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("preemption", "tiers", "adaptive", "both"), default="both")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--blocks", type=int, default=2048)
    p.add_argument("--thresholds", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--slo", default="ttft=2s,tpot=100ms")
    p.add_argument("--share", type=float, default=0.3, help="tier 0's reserved share")
    p.add_argument("--budget-ms", type=float, default=100.0, help="decode budget (TPOT target)")
    p.add_argument("--prefix-caching", default="hash", choices=("none", "hash", "radix"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adaptive-rate", type=float, default=4.0)
    p.add_argument("--adaptive-ttft", default="10s")
    p.add_argument("--targets", type=float, nargs="+", default=[30.0, 40.0, 50.0])
    p.add_argument("--budgets", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    args = p.parse_args()
    rows = []
    if args.part in ("preemption", "both"):
        rows += preemption(args)
    if args.part in ("tiers", "both"):
        rows += tiers(args)
    if args.part == "adaptive":
        rows += adaptive(args)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
