"""Simulator speed: wall seconds to replay a conversation-like trace on a simulated GPU.

    .venv/bin/python benchmarks/sim_speed.py            # 1,000 and 10,000 requests
    .venv/bin/python benchmarks/sim_speed.py --requests 1000 --rate 4
    .venv/bin/python benchmarks/sim_speed.py --stretches on off   # both, side by side
    .venv/bin/python benchmarks/sim_speed.py --stretches on off --repeats 5   # min, median

The trace has log-normal lengths with means of about 1,150 prompt and 220 output tokens
(conversation turns with their history), Poisson arrivals at 4 req/s; llama-2-7b on
a100-80g with a 512-token budget. The timed part is the whole replay through
``run_simulated`` (engine, scheduler, KV manager, cost model, runner bookkeeping); building
the trace is not timed, nor is drawing its prompt tokens (``trace_tokens_s``: cached on the
trace, so a tuner running it hundreds of times pays it once).
Each size runs in a fresh process, so start-up (imports) is reported separately; ``cpu_s``
(process time) is less disturbed than ``wall_s`` when other work shares the cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

GPU, MODEL, BUDGET = "a100-80g", "llama-2-7b", 512


def conversation_trace(num_requests: int, seed: int = 0):  # type: ignore[no-untyped-def]
    from slotune.workloads.generators import LengthDist, length_trace

    return length_trace(
        "conversation-like",
        num_requests,
        LengthDist(mean=1350, sigma=0.8, low=16, high=3800),
        LengthDist(mean=240, sigma=0.8, low=4, high=1024),
        max_total=4096,
        seed=seed,
        id_prefix="c",
    )


def run_one(num_requests: int, rate: float, stretches: bool = True) -> dict[str, float]:
    t_import = time.perf_counter()
    from slotune.engine.config import EngineConfig
    from slotune.workloads import ArrivalSpec, run_simulated

    imports_s = time.perf_counter() - t_import
    trace = conversation_trace(num_requests)
    t_tokens = time.perf_counter()
    trace.own_prompt_token_ids()  # cached on the trace: a tuner pays it once for all runs
    trace_tokens_s = time.perf_counter() - t_tokens
    config = EngineConfig(max_num_batched_tokens=BUDGET, max_model_len=4096)
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_simulated(
        config,
        trace,
        gpu=GPU,
        model=MODEL,
        arrivals=ArrivalSpec(rate=rate),
        stretches=stretches,
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = int(result.engine_stats.get("steps", len(result.steps)))
    done = int(result.requests["error"].isna().sum())
    requests = result.requests
    return {
        "stretches": stretches,
        "requests": num_requests,
        "completed": done,
        "mean_prompt": float(result.requests["prompt_tokens"].mean()),
        "mean_output": float(result.requests["output_tokens"].mean())
        if "output_tokens" in result.requests
        else float("nan"),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "imports_s": round(imports_s, 3),
        "trace_tokens_s": round(trace_tokens_s, 3),
        "steps": steps,
        "steps_per_s": round(steps / wall),
        "simulated_s": round(result.duration_s, 1),
        "stretch_steps": round(result.engine_stats.get("stretch_steps", 0) / max(steps, 1), 3),
        "mean_running": round(float(result.steps["num_running"].mean()), 1),
        "mean_waiting": round(float(result.steps["num_waiting"].mean()), 2),
        "mean_ttft_s": round(
            float((requests["first_token_time"] - requests["arrival_time"]).mean()), 3
        ),
        "preemptions": int(result.engine_stats.get("num_preemptions", 0)),
    }


def _child(n: int, rate: float, mode: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", "--requests", str(n), "--rate", str(rate)]
    out = subprocess.run([*cmd, "--stretches", mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals, req/s")
    parser.add_argument(
        "--stretches",
        nargs="*",
        default=["on"],
        choices=["on", "off"],
        help="run with the engine's stretches on, off, or both (results are identical)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="fresh runs of each, interleaved; min and median"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.requests[0], args.rate, args.stretches == ["on"])))
        return
    print(f"{MODEL} on {GPU}, budget {BUDGET}, Poisson {args.rate:g} req/s")
    for n in args.requests:
        rows: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.stretches}
        for _ in range(args.repeats):
            for mode in args.stretches:
                rows[mode].append(_child(n, args.rate, mode))
                if args.repeats == 1:
                    print(json.dumps(rows[mode][-1]))
        if args.repeats > 1:
            for runs in rows.values():
                cpu = sorted(r["cpu_s"] for r in runs)
                summary = {k: v for k, v in runs[0].items() if k not in ("wall_s", "cpu_s")}
                summary.update(repeats=len(runs), cpu_s_min=cpu[0], cpu_s_median=cpu[len(cpu) // 2])
                print(json.dumps(summary))


if __name__ == "__main__":
    main()
