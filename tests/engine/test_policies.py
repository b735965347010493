"""Priority scheduling and hybrid preemption, on small hand-made cases and references."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine.queues import BudgetWatch, PriorityWaiting
from slotune.engine.request import Request, RequestStatus
from slotune.engine.rules import earns_priority, queue_key
from tests.engine.deterministic import DeterministicExecutor
from tests.engine.invariants import check_all, check_drained


def _req(rid: str, priority: int, arrival: float) -> Request:
    return Request(rid, [2, 3], SamplingParams(), arrival_time=arrival, priority=priority)


def test_priority_queue_matches_a_sorted_reference() -> None:
    rng = random.Random(7)
    queue = PriorityWaiting(queue_key(by_priority=True, tiered=False))  # type: ignore[arg-type]
    reference: list[tuple[tuple[int, float], int, Request]] = []  # (rank, first put in, req)
    first_in: dict[str, int] = {}
    popped: list[Request] = []
    for step in range(2_000):
        op = rng.random()
        if op < 0.5 or not reference:
            if popped and op < 0.1:  # a preempted request comes back: its old place
                req = popped.pop(rng.randrange(len(popped)))
                queue.appendleft(req)
            else:
                req = _req(f"r{step}", rng.randint(-2, 3), float(rng.randint(0, 20)))
                queue.append(req)
            first_in.setdefault(req.request_id, len(first_in))
            reference.append(((req.priority, req.arrival_time), first_in[req.request_id], req))
        elif op < 0.8:
            reference.sort(key=lambda e: (e[0], e[1]))
            assert queue[0] is reference[0][2]
            popped.append(queue.popleft())
            assert popped[-1] is reference.pop(0)[2]
        else:
            victim = reference.pop(rng.randrange(len(reference)))[2]
            queue.remove(victim)
        reference.sort(key=lambda e: (e[0], e[1]))
        assert len(queue) == len(reference)
        assert list(queue) == [e[2] for e in reference]


def _budget_scenario(seed: int, watched: bool) -> list[tuple[str, bool]]:
    """A decode-budget queue through random arrivals, preemptions and admissions; between
    steps the requests that earned priority move ahead, found by ``BudgetWatch`` or (the
    reference) by walking the whole queue. Returns what leaves the queue, in order."""
    rng = random.Random(seed)
    budget_s = 0.05
    queue = PriorityWaiting(queue_key(by_priority=True, tiered=False, budgeted=True))  # type: ignore[arg-type]
    watch = BudgetWatch()
    running: list[Request] = []
    left: list[tuple[str, bool]] = []
    now = 0.0
    for step in range(1_500):
        op = rng.random()
        if op < 0.3:
            req = _req(f"r{step}", rng.randint(0, 2), now)
            if rng.random() < 0.1:  # joins with output (a resumed request)
                req.append_output_token(5)
            queue.append(req)
            if req.output_token_ids:
                watch.add(req)
        elif op < 0.55 and running:
            victim = running.pop(rng.randrange(len(running)))
            victim.preempted_at = now
            victim.status = RequestStatus.PREEMPTED
            if rng.random() < 0.8:
                victim.append_output_token(7)
            queue.appendleft(victim)
            watch.add(victim)
        elif queue:
            req = queue.popleft()
            req.status = RequestStatus.RUNNING
            running.append(req)
            left.append((req.request_id, req.boosted))
        now += rng.choice((0.004, 0.02, 0.05))
        if watched:
            due = watch.due(now, budget_s)
        else:
            due = [r for r in queue if earns_priority(r, now, budget_s)]
        queue.requeue(due, lambda r: setattr(r, "boosted", True))
    return left


@pytest.mark.parametrize("seed", range(4))
def test_the_budget_watch_boosts_what_walking_the_queue_boosts(seed: int) -> None:
    left = _budget_scenario(seed, watched=True)
    assert sum(boosted for _, boosted in left) > 20  # the budget acts in this scenario
    assert left == _budget_scenario(seed, watched=False)


def _engine(
    config: EngineConfig, gpu_blocks: int, cpu_blocks: int = 0, check: bool = False
) -> Engine:
    return Engine(config, DeterministicExecutor(gpu_blocks, cpu_blocks), check_stretches=check)


def _first_token_order(engine: Engine) -> list[str]:
    order: list[str] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id not in order:
                order.append(out.request_id)
        check_all(engine, None)
    check_drained(engine)
    return order


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_one_seat_serves_requests_in_priority_then_arrival_order(policy: str) -> None:
    config = EngineConfig(max_num_seqs=1, block_size=4, scheduling_policy=policy)  # type: ignore[arg-type]
    engine = _engine(config, 64)
    rng = random.Random(3)
    jobs = [(f"r{i}", rng.randint(0, 3), float(rng.randint(0, 5))) for i in range(12)]
    for rid, priority, arrival in jobs:
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        engine.add_request(rid, [5, 6, 7], params, arrival, priority=priority)
    order = _first_token_order(engine)
    if policy == "priority":
        want = [rid for rid, _, _ in sorted(jobs, key=lambda j: (j[1], j[2]))]  # stable
    else:
        want = [rid for rid, _, _ in jobs]
    assert order == want


def test_priority_preempts_the_lowest_priority_latest_request() -> None:
    # three requests fill the pool; growing needs one victim: the lowest priority
    # (highest value), among equals the latest arrival, whatever the admission order
    config = EngineConfig(block_size=4, scheduling_policy="priority")
    engine = _engine(config, 6)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    engine.add_request("urgent", [2] * 4, params, 2.0, priority=0)
    engine.add_request("late-low", [2] * 4, params, 1.0, priority=5)
    engine.add_request("early-low", [2] * 4, params, 0.0, priority=5)
    preempted: list[str] = []
    while engine.has_unfinished_requests():
        engine.step()
        preempted += engine.executor.outputs[-1].preempted_request_ids  # type: ignore[attr-defined]
    assert preempted and preempted[0] == "late-low"


def _hybrid_run(first: str, cpu_blocks: int, mode: str = "hybrid") -> dict:
    """A long (12-token) and a short (4-token) prompt that cannot both finish in the pool;
    the one admitted second is preempted."""
    config = EngineConfig(block_size=4, preemption_mode=mode, swap_threshold_tokens=10)  # type: ignore[arg-type]
    engine = _engine(config, 7, cpu_blocks)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    prompts = {"long": [3] * 12, "short": [4] * 4}
    second = "short" if first == "long" else "long"
    for rid in (first, second):
        engine.add_request(rid, prompts[rid], params)
    _first_token_order(engine)
    return engine.stats()


def test_hybrid_recomputes_short_victims_and_swaps_long_ones() -> None:
    short_victim = _hybrid_run("long", cpu_blocks=16)
    assert short_victim["num_preemptions"] > 0
    assert short_victim["num_swap_outs"] == 0 and short_victim["num_recomputed_tokens"] > 0
    long_victim = _hybrid_run("short", cpu_blocks=16)
    assert long_victim["num_swap_outs"] > 0 and long_victim["num_swapped_tokens"] >= 12
    assert long_victim["num_recomputed_tokens"] == 0
    no_room = _hybrid_run("short", cpu_blocks=2)  # the CPU pool cannot hold it: recompute
    assert no_room["num_swap_outs"] == 0 and no_room["num_recomputed_tokens"] >= 12
    swap_only = _hybrid_run("long", cpu_blocks=16, mode="swap")
    assert swap_only["num_swap_outs"] > 0 and swap_only["num_recomputed_tokens"] == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"preemption_mode": "hybrid", "swap_space_gb": 0}, "swap_space_gb"),
        ({"swap_threshold_tokens": 0}, "swap_threshold_tokens"),
        ({"swap_threshold_tokens": 1.5}, "swap_threshold_tokens: must be an integer"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy: must be one of"),
    ],
)
def test_bad_policy_fields_are_refused_clearly(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**fields)


def test_bad_priority_or_tier_is_refused() -> None:
    engine = _engine(EngineConfig(), 64)
    with pytest.raises(ValueError, match="priority must be an integer"):
        engine.add_request("a", [2], priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tier must be >= 0"):
        engine.add_request("b", [2], tier=-1)


def _tier_run(config: EngineConfig, gpu_blocks: int) -> tuple[list[str], Engine]:
    engine = _engine(config, gpu_blocks)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    engine.add_request("free", [2] * 4, params, 0.0, tier=1)
    engine.add_request("pro", [3] * 4, params, 1.0, tier=0)
    engine.add_request("free-late", [4] * 4, params, 2.0, tier=1)
    preempted: list[str] = []
    while engine.has_unfinished_requests():
        engine.step()
        check_all(engine, None)
        preempted += engine.executor.outputs[-1].preempted_request_ids  # type: ignore[attr-defined]
    check_drained(engine)
    return preempted, engine


def test_lower_tiers_are_preempted_first_and_keep_to_their_share() -> None:
    plain, _ = _tier_run(EngineConfig(block_size=4), 6)
    assert plain[0] == "free-late"  # FCFS: the last admitted
    config = EngineConfig(block_size=4, top_tier_token_share=0.5, max_num_batched_tokens=8)
    tiered, engine = _tier_run(config, 6)
    assert tiered and all(rid.startswith("free") for rid in tiered)
    first = engine.executor.outputs[0]  # type: ignore[attr-defined]
    assert list(first.num_scheduled_tokens) == ["pro", "free"]  # tier 0 first, 4 tokens each
    kv_config = EngineConfig(block_size=4, top_tier_kv_share=0.5)
    _, engine = _tier_run(kv_config, 8)
    assert engine.kv_cache.lower_tier_blocks == 4


def test_tier_shares_are_validated() -> None:
    with pytest.raises(ValueError, match="top_tier_kv_share: must be in"):
        EngineConfig(top_tier_kv_share=1.0)
    with pytest.raises(ValueError, match="top_tier_token_share: leaves the lower tiers no"):
        EngineConfig(max_num_batched_tokens=4, top_tier_token_share=0.9)
    with pytest.raises(ValueError, match="max_model_len tokens per step"):
        EngineConfig(
            policy="prefill_first",
            max_num_batched_tokens=8192,
            max_model_len=8192,
            top_tier_token_share=0.1,
        )
    with pytest.raises(ValueError, match="leaves the lower tiers none"):
        _engine(EngineConfig(top_tier_kv_share=0.9), 5)
    engine = _engine(EngineConfig(block_size=4, top_tier_kv_share=0.5), 8)
    engine.add_request("pro", [2] * 30, tier=0)  # 8 blocks: the whole pool is tier 0's
    with pytest.raises(ValueError, match="tier 1 may hold only 4"):
        engine.add_request("free", [2] * 30, tier=1)


def test_the_simulator_gives_hybrid_a_cpu_pool() -> None:
    for mode, has_pool in (("recompute", False), ("swap", True), ("hybrid", True)):
        config = EngineConfig(preemption_mode=mode)  # type: ignore[arg-type]
        engine = Engine.simulated(config, gpu="a100-80g", model="llama-2-7b")
        assert (engine.capacity.num_cpu_blocks > 0) is has_pool, mode


def _finish_steps(config: EngineConfig, check: bool = False) -> tuple[dict[str, int], Engine]:
    """``low`` runs first; urgent requests then arrive one a step, more than the pool
    holds next to it, so it is preempted and, without a budget, passed over."""
    engine = _engine(config, 8, check=check)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    engine.add_request("low", [2] * 4, params, 0.0, priority=5)
    done: dict[str, int] = {}
    step = 0
    while engine.has_unfinished_requests():
        if step < 10:
            engine.add_request(f"hi{step}", [3 + step] * 4, params, 1.0 + step, priority=0)
        for out in engine.step():
            if out.finished:
                done[out.request_id] = step
        check_all(engine, None)
        step += 1
    check_drained(engine)
    return done, engine


def test_decode_budget_lets_a_starved_preempted_request_go_first() -> None:
    base = EngineConfig(block_size=4, scheduling_policy="priority", max_num_batched_tokens=64)
    plain, engine = _finish_steps(base)
    assert engine.stats()["num_preemptions"] > 0
    assert plain["low"] > plain["hi2"] and plain["low"] >= plain["hi8"]  # passed over
    budgeted, _ = _finish_steps(replace(base, decode_budget_ms=15.0))  # steps take 10 ms
    assert budgeted["low"] < budgeted["hi2"]  # back ahead of urgent requests queued
    assert budgeted["low"] < plain["low"]
    # the checking shadow scheduler keeps the engine's clock: the same boosts, no mismatch
    checked, _ = _finish_steps(replace(base, decode_budget_ms=15.0), check=True)
    assert checked == budgeted
    with pytest.raises(ValueError, match="decode_budget_ms: must be 0"):
        EngineConfig(decode_budget_ms=-1.0)
