"""Stretches: steps planned in advance and applied at once leave the engine exactly where
single steps would (same tokens, finishes, counters, block ids and free-queue order)."""

from __future__ import annotations

import itertools
import random
import sys
from dataclasses import fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine import engine as engine_module
from slotune.engine.stretch import StretchPlan, StretchPlanner, apply_stretch
from slotune.engine.stretch.check import StretchMismatch
from slotune.engine.stretch.plan import sampled_runs
from slotune.engine.stretch.planner import _TESTED_CONFIG, untested_config
from tests.engine.deterministic import DeterministicExecutor, PricedExecutor, token_for
from tests.engine.invariants import check_all, check_drained
from tests.engine.test_properties import (
    ALL_CONFIGS,
    CACHING,
    MAX_MODEL_LEN,
    POLICIES,
    PREEMPTION,
    Job,
    Workload,
    largest_request_blocks,
    workload_config,
    workloads,
)

LARGE_MODEL_LEN = 1024
# the configurations the planner plans for (it refuses the others: see the last test below)
PLANNED_PREEMPTION = [m for m in PREEMPTION if m in (_TESTED_CONFIG["preemption_mode"] or ())]
PLANNED_SCHEDULING = ("fcfs", "fcfs-adaptive")
PLANNED_CONFIGS = [
    c for c in ALL_CONFIGS if c[1] in PLANNED_PREEMPTION and c[4] in PLANNED_SCHEDULING
]
LARGE_CONFIGS = [
    *itertools.product(POLICIES, PLANNED_PREEMPTION, CACHING, (4, 16, 32)),
    *itertools.product(("chunked",), PLANNED_PREEMPTION, ("hash",), (16,), ("fcfs-adaptive",)),
]


@st.composite
def large_workloads(draw: st.DrawFn) -> Workload:
    """Up to 48 requests of up to 900 tokens arriving over 300 steps, prompts sharing a
    few long prefixes (tokens drawn from seeds, so hypothesis stays quick)."""

    def tokens(length: int, seed: int, low: int, high: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randint(low, high) for _ in range(length)]

    bases = [
        tokens(length, seed, 2, 4)
        for length, seed in draw(
            st.lists(st.tuples(st.integers(0, 300), st.integers(0, 99)), min_size=1, max_size=4)
        )
    ]
    jobs = []
    for i in range(draw(st.integers(5, 48))):
        base = draw(st.sampled_from(bases))
        suffix = tokens(draw(st.integers(0 if base else 1, 200)), draw(st.integers(0, 99)), 2, 9)
        jobs.append(
            Job(
                rid=f"r{i}",
                prompt=base + suffix,
                max_tokens=draw(st.integers(1, 400)),
                n=draw(st.sampled_from((1, 1, 1, 1, 2))),
                arrive=draw(st.integers(0, 300)),
                abort_at=None,
            )
        )
    return Workload(
        jobs=jobs,
        budget=draw(st.integers(16, 512)),
        threshold=draw(st.sampled_from((0, 0, 32, 100))),
        max_num_seqs=draw(st.integers(4, 32)),
        extra_blocks=draw(st.integers(0, 60)),
        cpu_blocks=draw(st.integers(0, 60)),
    )


def _tokens(plan: StretchPlan) -> list[list[int]]:
    return sampled_runs(plan, _runs)


def _runs(requests: list, counts: list[int]) -> list[list[int]]:
    return [
        [token_for(r.parent_id, r.index, len(r.all_token_ids) + k) for k in range(n)]
        for r, n in zip(requests, counts, strict=True)
    ]


def per_step(plan: StretchPlan, name: str) -> list:
    return [getattr(step, name) for step in plan.steps]


def per_request(plan: StretchPlan, name: str) -> list:
    return [getattr(m, name) for m in plan.requests]


class ContextPricedExecutor(PricedExecutor):
    """Adaptive chunking's step time grows with the decodes' context and the prefill's
    prior tokens too, so a planned step's budget depends on all of them."""

    def step_time(self, d: int, ctx: int, p: int, prior: int = 0) -> float:
        return super().step_time(d, ctx, p, prior) + 2e-6 * ctx + 1e-6 * prior


def drive(w: Workload, cfg: tuple, mode: str, max_model_len: int = MAX_MODEL_LEN) -> tuple:
    """Run the workload stepping one by one (``single``), with stretches that end at the
    next arrival (``until``), or with stretches fed the arrivals (``feed``)."""
    config = workload_config(w, *cfg)
    if max_model_len != MAX_MODEL_LEN:
        budget = config.max_num_batched_tokens
        if config.policy == "prefill_first":
            budget = max_model_len + w.budget
        config = replace(config, max_model_len=max_model_len, max_num_batched_tokens=budget)
    need = largest_request_blocks(w, config.block_size)
    # a stretch bypasses the executor, so its model of the KV contents would fall behind
    fast = mode != "single"
    kind = ContextPricedExecutor if config.adaptive_chunk_ms else DeterministicExecutor
    executor = kind(need + w.extra_blocks * 2, w.cpu_blocks, check_kv=not fast)
    engine = Engine(config, executor, check_stretches=False)  # it applies stretches itself
    scheduler = engine.scheduler
    tokens: dict[tuple[str, int], list[int]] = {}
    reasons: dict[tuple[str, int], str] = {}
    pending = sorted(w.jobs, key=lambda j: j.arrive)

    def arriving(step: int) -> list:
        due = []
        while pending and pending[0].arrive <= step:
            j = pending.pop(0)
            params = SamplingParams(max_tokens=j.max_tokens, n=j.n, ignore_eos=True)
            due.append(engine.new_request(j.rid, j.prompt, params))
        return due

    def record(outputs: list) -> None:
        for out in outputs:
            tokens.setdefault((out.request_id, out.index), []).extend(out.new_token_ids)
            if out.finished:
                reasons[(out.request_id, out.index)] = out.finish_reason  # type: ignore[assignment]

    step = 0
    while pending or engine.has_unfinished_requests():
        for request in arriving(step):
            engine.enqueue(request)
        planner = StretchPlanner.start(scheduler, stop_at_finish=False) if fast else None
        if planner is not None:
            while True:
                if mode == "feed":
                    planner.arrive(arriving(step + planner.plan.num_steps))
                elif pending and step + planner.plan.num_steps >= pending[0].arrive:
                    break
                if not planner.plan_step():
                    break
            plan = planner.finish()
            record(apply_stretch(scheduler, plan, _tokens(plan)).outputs)
            step += plan.num_steps
        else:
            if engine.has_unfinished_requests():
                record(engine.step())
            step += 1
        check_all(engine, None)
    check_drained(engine)
    stats = engine.stats()
    stats.pop("stretch_steps")
    free_order = [b.block_id for b in engine.kv_cache.pool.free_queue.blocks()]
    return tokens, reasons, stats, free_order


@settings(max_examples=60, deadline=None)
@given(workloads(), st.sampled_from(PLANNED_CONFIGS))
def test_stretches_equal_single_steps(w: Workload, cfg: tuple) -> None:
    w = replace(w, jobs=[replace(j, abort_at=None) for j in w.jobs])
    single = drive(w, cfg, "single")
    assert drive(w, cfg, "until") == single
    assert drive(w, cfg, "feed") == single


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(large_workloads(), st.sampled_from(LARGE_CONFIGS))
def test_stretches_equal_single_steps_on_larger_workloads(w: Workload, cfg: tuple) -> None:
    single = drive(w, cfg, "single", LARGE_MODEL_LEN)
    assert drive(w, cfg, "until", LARGE_MODEL_LEN) == single
    assert drive(w, cfg, "feed", LARGE_MODEL_LEN) == single


def test_the_planner_refuses_configurations_its_tests_do_not_cover() -> None:
    assert set(_TESTED_CONFIG) == {f.name for f in fields(EngineConfig)}, (
        "a new EngineConfig field: review the stretch planner for it, test it, list it"
    )
    assert untested_config(EngineConfig()) is None
    assert "scheduling_policy='priority'" in (
        untested_config(EngineConfig(scheduling_policy="priority")) or ""
    )
    assert "top_tier_kv_share=0.2" in (untested_config(EngineConfig(top_tier_kv_share=0.2)) or "")
    assert untested_config(EngineConfig(decode_budget_ms=50.0)) is None  # workloads' tests
    engine = Engine(EngineConfig(block_size=4), PlannableExecutor(), check_stretches=False)
    engine.add_request("a", [2] * 5, SamplingParams(max_tokens=9, ignore_eos=True))
    engine.step()
    assert engine.run_stretch(0.0, None) is not None
    _TESTED_CONFIG["block_size"] = frozenset({16})
    untested_config.cache_clear()
    try:
        assert "block_size=4" in (untested_config(engine.config) or "")
        assert engine.run_stretch(0.0, None) is None  # it steps one by one instead
    finally:
        _TESTED_CONFIG["block_size"] = None
        untested_config.cache_clear()
    params = SamplingParams(max_tokens=9, ignore_eos=True, logprobs=2)
    engine.add_request("b", [3] * 5, params)  # a stretch reports no logprobs
    assert engine.run_stretch(0.0, None) is None  # b is not admitted in a stretch
    engine.step()
    assert engine.run_stretch(0.0, None) is None  # b runs


def _plan_all(engine: Engine, stop_at_finish: bool = False) -> StretchPlan | None:
    planner = StretchPlanner.start(engine.scheduler, stop_at_finish)
    if planner is None:
        return None
    while planner.plan_step():
        pass
    return planner.finish()


def test_plan_counts_frees_stops_at_block_shortage_and_admits_into_free_seats() -> None:
    config = EngineConfig(block_size=4, max_num_seqs=3, prefix_caching="none")
    engine = Engine(config, DeterministicExecutor(num_gpu_blocks=8), check_stretches=False)
    engine.add_request("a", [2] * 4, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.add_request("b", [3] * 6, SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()  # both prompts: a holds 1 block, b 2 blocks; each sampled one token
    held = engine.kv_cache.pool.get_new_blocks(2)  # someone else holds 2: 3 are free
    plan = _plan_all(engine)
    assert plan is not None
    # b finishes with its 5th token (step 4) and frees its 3 blocks; a takes a block every
    # 4 steps (1, 5, 9, ...) until none is free: step 21 is not planned
    assert per_request(plan, "last_sample") == [19, 3] and plan.steps[3].finishes == [1]
    assert per_step(plan, "num_tokens") == [2] * 4 + [1] * 16
    assert [a for a in per_step(plan, "allocs") if a] == [[(0, 1)], [(1, 1)]] + [[(0, 1)]] * 4
    assert _plan_all(engine, stop_at_finish=True).num_steps == 4  # type: ignore[union-attr]
    engine.kv_cache.pool.free_blocks(held)
    engine.add_request("c", [4] * 3, SamplingParams(max_tokens=9, ignore_eos=True))
    plan = _plan_all(engine)  # c's admission is certain (no prefix cache): planned too
    assert plan is not None and plan.steps[0].admits == [(2, 3)]
    assert plan.requests[2].first_sample == 0
    engine.step()  # c comes in: all 3 seats are taken
    engine.add_request("d", [5] * 3, SamplingParams(max_tokens=1))
    plan = _plan_all(engine)  # d waits for a seat: b's finish (step 3) frees one
    assert plan is not None and plan.steps[2].finishes == [1]
    assert [i for i, a in enumerate(per_step(plan, "admits")) if a] == [3]
    assert plan.requests[3].request.request_id == "d" and plan.requests[3].last_sample == 3


def test_a_first_block_still_open_blocks_only_lookups_that_start_with_its_tokens() -> None:
    """After its prompt step ``a`` holds 3 tokens (blocks of 4): its first block will hold
    a token not sampled yet. A waiting prompt that does not start with all 3 cannot share
    that block, so its admission is planned; one that does might, so the plan ends before
    it is tried."""
    config = EngineConfig(block_size=4, max_num_seqs=4, prefix_caching="hash")

    def admits_of(prompt_after_a: bool) -> list[int]:
        engine = Engine(config, DeterministicExecutor(num_gpu_blocks=40), check_stretches=False)
        engine.add_request("a", [7, 8], SamplingParams(max_tokens=20, ignore_eos=True))
        engine.step()
        a_tokens = engine.scheduler.requests["a"].all_token_ids
        assert len(a_tokens) == 3
        head = list(a_tokens) if prompt_after_a else [7, 8, a_tokens[2] + 1]
        engine.add_request("c", [*head, 1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
        plan = _plan_all(engine)
        return [j for j, step in enumerate(plan.steps) if step.admits] if plan else []

    assert admits_of(prompt_after_a=False) == [0]
    assert admits_of(prompt_after_a=True) == []


def test_a_stretch_through_a_prompt_samples_its_first_token() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=6, prefix_caching="hash")
    engine = Engine(config, DeterministicExecutor(check_kv=False), check_stretches=False)
    engine.add_request("a", [2] * 3, SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    engine.add_request("b", [3] * 12, SamplingParams(max_tokens=2, ignore_eos=True))
    engine.step()  # b takes its first chunk of 5 next to a's decode
    plan = _plan_all(engine)
    assert plan is not None
    assert per_step(plan, "num_prefill")[:2] == [5, 2]
    assert per_request(plan, "first_sample") == [0, 1]
    assert per_request(plan, "last_sample") == [5, 2]
    assert per_step(plan, "chunks")[:2] == [[(5, 5)], [(2, 10)]]
    assert plan.steps[0].fills == [1]  # b fills its third block in the first step


def test_a_decoder_behind_a_prompt_decodes_in_the_aggregate_in_running_order() -> None:
    """``d`` (a 3-token prompt) is admitted behind ``p`` (15 tokens, 3-token chunks) and
    decodes while ``p`` still prefills. It decodes in the aggregate from the first planned
    step, and what the two do in one step goes in running order, as single steps do it:
    both first fill a block in the first planned step (the order of the blocks waiting to
    enter the prefix cache), and both finish in the fourth (the order their blocks go
    back to the free queue)."""
    config = EngineConfig(
        block_size=4, long_prefill_token_threshold=3, max_num_batched_tokens=16,
        prefix_caching="hash",
    )  # fmt: skip

    def engine(check: bool) -> Engine:
        e = Engine(config, PlannableExecutor(check_kv=False), check_stretches=check)
        e.add_request("p", [2] * 15, SamplingParams(max_tokens=1, ignore_eos=True))
        e.add_request("d", [3] * 3, SamplingParams(max_tokens=5, ignore_eos=True))
        e.step()  # p takes 3 tokens, d its whole prompt (it samples)
        return e

    plan = _plan_all(engine(check=False))
    assert plan is not None and plan.num_steps == 4
    assert per_request(plan, "agg_start") == [0, 1]
    assert plan.steps[0].fills == [0, 1]
    assert plan.steps[3].finishes == [0, 1]
    single = engine(check=False)
    single.step()
    assert list(single.kv_cache.uncommitted) == ["p", "d"]
    checked = engine(check=True)  # the checker compares both orders with single steps
    for _ in range(4):
        assert checked.run_stretch(0.0, None, max_steps=1) is not None
    assert not checked.has_unfinished_requests()


def _prompts_next_to_decoders(seed: int) -> tuple[Workload, tuple]:
    """Three to ten requests arriving over 8 steps, prompts of 1 to 40 tokens, small
    thresholds, budgets and pools (some preempt), plain or adaptive budgets: prompts
    prefill for many steps in front of requests admitted after them that already decode."""
    rng = random.Random(seed)
    threshold = rng.choice([0, 2, 3, 4, 5, 7, 12])
    jobs = []
    for i in range(rng.randint(3, 10)):
        length = rng.choice([1, 2, rng.randint(1, 40)])
        prompt = [rng.randint(2, 9) for _ in range(length)]
        jobs.append(Job(f"r{i}", prompt, rng.randint(1, 16), 1, rng.randint(0, 8), None))
    w = Workload(jobs, rng.randint(4, 40), threshold, 8, rng.choice([0, 2, 5, 30]), 0)
    caching = rng.choice(["none", "hash"])
    scheduling = rng.choice(["fcfs", "fcfs", "fcfs-adaptive"])
    return w, ("chunked", "recompute", caching, 4, scheduling)


# 117: a prompt's last chunk (its only token is its last) and a decoder behind it finish in
# one step; 1376: an adaptive budget grows as requests finish, and a prompt's chunk takes all
# the decoders leave while decoders sit behind the next prompt (or behind it, its chunk
# bound by the budget), which single steps would starve: the stretch ends before that step
@pytest.mark.parametrize("seed", [117, 1376, *range(8)])
def test_stretches_equal_single_steps_with_decoders_behind_prompts(seed: int) -> None:
    w, cfg = _prompts_next_to_decoders(seed)
    single = drive(w, cfg, "single")
    assert drive(w, cfg, "until") == single
    assert drive(w, cfg, "feed") == single


def test_apply_finishes_on_a_final_stop_token() -> None:
    executor = DeterministicExecutor(check_kv=False)
    engine = Engine(EngineConfig(block_size=4), executor, check_stretches=False)
    engine.add_request("a", [2, 3], SamplingParams(max_tokens=20, stop_token_ids=(7, 8)))
    engine.step()
    planner = StretchPlanner.start(engine.scheduler, False)
    assert planner is not None
    planner.plan_step()
    planner.plan_step()
    plan = planner.finish()
    assert plan.num_steps == 3
    result = apply_stretch(engine.scheduler, plan, [[5, 6, 8]])
    (out,) = result.outputs
    assert out.new_token_ids == [5, 6, 8] and out.finish_reason == "stop"
    assert result.num_running == [1, 1, 0]
    assert not engine.has_unfinished_requests()
    assert engine.stats()["steps"] == 4 and engine.kv_cache.num_free_blocks == 1024
    assert engine.scheduler.finished_request_ids == {"a"}
    assert engine.step() == []  # nothing to run: the executor is not called ...
    engine.add_request("b", [2], SamplingParams(max_tokens=1))
    engine.step()  # ... and hears of "a" with the next batch
    assert engine.executor.outputs[-1].finished_request_ids == {"a"}


class PlannableExecutor(DeterministicExecutor):
    """Tells a stretch's durations and tokens in advance, as the simulator does."""

    def planned_step_seconds(self, *args: object) -> float:
        return self.step_duration_s

    def sampled_token_runs(self, requests: list, counts: list[int]) -> list[list[int]]:
        return [
            [token_for(r.parent_id, r.index, len(r.all_token_ids) + k) for k in range(n)]
            for r, n in zip(requests, counts, strict=True)
        ]


def test_adaptive_chunking_is_planned_on_a_fixed_step_time_model_only() -> None:
    config = EngineConfig(block_size=4, adaptive_chunk_ms=5.0)
    learned = Engine(config, PlannableExecutor(), check_stretches=False)  # fits its steps
    priced = Engine(config, _PlannablePriced(), check_stretches=False)
    for engine in (learned, priced):
        engine.add_request("a", [2] * 5, SamplingParams(max_tokens=9, ignore_eos=True))
        engine.step()
    assert learned.run_stretch(0.0, None) is None
    assert priced.run_stretch(0.0, None) is not None


class _PlannablePriced(PlannableExecutor, PricedExecutor):
    pass


def test_run_stretch_ends_a_stretch_at_an_early_stop_token() -> None:
    def run(fast: bool) -> tuple[list[int], str | None, int]:
        engine = Engine(EngineConfig(block_size=4), PlannableExecutor(check_kv=False))
        stop = token_for("a", 0, 9)  # the 6th output token (the prompt has 4)
        engine.add_request("a", [2] * 4, SamplingParams(max_tokens=20, stop_token_ids=(stop,)))
        engine.add_request("b", [3] * 4, SamplingParams(max_tokens=20, ignore_eos=True))
        tokens: list[int] = []
        reason = None
        while engine.has_unfinished_requests() and reason is None:
            stretch = engine.run_stretch(0.0, None) if fast else None
            outs = [o for o, _ in stretch] if stretch is not None else engine.step()
            for out in outs:
                if out.request_id == "a":
                    tokens.extend(out.new_token_ids)
                    reason = out.finish_reason
        return tokens, reason, engine.stats()["steps"]

    fast = run(True)
    assert fast == run(False)
    assert len(fast[0]) == 6 and fast[1] == "stop"


def _checked_engine() -> Engine:
    engine = Engine(EngineConfig(block_size=4), PlannableExecutor(), check_stretches=True)
    for i in range(3):
        engine.add_request(f"r{i}", [2 + i] * 5, SamplingParams(max_tokens=9, ignore_eos=True))
    return engine


def _run(engine: Engine) -> None:
    while engine.has_unfinished_requests():
        if engine.run_stretch(0.0, None) is None:
            engine.step()


def test_checking_mode_replays_each_stretch_and_passes_a_correct_one() -> None:
    engine = _checked_engine()
    _run(engine)
    assert engine._checker is not None and engine._checker.num_stretches >= 1


@pytest.mark.parametrize("fault", ["plan", "state"])
def test_checking_mode_catches_a_stretch_that_differs(
    fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def faulty(scheduler, plan, tokens, durations):  # type: ignore[no-untyped-def]
        if fault == "plan":
            plan.steps[0].num_prefill += 1  # the cost model would price another batch
        result = apply_stretch(scheduler, plan, tokens, durations)
        if fault == "state":
            scheduler.count_steps(1, 0)  # a step counted twice
        return result

    monkeypatch.setattr(engine_module, "apply_stretch", faulty)
    with pytest.raises(StretchMismatch, match="planned batch" if fault == "plan" else "state"):
        _run(_checked_engine())


def _preempting_workload(seed: int) -> Workload:
    """Requests with distinct prompts whose outputs outgrow a small pool: recompute
    preemptions, the preempted requests' blocks still cached while they wait."""
    rng = random.Random(seed)
    jobs = [
        Job(
            rid=f"p{i}",
            prompt=[rng.randint(10, 10**6) for _ in range(rng.randint(5, 40))],
            max_tokens=rng.randint(8, 24),
            n=1,
            arrive=rng.randint(0, 30),
            abort_at=None,
        )
        for i in range(rng.randint(6, 14))
    ]
    return Workload(
        jobs=jobs,
        budget=rng.choice((8, 16, 32)),
        threshold=0,
        max_num_seqs=8,
        extra_blocks=rng.randint(0, 3),
        cpu_blocks=0,
    )


def test_stretches_equal_single_steps_under_recompute_preemption_with_cached_blocks() -> None:
    """Preempted requests wait with their blocks still cached (and evicted bit by bit)
    while the pool is full: stretches around them leave what single steps leave."""
    for seed in range(24, 40):
        w = _preempting_workload(seed)
        for block_size in (4, 16):
            cfg = ("chunked", "recompute", "hash", block_size)
            single = drive(w, cfg, "single")
            assert drive(w, cfg, "until") == single, (seed, block_size)
            assert drive(w, cfg, "feed") == single, (seed, block_size)


def _drive_cut(w: Workload, cfg: tuple, cut_seed: int | None) -> tuple:
    """Run ``w`` through ``Engine.run_stretch`` with stretches cut after 1–4 steps (drawn
    from ``cut_seed``), or step by step (``None``); each output's tokens and the step that
    sampled its first one, counted over the whole run."""
    config = workload_config(w, *cfg)
    need = largest_request_blocks(w, config.block_size)
    executor = PlannableExecutor(
        need + w.extra_blocks * 2, w.cpu_blocks, check_kv=False, step_duration_s=1.0
    )
    engine = Engine(config, executor, check_stretches=False)
    cuts = random.Random(cut_seed)
    pending = sorted(w.jobs, key=lambda j: j.arrive)
    samples: dict[tuple[str, int], list[tuple[int, int]]] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].arrive <= step:
            j = pending.pop(0)
            params = SamplingParams(max_tokens=j.max_tokens, n=j.n, ignore_eos=True)
            engine.add_request(j.rid, j.prompt, params)
        until = pending[0].arrive - 0.5 if pending else None
        stretch = None
        if cut_seed is not None:
            stretch = engine.run_stretch(step, until, max_steps=cuts.randint(1, 4))
        if stretch is None:
            outs = [(o, 0) for o in engine.step()] if engine.has_unfinished_requests() else []
            num_steps = 1
        else:
            outs, num_steps = stretch, len(engine.last_steps)
        for out, first in outs:
            got = samples.setdefault((out.request_id, out.index), [])
            got += [(step + first + k, t) for k, t in enumerate(out.new_token_ids)]
        step += num_steps
    return samples, engine.stats()["num_preemptions"]


def test_stretches_cut_anywhere_report_each_first_sample_at_its_step() -> None:
    """A stretch may end at any step (``max_steps``), also right after a recomputed
    request's last prompt chunk, before the step that samples its next token: each output
    still comes with the step that sampled it, as single steps give."""
    preempted = 0
    for seed in range(24, 40):
        w = _preempting_workload(seed)
        for block_size in (4, 16):
            cfg = ("chunked", "recompute", "hash", block_size)
            single, num_preemptions = _drive_cut(w, cfg, None)
            preempted += num_preemptions
            for cut_seed in range(3):
                assert _drive_cut(w, cfg, cut_seed)[0] == single, (seed, block_size, cut_seed)
    assert preempted > 0


@pytest.fixture
def applied_plans(monkeypatch: pytest.MonkeyPatch) -> list[StretchPlan]:
    """Every plan ``drive`` applies, in order."""
    plans: list[StretchPlan] = []
    apply = apply_stretch

    def collect(scheduler, plan, tokens):  # type: ignore[no-untyped-def]
        plans.append(plan)
        return apply(scheduler, plan, tokens)

    monkeypatch.setattr(sys.modules[__name__], "apply_stretch", collect)
    return plans


def test_steps_that_try_a_preempted_head_with_cached_blocks_are_planned(
    applied_plans: list[StretchPlan],
) -> None:
    """A recompute-preempted head waits with its blocks cached, so its lookup hits; while
    it cannot fit, the steps that try it are planned (its hit shrinking as allocations
    evict its blocks), and stretches still leave what single steps leave."""
    tried = hits = shrunk = 0
    for seed in range(24, 30):
        w = _preempting_workload(seed)
        cfg = ("chunked", "recompute", "hash", 4)
        single = drive(w, cfg, "single")
        applied_plans.clear()
        assert drive(w, cfg, "feed") == single, seed
        retries = [[s.retry for s in p.steps] for p in applied_plans]
        tried += sum(r is not None for steps in retries for r in steps)
        hits += sum(r is not None and r[0] > 0 for steps in retries for r in steps)
        shrunk += sum(
            a is not None and b is not None and b[0] < a[0]
            for steps in retries
            for a, b in itertools.pairwise(steps)
        )
    assert hits > 100 and shrunk > 20, (tried, hits, shrunk)


def test_a_preempted_head_that_fits_is_admitted_inside_a_stretch_with_its_hit(
    applied_plans: list[StretchPlan],
) -> None:
    """When a recompute-preempted head surely fits, its admission is planned: its lookup
    finds its own cached blocks (the planned hit, shrunk by the allocations before it),
    it starts from them, and stretches still leave what single steps leave."""
    readmitted = with_hit = 0
    for seed in range(24, 40):
        w = _preempting_workload(seed)
        for block_size in (4, 16):
            cfg = ("chunked", "recompute", "hash", block_size)
            single = drive(w, cfg, "single")
            applied_plans.clear()
            assert drive(w, cfg, "feed") == single, (seed, block_size)
            for plan in applied_plans:
                for member in plan.requests[plan.num_start :]:
                    if member.request.num_preemptions:
                        readmitted += 1
                        with_hit += member.start_computed > 0
    assert readmitted > 50 and with_hit > 20, (readmitted, with_hit)


def _shared_prefix_readmissions() -> Workload:
    """Twelve requests, nine of them on one 200-token prefix, in a pool that holds a
    few: recompute-preempted sharers wait with the prefix's blocks cached (a case
    hypothesis found: two such heads readmitted in one step, the first adopting blocks
    the second's lookup then finds held)."""
    rng = random.Random(3)
    base = [rng.randint(2, 4) for _ in range(200)]
    shape = [  # (prompt length, shares the prefix, max_tokens, arrival step)
        (235, True, 313, 0), (15, False, 348, 102), (177, False, 342, 266),
        (392, True, 148, 274), (364, True, 213, 241), (13, False, 215, 132),
        (302, True, 316, 242), (356, True, 121, 197), (261, True, 102, 166),
        (252, False, 252, 58), (246, True, 85, 274), (336, True, 1, 0),
    ]  # fmt: skip
    jobs = []
    for i, (length, shares, max_tokens, arrive) in enumerate(shape):
        head = base if shares else []
        prompt = head + [rng.randint(5, 9) for _ in range(length - len(head))]
        jobs.append(Job(f"r{i}", prompt, max_tokens, 1, arrive, None))
    return Workload(
        jobs=jobs, budget=55, threshold=32, max_num_seqs=4, extra_blocks=0, cpu_blocks=0
    )


def test_a_readmission_that_adopts_cached_blocks_ends_the_plan_of_later_lookups() -> None:
    w = _shared_prefix_readmissions()
    cfg = ("chunked", "recompute", "hash", 32)
    single = drive(w, cfg, "single", LARGE_MODEL_LEN)
    assert drive(w, cfg, "until", LARGE_MODEL_LEN) == single
    assert drive(w, cfg, "feed", LARGE_MODEL_LEN) == single


def _preemptions(plans: list[StretchPlan]) -> tuple[int, int, int, int]:
    """Planned preemptions (of prefilling requests, of aggregate decoders), and
    readmissions of the requests preempted (all, and those with a prefix-cache hit)."""
    prefilling = decoders = readmitted = with_hit = 0
    for plan in plans:
        for step in plan.steps:
            for _, i, _ in step.preempts or ():
                if plan.requests[i].agg_start:
                    decoders += 1
                else:
                    prefilling += 1
        for member in plan.requests:
            if member.next_stay >= 0:
                readmitted += 1
                with_hit += plan.requests[member.next_stay].start_computed > 0
    return prefilling, decoders, readmitted, with_hit


@pytest.mark.parametrize("caching", CACHING)
def test_steps_that_preempt_are_planned(caching: str, applied_plans: list[StretchPlan]) -> None:
    """A step whose running allocations do not all fit preempts from the tail, as
    ``Scheduler._make_room`` does: the planner plans it (prefilling victims and aggregate
    decoders alike; their blocks freed to the free queue's tail, they wait at
    its front) and the readmissions of the victims (no cache: from token 0; hash: from
    the hit of their own blocks left in the free queue; a tree's lookup ends the
    stretch), and stretches still leave what single steps leave. Without planned
    preemptions (each such step ends a stretch) the counts below are 0."""
    counts = [0, 0, 0, 0]
    for seed in range(24, 40):
        w = _preempting_workload(seed)
        for block_size in (4, 16):
            cfg = ("chunked", "recompute", caching, block_size)
            single = drive(w, cfg, "single")
            applied_plans.clear()
            assert drive(w, cfg, "until") == single, (seed, block_size)
            assert drive(w, cfg, "feed") == single, (seed, block_size)
            counts = [a + b for a, b in zip(counts, _preemptions(applied_plans), strict=True)]
    prefilling, decoders, readmitted, with_hit = counts
    assert prefilling > 50 and decoders > 20, counts
    if caching != "radix":
        assert readmitted > 100, counts
    if caching == "hash":
        assert with_hit > 20, counts


def test_checking_mode_passes_planned_preemptions_with_stop_tokens() -> None:
    """Through ``Engine.run_stretch`` in checking mode: preempting stretches replay step by
    step, also when a request's stop token comes before its preemption (the stretch is
    cut at the stop, which ends the request there instead)."""
    planned = 0
    for seed in range(24, 34):
        w = _preempting_workload(seed)
        config = workload_config(w, "chunked", "recompute", "hash", 4)
        need = largest_request_blocks(w, config.block_size)
        for fast in (False, True):
            engine = Engine(
                config,
                PlannableExecutor(need + w.extra_blocks * 2, 0, check_kv=False),
                check_stretches=fast,
            )
            for j in w.jobs:  # every third request stops at its 5th token
                stop = (token_for(j.rid, 0, len(j.prompt) + 4),) if int(j.rid[1:]) % 3 == 0 else ()
                params = SamplingParams(
                    max_tokens=j.max_tokens, stop_token_ids=stop, ignore_eos=True
                )
                engine.add_request(j.rid, j.prompt, params)
            outs: dict[str, list] = {}
            while engine.has_unfinished_requests():
                stretch = engine.run_stretch(0.0, None) if fast else None
                if stretch is None:
                    got = engine.step()
                else:
                    got = [o for o, _ in stretch]
                    planned += sum(s.num_preempted for s in engine.last_steps)
                for o in got:
                    outs.setdefault(o.request_id, []).append((o.new_token_ids, o.finish_reason))
            result = (
                {k: [t for ts, _ in v for t in ts] for k, v in outs.items()},
                {k: v[-1][1] for k, v in outs.items()},
                engine.stats()["num_preemptions"],
            )
            if not fast:
                single = result
        assert result == single, seed
    assert planned > 20, planned


def test_hybrid_preemptions_below_the_swap_threshold_are_planned(
    applied_plans: list[StretchPlan],
) -> None:
    """Under hybrid preemption a victim below the swap threshold is recomputed, as under
    recompute: the planner plans that step; one at or above it would be swapped out, which
    ends the stretch. Stretches still leave what single steps leave, swaps included."""
    planned = swapped = 0
    threshold = 24
    for seed in range(24, 40):
        w = replace(_preempting_workload(seed), cpu_blocks=40, swap_threshold=threshold)
        for block_size in (4, 16):
            cfg = ("chunked", "hybrid", "hash", block_size)
            single = drive(w, cfg, "single")
            applied_plans.clear()
            assert drive(w, cfg, "feed") == single, (seed, block_size)
            computed = [c for p in applied_plans for s in p.steps for _, _, c in s.preempts or ()]
            assert all(c < threshold for c in computed), (seed, computed)
            planned += len(computed)
            swapped += single[2]["num_swap_outs"]
    assert planned > 50 and swapped > 10, (planned, swapped)
