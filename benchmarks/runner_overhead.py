"""Runner overhead: the workload runner's own share of a simulated run, and summarize().

    .venv/bin/python benchmarks/runner_overhead.py

Replays bundled traces through ``run_simulated``'s loop (step by step) with the engine's
``new_request``, ``enqueue`` and ``step`` timed separately; ``runner_s`` is everything
else (arrivals, sessions, token bookkeeping, building the DataFrames). Best of three,
process time (other work on the machine disturbs it less than wall time).
"""

from __future__ import annotations

import time
from typing import Any

from slotune.engine import Engine, EngineConfig
from slotune.workloads import ArrivalSpec, load_trace, parse_slo, summarize
from slotune.workloads.runner.engine_loop import VirtualClock, drive_engine

CASES = [
    ("sharegpt-like", ArrivalSpec(rate=20), 1000),
    ("agent", ArrivalSpec(concurrency=16), 340),
    ("shared-prefix", ArrivalSpec(rate=8, burstiness=0.5), 400),
]


def _timed_engine(engine: Engine, acc: list[float]) -> Engine:
    """The engine with the calls the runner makes into it timed into ``acc[0]``."""

    def timed(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            out = method(*args, **kwargs)
            acc[0] += time.process_time() - t
            return out

        return call

    for name in ("step", "new_request", "enqueue"):
        setattr(engine, name, timed(getattr(engine, name)))
    return engine


def measure(name: str, arrivals: ArrivalSpec, n: int) -> dict[str, Any]:
    trace = load_trace(name, num_requests=n)
    trace.own_prompt_token_ids()
    best: dict[str, Any] = {}
    for _ in range(3):
        acc = [0.0]
        engine = _timed_engine(
            Engine.simulated(EngineConfig(), gpu="h100", model="llama-3-8b"), acc
        )
        t0 = time.process_time()
        result = drive_engine(engine, trace, arrivals, VirtualClock())
        total = time.process_time() - t0
        t1 = time.process_time()
        summarize(result, parse_slo("ttft=300ms,tpot=50ms"))
        summ = time.process_time() - t1
        tokens = int(result.requests["output_tokens"].sum())
        row = {
            "trace": name,
            "requests": n,
            "steps": len(result.steps),
            "tokens": tokens,
            "total_s": total,
            "engine_s": acc[0],
            "runner_s": total - acc[0],
            "summarize_s": summ,
        }
        if not best or row["runner_s"] < best["runner_s"]:
            best = row
    best["runner_share"] = best["runner_s"] / best["total_s"]
    best["runner_us_per_token"] = 1e6 * best["runner_s"] / best["tokens"]
    return best


def main() -> None:
    print(
        "| trace | requests | steps | output tokens | run (s) | engine (s) | runner (s) "
        "| runner share | runner µs/token | summarize (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, arrivals, n in CASES:
        r = measure(name, arrivals, n)
        print(
            f"| {r['trace']} | {r['requests']} | {r['steps']} | {r['tokens']} | "
            f"{r['total_s']:.3f} | {r['engine_s']:.3f} | {r['runner_s']:.3f} | "
            f"{r['runner_share']:.1%} | {r['runner_us_per_token']:.2f} | {r['summarize_s']:.3f} |"
        )


if __name__ == "__main__":
    main()
