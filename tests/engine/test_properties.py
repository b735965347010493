"""Property-based runs: random workloads through every engine configuration.

Every step must keep the scheduler's and KV cache's invariants; every request that is not
aborted must end with exactly ``max_tokens`` tokens, the same ones whatever the
configuration (the deterministic executor makes tokens a function of request and
position, and checks the KV of every scheduled token); at the end every block is free.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from slotune.engine import Engine, EngineConfig, SamplingParams
from tests.engine.deterministic import (
    DeterministicExecutor,
    DraftingExecutor,
    PricedExecutor,
    token_for,
)
from tests.engine.invariants import QueueSnapshot, check_all, check_drained

MAX_MODEL_LEN = 64
BLOCK_SIZES = (1, 4, 16)
POLICIES = ("chunked", "prefill_first")
PREEMPTION = ("recompute", "swap", "hybrid")
CACHING = ("none", "hash", "radix")
SCHEDULING = (
    "fcfs",
    "priority",
    "fcfs-tiers",
    "priority-tiers",
    "fcfs-budget",
    "priority-tiers-budget",
    "fcfs-adaptive",
    "priority-tiers-adaptive",
)
ALL_CONFIGS = list(itertools.product(POLICIES, PREEMPTION, CACHING, BLOCK_SIZES, SCHEDULING))
# the slow test runs every configuration on each example: the scheduling modes on one
# cache and block size (they do not touch the cache), everything else in full
SLOW_CONFIGS = [
    *itertools.product(POLICIES, PREEMPTION, CACHING, BLOCK_SIZES, SCHEDULING[:1]),
    *itertools.product(POLICIES, PREEMPTION, ("hash",), (4,), SCHEDULING[1:]),
]


@dataclass(frozen=True)
class Job:
    rid: str
    prompt: list[int]
    max_tokens: int
    n: int
    arrive: int
    abort_at: int | None
    priority: int = 0
    tier: int = 0


@dataclass(frozen=True)
class Workload:
    jobs: list[Job]
    budget: int
    threshold: int
    max_num_seqs: int
    extra_blocks: int
    cpu_blocks: int
    swap_threshold: int = 8
    kv_share: float = 0.0  # of tier 0, in the tiered configurations
    token_share: float = 0.0
    decode_budget_ms: float = 15.0  # in the budget configurations (steps take 10 ms)
    adaptive_chunk_ms: float = 8.0  # in the adaptive ones (chunked only; 1 + 0.5 ms a token)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    bases = draw(st.lists(st.lists(st.integers(2, 4), max_size=24), min_size=1, max_size=3))
    jobs = []
    for i in range(draw(st.integers(1, 9))):
        base = draw(st.sampled_from(bases))
        suffix = draw(st.lists(st.integers(2, 9), min_size=0 if base else 1, max_size=20))
        aborted = draw(st.integers(0, 5)) == 0
        jobs.append(
            Job(
                rid=f"r{i}",
                prompt=base + suffix,
                max_tokens=draw(st.integers(1, 16)),
                n=draw(st.sampled_from((1, 1, 1, 2, 3))),
                arrive=draw(st.integers(0, 6)),
                abort_at=draw(st.integers(0, 12)) if aborted else None,
                priority=draw(st.integers(-1, 2)),
                tier=draw(st.sampled_from((0, 1, 1, 2))),
            )
        )
    return Workload(
        jobs=jobs,
        budget=draw(st.integers(4, 48)),
        threshold=draw(st.sampled_from((0, 0, 3, 8))),
        max_num_seqs=draw(st.integers(3, 8)),
        extra_blocks=draw(st.integers(0, 6)),
        cpu_blocks=draw(st.integers(0, 10)),
        swap_threshold=draw(st.integers(1, 40)),
        kv_share=draw(st.sampled_from((0.0, 0.25, 0.5, 0.75))),
        token_share=draw(st.sampled_from((0.0, 0.25, 0.5, 0.9))),
        decode_budget_ms=draw(st.sampled_from((5.0, 15.0, 45.0))),
        adaptive_chunk_ms=draw(st.sampled_from((2.0, 8.0, 20.0))),
    )


def tier_shares(
    w: Workload, scheduling: str, budget: int, num_blocks: int, need: int, prefill_first: bool
) -> dict:
    """The tier fields of a configuration: the workload's shares, cut where they would
    leave a lower-tier request no room (``need`` blocks, or a whole prompt under
    prefill-first, whose budget is over ``MAX_MODEL_LEN``); the token share stays on when
    both are cut."""
    if "tiers" not in scheduling:
        return {}
    kv = w.kv_share
    if int(num_blocks * (1 - kv)) < need:
        kv = 0.0
    token = w.token_share
    floor = MAX_MODEL_LEN if prefill_first else 1
    if int(budget * (1 - token)) < floor:
        token = 0.0
    if kv == 0 and token == 0:
        token = 1 / (2 * budget)  # one token of the budget
        if int(budget * (1 - token)) < floor:
            return {}
    return {"top_tier_kv_share": kv, "top_tier_token_share": token}


def workload_config(
    w: Workload,
    policy: str,
    preemption: str,
    caching: str,
    block_size: int,
    scheduling: str = "fcfs",
    num_blocks: int = 0,
) -> EngineConfig:
    """The engine configuration ``cfg`` (one of ``ALL_CONFIGS``) runs workload ``w`` with."""
    chunked = policy == "chunked"
    budget = w.budget if chunked else MAX_MODEL_LEN + w.budget
    need = largest_request_blocks(w, block_size)
    return EngineConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=w.threshold if chunked else 0,
        block_size=block_size,
        max_num_seqs=w.max_num_seqs,
        max_model_len=MAX_MODEL_LEN,
        preemption_mode=preemption,  # type: ignore[arg-type]
        prefix_caching=caching,  # type: ignore[arg-type]
        policy=policy,  # type: ignore[arg-type]
        scheduling_policy=scheduling.split("-")[0],  # type: ignore[arg-type]
        swap_threshold_tokens=w.swap_threshold,
        decode_budget_ms=w.decode_budget_ms if "budget" in scheduling else 0.0,
        adaptive_chunk_ms=w.adaptive_chunk_ms if chunked and "adaptive" in scheduling else 0.0,
        **tier_shares(w, scheduling, budget, num_blocks, need, not chunked),
    )


def largest_request_blocks(w: Workload, block_size: int) -> int:
    """The blocks the largest single request needs: it must fit alone."""
    return max(-(-(len(j.prompt) + j.max_tokens) // block_size) for j in w.jobs)


def run(
    w: Workload,
    policy: str,
    preemption: str,
    caching: str,
    block_size: int,
    scheduling: str,
    num_speculative_tokens: int = 0,
) -> tuple[dict[tuple[str, int], list[int]], Engine]:
    """``num_speculative_tokens`` > 0: the executor drafts, partly wrong (``DraftingExecutor``)."""
    # The largest single request must fit alone; anything more is contention.
    need = largest_request_blocks(w, block_size)
    num_blocks = need + w.extra_blocks * max(1, 8 // block_size)
    config = workload_config(w, policy, preemption, caching, block_size, scheduling, num_blocks)
    config = replace(config, num_speculative_tokens=num_speculative_tokens)
    kind = DraftingExecutor if num_speculative_tokens else DeterministicExecutor
    if config.adaptive_chunk_ms and not num_speculative_tokens:
        kind = PricedExecutor
    executor = kind(num_blocks, w.cpu_blocks)
    engine = Engine(config, executor)
    tokens: dict[tuple[str, int], list[int]] = {}
    finished: dict[tuple[str, int], str] = {}
    step = 0
    while step <= max(j.arrive for j in w.jobs) or engine.has_unfinished_requests():
        for j in w.jobs:
            if j.arrive == step:
                params = SamplingParams(max_tokens=j.max_tokens, n=j.n, ignore_eos=True)
                engine.add_request(
                    j.rid, j.prompt, params, float(step), priority=j.priority, tier=j.tier
                )
            if j.abort_at == step:
                engine.abort_request(j.rid)
        if engine.has_unfinished_requests():
            before = len(executor.outputs)
            queues = QueueSnapshot(engine)
            for out in engine.step():
                key = (out.request_id, out.index)
                assert key not in finished, f"{key} produced a token after finishing"
                tokens.setdefault(key, []).extend(out.new_token_ids)
                if out.finished:
                    finished[key] = out.finish_reason  # type: ignore[assignment]
            so = executor.outputs[-1] if len(executor.outputs) > before else None
            check_all(engine, so)
            if so is not None:
                queues.check(engine, so)
        step += 1
        assert step < 5_000, "no progress"
    check_drained(engine)
    stats = engine.stats()
    for key in (
        "num_preemptions",
        "num_swap_outs",
        "num_recomputed_tokens",
        "num_copy_on_write",
        "prefix_cache_hit_tokens",
    ):
        if stats[key]:
            event(key)
    for j in w.jobs:
        for index in range(j.n):
            got = tokens.get((j.rid, index), [])
            want = [token_for(j.rid, index, len(j.prompt) + k) for k in range(j.max_tokens)]
            if j.abort_at is None:
                assert got == want, (j, index)
                assert finished[(j.rid, index)] == "length"
            else:
                assert got == want[: len(got)], (j, index)
    return tokens, engine


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_every_configuration_keeps_invariants_and_results(w: Workload) -> None:
    reference: dict[tuple[str, int], list[int]] | None = None
    completed = {j.rid for j in w.jobs if j.abort_at is None}
    for cfg in SLOW_CONFIGS:
        tokens, _ = run(w, *cfg)
        tokens = {k: v for k, v in tokens.items() if k[0] in completed}
        if reference is None:
            reference = tokens
        assert tokens == reference, cfg


@settings(max_examples=150, deadline=None)
@given(workloads(), st.sampled_from(ALL_CONFIGS))
def test_tiny_pools_preempt_and_still_finish(w: Workload, cfg: tuple) -> None:
    tiny = replace(w, extra_blocks=0)
    run(tiny, *cfg)


@settings(max_examples=100, deadline=None)
@given(workloads(), st.sampled_from(ALL_CONFIGS), st.integers(2, 12))
def test_requests_that_outgrow_the_pool_end_early_without_hanging(
    w: Workload, cfg: tuple, num_blocks: int
) -> None:
    policy, preemption, caching, block_size, scheduling = cfg
    budget = w.budget if policy == "chunked" else MAX_MODEL_LEN
    gpu_blocks = max(1, num_blocks * 4 // block_size)
    tiers = tier_shares(w, scheduling, budget, gpu_blocks, 1, policy != "chunked")
    config = EngineConfig(
        max_num_batched_tokens=budget,
        block_size=block_size,
        max_num_seqs=w.max_num_seqs,
        max_model_len=MAX_MODEL_LEN,
        preemption_mode=preemption,
        prefix_caching=caching,
        policy=policy,
        scheduling_policy=scheduling.split("-")[0],  # type: ignore[arg-type]
        swap_threshold_tokens=w.swap_threshold,
        decode_budget_ms=w.decode_budget_ms if "budget" in scheduling else 0.0,
        adaptive_chunk_ms=5.0 if policy == "chunked" and "adaptive" in scheduling else 0.0,
        **tiers,
    )
    executor = DeterministicExecutor(gpu_blocks, w.cpu_blocks)
    engine = Engine(config, executor)
    accepted = []
    for j in w.jobs:
        try:
            params = SamplingParams(max_tokens=j.max_tokens, n=j.n)
            engine.add_request(j.rid, j.prompt, params, priority=j.priority, tier=j.tier)
            accepted.append(j)
        except ValueError as err:
            assert "KV blocks" in str(err)
    tokens: dict[tuple[str, int], list[int]] = {}
    reasons: dict[tuple[str, int], str | None] = {}
    for _ in range(3_000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            tokens.setdefault((out.request_id, out.index), []).extend(out.new_token_ids)
            if out.finished:
                reasons[(out.request_id, out.index)] = out.finish_reason
        check_all(engine, None)
    check_drained(engine)
    for j in accepted:
        for index in range(j.n):
            got = tokens.get((j.rid, index), [])
            want = [token_for(j.rid, index, len(j.prompt) + k) for k in range(j.max_tokens)]
            assert got == want[: len(got)]
            if index == 0 or got:
                assert reasons[(j.rid, index)] == "length"
