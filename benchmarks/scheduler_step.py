"""Mean scheduler + KV-manager time per engine step with N running decode requests.

    .venv/bin/python benchmarks/scheduler_step.py            # 256 and 1024 running
    .venv/bin/python benchmarks/scheduler_step.py --running 256 --steps 4000

Every request decodes (ignore_eos, max_tokens never reached) with budget 8192 and block
size 16, so each step schedules one token per request and crosses a block boundary for
1/16 of them. The executor is a constant table (no work), so the time measured is
``Scheduler.schedule`` + ``Scheduler.update_from_output`` (which includes the KV-cache
manager and building the step's ``RequestOutput``s); ``engine.step`` adds the engine's own
bookkeeping on top.
"""

from __future__ import annotations

import argparse
import gc
import time

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine.executor import ExecutorOutput, KVCacheCapacity
from slotune.engine.scheduler_output import SchedulerOutput


class ConstantExecutor:
    """Samples token 7 for everyone, from one table built up front."""

    def __init__(self, num_gpu_blocks: int, request_ids: list[str]) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.output = ExecutorOutput({rid: [7] for rid in request_ids}, 0.0)

    def determine_capacity(self, config: EngineConfig) -> KVCacheCapacity:
        return KVCacheCapacity(self.num_gpu_blocks, 0)

    def initialize_cache(self, config: EngineConfig, capacity: KVCacheCapacity) -> None:
        pass

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        return self.output


def measure(num_running: int, steps: int, prefix_caching: str, prompt_len: int = 128) -> dict:
    ids = [f"req-{i}" for i in range(num_running)]
    blocks_per_req = (prompt_len + 2 * steps + 64) // 16 + 2
    executor = ConstantExecutor(num_running * blocks_per_req, ids)
    config = EngineConfig(
        max_num_batched_tokens=8192,
        block_size=16,
        max_num_seqs=num_running,
        max_model_len=prompt_len + 2 * steps + 64,
        prefix_caching=prefix_caching,  # type: ignore[arg-type]
    )
    engine = Engine(config, executor)
    params = SamplingParams(max_tokens=2 * steps + 32, ignore_eos=True)
    for i, rid in enumerate(ids):
        engine.add_request(rid, [i % 1000 + 3] * prompt_len, params)
    while engine.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    engine.step()
    scheduler = engine.scheduler
    gc.collect()
    gc.disable()
    try:
        sched_s = update_s = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            out = scheduler.schedule()
            t1 = time.perf_counter()
            scheduler.update_from_output(out, executor.output)
            t2 = time.perf_counter()
            sched_s += t1 - t0
            update_s += t2 - t1
            if out.total_num_scheduled_tokens != num_running:
                raise RuntimeError(f"expected {num_running} decodes, got {out}")
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        step_s = time.perf_counter() - t0
    finally:
        gc.enable()
    return {
        "running": num_running,
        "prefix_caching": prefix_caching,
        "schedule_ms": 1e3 * sched_s / steps,
        "update_ms": 1e3 * update_s / steps,
        "total_ms": 1e3 * (sched_s + update_s) / steps,
        "engine_step_ms": 1e3 * step_s / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, nargs="*", default=[256, 1024])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--prefix-caching", nargs="*", default=["hash", "radix", "none"])
    args = parser.parse_args()
    print(
        f"{'running':>8} {'cache':>6} {'schedule':>9} {'update':>9} "
        f"{'sched+kv':>9} {'engine.step':>11}   (ms per step)"
    )
    for n in args.running:
        for kind in args.prefix_caching:
            r = measure(n, args.steps, kind)
            print(
                f"{r['running']:>8} {r['prefix_caching']:>6} {r['schedule_ms']:>9.4f} "
                f"{r['update_ms']:>9.4f} {r['total_ms']:>9.4f} {r['engine_step_ms']:>11.4f}"
            )


if __name__ == "__main__":
    main()
