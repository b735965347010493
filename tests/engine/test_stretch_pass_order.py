"""The stretch planner takes a step's passes in the scheduler's order, with the scheduler's
budget: every step it plans makes the same passes (which queue, which kinds of waiting
request, budget before and after each) as ``Scheduler.schedule`` then makes on that state,
and schedules the same tokens. Both go through ``Scheduler.run_passes``; a side that
orders its passes itself, or sizes a pass by another budget, fails here."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from slotune.engine import Engine, SamplingParams
from slotune.engine.scheduler import ADMIT_ANY, ADMIT_PROMPTS, ADMIT_SWAPPED, Passes, Scheduler
from slotune.engine.stretch import StretchPlanner
from tests.engine.deterministic import DeterministicExecutor
from tests.engine.test_properties import (
    Job,
    Workload,
    largest_request_blocks,
    workload_config,
)

KINDS = {ADMIT_ANY: "any", ADMIT_PROMPTS: "prompts", ADMIT_SWAPPED: "swapped"}
CONFIGS = list(
    itertools.product(
        ("chunked", "prefill_first"), ("recompute", "swap"), ("none", "hash", "radix"), (1, 4, 16)
    )
)
SEEDS = range(3)

Pass = tuple[str, int, int]  # (pass, budget before, budget after)


class Recording:
    """Passes that note each pass they make, then do it."""

    def __init__(self, inner: Passes, log: list[Pass]) -> None:
        self.inner = inner
        self.log = log

    def head(self):  # type: ignore[no-untyped-def]
        return self.inner.head()

    @property
    def preempted(self) -> bool:
        return self.inner.preempted

    def serve_running(self, budget: int) -> int:
        left = self.inner.serve_running(budget)
        self.log.append(("running", budget, left))
        return left

    def serve_waiting(self, budget: int, kinds: int) -> int:
        left = self.inner.serve_waiting(budget, kinds)
        self.log.append((f"waiting:{KINDS[kinds]}", budget, left))
        return left


@pytest.fixture
def passes_log(monkeypatch: pytest.MonkeyPatch) -> list[Pass]:
    """The passes every ``run_passes`` call makes, whoever calls it."""
    log: list[Pass] = []
    run_passes = Scheduler.run_passes

    def recorded(self: Scheduler, passes: Passes, budget: int) -> int:
        return run_passes(self, Recording(passes, log), budget)

    monkeypatch.setattr(Scheduler, "run_passes", recorded)
    return log


def workload(seed: int) -> Workload:
    """Small random requests over 20 steps: budgets, thresholds (0: the budget) and seats
    that bind, blocks few enough to preempt and swap."""
    rng = random.Random(seed)
    base = [rng.randint(2, 4) for _ in range(rng.choice((0, 8, 20)))]
    jobs = [
        Job(
            rid=f"r{i}",
            prompt=base[: rng.randint(0, len(base))]
            + [rng.randint(2, 9) for _ in range(rng.randint(1, 20))],
            max_tokens=rng.randint(1, 24),
            n=rng.choice((1, 1, 1, 1, 2)),
            arrive=rng.randint(0, 20),
            abort_at=None,
        )
        for i in range(rng.randint(4, 12))
    ]
    return Workload(
        jobs=jobs,
        budget=rng.randint(4, 24),
        threshold=rng.choice((0, 0, 5, 16)),
        max_num_seqs=rng.randint(2, 6),
        extra_blocks=rng.randint(0, 8),
        cpu_blocks=rng.randint(0, 12),
    )


def compare_every_step(w: Workload, cfg: tuple, log: list[Pass], seen: Counter) -> None:
    """Step the workload one step at a time; wherever the planner plans the next step,
    check its passes and tokens against the step the scheduler then makes."""
    config = workload_config(w, *cfg)
    need = largest_request_blocks(w, config.block_size)
    executor = DeterministicExecutor(need + w.extra_blocks, w.cpu_blocks)
    engine = Engine(config, executor, check_stretches=False)
    scheduler = engine.scheduler
    pending = sorted(w.jobs, key=lambda j: j.arrive)
    for step in range(2000):  # far more than any of these workloads takes
        while pending and pending[0].arrive <= step:
            j = pending.pop(0)
            params = SamplingParams(max_tokens=j.max_tokens, n=j.n, ignore_eos=True)
            engine.enqueue(engine.new_request(j.rid, j.prompt, params))
        if not (pending or engine.has_unfinished_requests()):
            return
        log.clear()
        planner = StretchPlanner.start(scheduler, stop_at_finish=False)
        planned = list(log)
        log.clear()
        before = len(executor.outputs)
        engine.step()
        if planner is None:
            continue
        assert planned == log, f"step {step}: planned passes {planned}, scheduled {log}"
        planned_step = planner.plan.steps[0]
        assert len(executor.outputs) == before + 1  # a planned step schedules tokens
        out = executor.outputs[-1]
        assert (
            planned_step.num_tokens,
            planned_step.num_requests,
            planned_step.num_prefill,
            planned_step.num_samples,
        ) == (
            out.total_num_scheduled_tokens,
            len(out.num_scheduled_tokens),
            out.num_prefill_tokens,
            sum(out.num_samples.values()),
        ), f"step {step}"
        seen.update(name for name, _, _ in log)
        seen.update(f"{name} took budget" for name, before_, after in log if after < before_)
        seen["budget spent"] += log[-1][2] <= 0
        seen[config.policy] += 1
    raise AssertionError(f"{cfg}: the workload did not finish in 2000 steps")


def test_planned_steps_take_the_schedulers_passes_and_budget(passes_log: list[Pass]) -> None:
    seen: Counter = Counter()
    for cfg, seed in itertools.product(CONFIGS, SEEDS):
        compare_every_step(workload(seed), cfg, passes_log, seen)
    # the comparisons covered both policies, every kind of pass, admissions and a spent budget
    for what in (
        "chunked",
        "prefill_first",
        "running",
        "running took budget",
        "waiting:any",
        "waiting:any took budget",
        "waiting:prompts",
        "waiting:swapped",
        "budget spent",
    ):
        assert seen[what] > 0, (what, seen)
