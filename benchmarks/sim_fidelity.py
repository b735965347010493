"""Simulator fidelity: the real engine and the calibrated simulator on the same trace.

    .venv/bin/python benchmarks/sim_fidelity.py                  # small preset, 200 requests
    .venv/bin/python benchmarks/sim_fidelity.py --model DIR --device cuda --threads 0

On this machine: calibrate the cost model against the real executor (``slotune
calibrate``), then replay one trace (ShareGPT-like lengths scaled to the small model,
Poisson arrivals at a load that queues) through the real engine on the wall clock and
through the simulator with the calibrated profile on its virtual clock, for a small and a
large token budget. Prints p50/p90/p99 TTFT and TPOT and output throughput side by side
with the simulator's relative error, as a Markdown table; ``--json`` writes the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

SCALE = 0.25  # ShareGPT-like lengths × this: the small model on a CPU, not Llama-3 on an H100
BUDGETS = {"small budget (64 tokens)": 64, "large budget (512 tokens)": 512}
PERCENTILES = ("p50", "p90", "p99")


def scaled_trace(num_requests: int, seed: int = 0):  # type: ignore[no-untyped-def]
    from slotune.workloads import Trace, TraceRequest, sharegpt_like

    base = sharegpt_like(num_requests, seed=seed)
    reqs = tuple(
        TraceRequest(
            request_id=r.request_id,
            prompt_len=max(4, round(r.prompt_len * SCALE)),
            output_len=max(2, round(r.output_len * SCALE)),
        )
        for r in base
    )
    return Trace(name=f"sharegpt-like x{SCALE:g}", requests=reqs, seed=seed)


def engine_config(budget: int):  # type: ignore[no-untyped-def]
    from slotune.engine import EngineConfig

    return EngineConfig(
        max_num_batched_tokens=budget,
        block_size=16,
        max_num_seqs=64,
        max_model_len=1024,
        num_gpu_blocks=2048,
        prefix_caching="none",
    )


def metrics(summary: dict[str, Any]) -> dict[str, float]:
    out = {f"ttft_{p}": summary["ttft_ms"][p] for p in PERCENTILES}
    out |= {f"tpot_{p}": summary["tpot_ms"][p] for p in PERCENTILES}
    out["throughput"] = summary["output_throughput"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="checkpoint folder (default: a fresh small preset)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--load", type=float, default=1.0, help="arrival rate / capacity")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (0: the executor's default)"
    )
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    args = parser.parse_args()

    from slotune.engine import Engine
    from slotune.engine.model import TorchExecutor
    from slotune.engine.model.calibrate import calibrate, profile_json
    from slotune.engine.model.init_model import init_model
    from slotune.workloads import ArrivalSpec, run_engine, run_simulated, summarize

    threads = args.threads or None
    work = Path(tempfile.mkdtemp(prefix="sim_fidelity_"))
    model = Path(args.model) if args.model else init_model(work / "small", "small")
    t0 = time.perf_counter()
    result = calibrate(model, device=args.device, progress=print, threads=threads)
    profile = work / "profile.json"
    profile.write_text(json.dumps(profile_json(result), indent=2))
    errs = sorted(abs(e) for e in result.errors_pct())
    print(
        f"calibrated in {time.perf_counter() - t0:.0f} s; grid error median "
        f"{errs[len(errs) // 2]:.1f}%, max {errs[-1]:.1f}%"
    )

    trace = scaled_trace(args.requests)
    config_json = str(model / "config.json")
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for name, budget in BUDGETS.items():
        config = engine_config(budget)
        # Capacity from the simulator with everything queued at once; then a Poisson load.
        burst = run_simulated(config, trace, gpu=str(profile), model=config_json)
        rate = args.load * len(trace) / burst.duration_s
        arrivals = ArrivalSpec(rate=rate)
        sim = run_simulated(config, trace, gpu=str(profile), model=config_json, arrivals=arrivals)
        t1 = time.perf_counter()
        executor = TorchExecutor(model, device=args.device, threads=threads)
        engine = Engine(config, executor, eos_token_id=executor.eos_token_id)
        real = run_engine(engine, trace, arrivals)
        print(f"{name}: rate {rate:.2f} req/s, real run {time.perf_counter() - t1:.0f} s")
        rows[name] = {
            "real": metrics(summarize(real)),
            "sim": metrics(summarize(sim)),
            "rate": {"req_per_s": rate},
        }
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"profile": profile_json(result), "runs": rows}, indent=2))


def print_table(rows: dict[str, dict[str, dict[str, float]]]) -> None:
    for name, r in rows.items():
        print(f"\n{name}, Poisson at {r['rate']['req_per_s']:.2f} req/s\n")
        print("| metric | real engine | simulator | error |")
        print("|---|---:|---:|---:|")
        for key, real in r["real"].items():
            sim = r["sim"][key]
            unit = "tok/s" if key == "throughput" else "ms"
            err = 100.0 * (sim - real) / real if real else float("nan")
            print(f"| {key.replace('_', ' ')} ({unit}) | {real:.1f} | {sim:.1f} | {err:+.1f}% |")


if __name__ == "__main__":
    main()
