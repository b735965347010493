"""Mean scheduler + KV-manager time per engine step with N running decode requests.

    .venv/bin/python benchmarks/scheduler_step.py            # 256 and 1024 running
    .venv/bin/python benchmarks/scheduler_step.py --running 256 --prefix-caching hash

Every request decodes (ignore_eos, max_tokens never reached) with budget 8192 and block
size 16, so each step schedules one token per request and crosses a block boundary for
1/16 of them. The executor is a constant table (no work), so the time measured is
``Scheduler.schedule`` + ``Scheduler.update_from_output`` (which includes the KV-cache
manager and building the step's ``RequestOutput``s); ``engine.step`` adds the engine's
own bookkeeping on top. ``outputs`` is the cost of building that many ``RequestOutput``s
alone (a part of ``update``): what the API's per-token objects cost. ``stretch`` is the
cost per step of 100 decode steps planned and applied at once (``StretchPlanner`` +
``apply_stretch``, the stretch primitives; no ``RequestOutput``s). Times are this
thread's CPU time, best of ``--repeats`` blocks, so other processes on a shared machine
do not inflate them.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from slotune.engine import Engine, EngineConfig, RequestOutput, SamplingParams
from slotune.engine.executor import ExecutorOutput, KVCacheCapacity
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.stretch import StretchPlanner, apply_stretch

STRETCH = 100  # decode steps planned and applied at once (``slotune.engine.stretch``)
clock = time.thread_time  # CPU time: time spent descheduled on a shared machine is not ours


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


def measure(
    num_running: int, steps: int, prefix_caching: str, repeats: int = 5, prompt_len: int = 128
) -> dict:
    ids = [f"req-{i}" for i in range(num_running)]
    total_steps = 2 * steps * repeats + STRETCH * repeats + 64
    blocks_per_req = (prompt_len + total_steps) // 16 + 2
    executor = ConstantExecutor(num_running * blocks_per_req, ids)
    config = EngineConfig(
        max_num_batched_tokens=8192,
        block_size=16,
        max_num_seqs=num_running,
        max_model_len=prompt_len + total_steps,
        prefix_caching=prefix_caching,  # type: ignore[arg-type]
    )
    engine = Engine(config, executor)
    params = SamplingParams(max_tokens=total_steps - 32, ignore_eos=True)
    for i, rid in enumerate(ids):
        engine.add_request(rid, [i % 1000 + 3] * prompt_len, params)
    while engine.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    engine.step()
    scheduler = engine.scheduler
    # Best of ``repeats`` blocks: other processes on a shared machine only ever add time.
    sched_s = update_s = step_s = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            s_total = u_total = 0.0
            for _ in range(steps):
                t0 = clock()
                out = scheduler.schedule()
                t1 = clock()
                scheduler.update_from_output(out, executor.output)
                t2 = clock()
                s_total += t1 - t0
                u_total += t2 - t1
                if out.total_num_scheduled_tokens != num_running:
                    raise RuntimeError(f"expected {num_running} decodes, got {out}")
            if s_total + u_total < sched_s + update_s:
                sched_s, update_s = s_total, u_total
            t0 = clock()
            for _ in range(steps):
                engine.step()
            step_s = min(step_s, clock() - t0)
        stretch_s = float("inf")
        for _ in range(repeats):
            t0 = clock()
            planner = StretchPlanner.start(scheduler, stop_at_finish=False)
            while planner is not None and planner.plan.num_steps < STRETCH:
                if not planner.plan_step():
                    break
            if planner is None or planner.plan.num_steps != STRETCH:
                raise RuntimeError(f"expected a stretch of {STRETCH} steps")
            plan = planner.finish()
            apply_stretch(scheduler, plan, [[7] * STRETCH for _ in plan.requests])
            stretch_s = min(stretch_s, clock() - t0)
        outputs_s = float("inf")
        for _ in range(repeats):
            t0 = clock()
            for _ in range(steps):
                [RequestOutput(rid, 0, [7], False, None, prompt_len, 0, 0) for rid in ids]
            outputs_s = min(outputs_s, clock() - t0)
    finally:
        gc.enable()
    return {
        "running": num_running,
        "prefix_caching": prefix_caching,
        "schedule_ms": 1e3 * sched_s / steps,
        "update_ms": 1e3 * update_s / steps,
        "total_ms": 1e3 * (sched_s + update_s) / steps,
        "engine_step_ms": 1e3 * step_s / steps,
        "outputs_ms": 1e3 * outputs_s / steps,
        "stretch_ms": 1e3 * stretch_s / STRETCH,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, nargs="*", default=[256, 1024])
    parser.add_argument("--steps", type=int, default=400, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="blocks; the fastest counts")
    parser.add_argument("--prefix-caching", nargs="*", default=["hash", "radix", "none"])
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    args = parser.parse_args()
    rows = []
    print(
        f"{'running':>8} {'cache':>6} {'schedule':>9} {'update':>9} "
        f"{'sched+kv':>9} {'engine.step':>11} {'outputs':>8} {'stretch':>8}   (ms of CPU per step)"
    )
    for n in args.running:
        for kind in args.prefix_caching:
            r = measure(n, args.steps, kind, args.repeats)
            rows.append(r)
            print(
                f"{r['running']:>8} {r['prefix_caching']:>6} {r['schedule_ms']:>9.4f} "
                f"{r['update_ms']:>9.4f} {r['total_ms']:>9.4f} {r['engine_step_ms']:>11.4f} "
                f"{r['outputs_ms']:>8.4f} {r['stretch_ms']:>8.4f}"
            )
    if args.json:  # for `slotune regress` (benchmarks/suite.yaml)
        print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
