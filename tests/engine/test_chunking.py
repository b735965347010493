"""SLO-aware adaptive chunking: the budget rule against a linear scan, the fitted step-time
model, and the budget the scheduler uses step by step (real-engine and simulator paths)."""

from __future__ import annotations

import itertools
import random

import pytest

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine.chunking import MeasuredStepTime, adaptive_budget
from slotune.engine.rules import is_decoder
from slotune.engine.stretch.planner import untested_config
from tests.engine.deterministic import DeterministicExecutor, PricedExecutor
from tests.engine.invariants import check_all, check_drained


def _linear(fixed: float, per_token: float, per_ctx: float):  # type: ignore[no-untyped-def]
    def step_time(d: int, ctx: int, p: int, prior: int = 0) -> float:
        return fixed + per_token * (d + p) + per_ctx * ctx + (1e-4 if p else 0.0)

    return step_time


def _scan(target: float, step_time, d: int, ctx: int, ceiling: int) -> int:  # type: ignore[no-untyped-def]
    """The reference: the largest budget, tried one by one."""
    if d == 0:
        return ceiling
    best = min(d, ceiling)
    for b in range(min(d, ceiling), ceiling + 1):
        if b == d or step_time(d, ctx, b - d, 0) <= target:
            best = b
    return best


def _padded(fixed: float, per_tile: float, tile: int):  # type: ignore[no-untyped-def]
    """Flat between multiples of ``tile`` tokens: budgets that tie."""

    def step_time(d: int, ctx: int, p: int, prior: int = 0) -> float:
        return fixed + per_tile * -(-(d + p) // tile)

    return step_time


def test_adaptive_budget_matches_a_linear_scan_from_wherever_it_starts() -> None:
    """The search from a nearby budget (the last step's) finds what a scan finds, from
    any start, on steps priced linearly and in flat tiles."""
    rng = random.Random(3)
    for k in range(600):
        if k % 2:
            step_time = _linear(rng.uniform(0, 0.02), rng.uniform(1e-6, 1e-4), rng.uniform(0, 1e-7))
        else:
            step_time = _padded(rng.uniform(0, 0.02), rng.uniform(1e-5, 1e-3), rng.choice([8, 64]))
        d, ctx = rng.randint(0, 40), rng.randint(0, 50_000)
        ceiling = rng.randint(1, 600)
        target = rng.uniform(0.001, 0.05)
        want = _scan(target, step_time, d, ctx, ceiling)
        assert adaptive_budget(target, step_time, d, ctx, ceiling) == want
        for near in (want, want + 1, want - 1, rng.randint(-5, ceiling + 5)):
            assert adaptive_budget(target, step_time, d, ctx, ceiling, near=near) == want


def test_the_simulators_step_grows_with_its_prefill_tokens() -> None:
    """The budget search assumes it (``adaptive_budget``): the cost model's step of the
    same decodes never gets cheaper with more prefill tokens, over graph sizes, the switch
    to eager steps and prior context, on a few shipped GPUs and models; and the search
    from any start agrees with the one from none."""
    from slotune.engine.sim.executor import SimExecutor

    rng = random.Random(7)
    for gpu, model, tp in (("a100-80g", "llama-2-7b", 1), ("h100", "mixtral-8x7b", 2)):
        step_time = SimExecutor(gpu, model, tp).step_time
        for _ in range(6):
            d = rng.choice([1, 7, 64, 221])
            ctx, prior = d * rng.randint(50, 4000), rng.choice([0, 500, 3000])
            prices = [step_time(d, ctx, p, prior) for p in range(1, 4097)]
            assert all(a <= b for a, b in itertools.pairwise(prices))
            target = rng.choice(prices)
            want = adaptive_budget(target, step_time, d, ctx, 4096, prior)
            for near in (want - 3, want + 40, rng.randint(1, 4096)):
                assert adaptive_budget(target, step_time, d, ctx, 4096, prior, near) == want


def test_measured_step_time_recovers_a_linear_model() -> None:
    model = MeasuredStepTime()
    assert model(3, 100, 10, 0) == 0.0  # nothing seen yet: every step gets the ceiling
    rng = random.Random(1)
    for _ in range(20):
        tokens, ctx = rng.randint(1, 500), rng.randint(0, 9000)
        model.observe(tokens, ctx, 0.004 + 2e-5 * tokens + 3e-7 * ctx)
    assert model(4, 2000, 96, 0) == pytest.approx(0.004 + 2e-5 * 100 + 3e-7 * 2000)
    # noisy steps whose fit would fall with more tokens or context: never cheaper
    noisy = MeasuredStepTime()
    for tokens, ctx, seconds in ((10, 5000, 0.02), (200, 100, 0.012), (50, 3000, 0.015)):
        noisy.observe(tokens, ctx, seconds)
    for d in range(1, 6):
        assert 0 < noisy(d, 0, 10, 0) <= noisy(d, 0, 100, 0) <= noisy(d, 9000, 100, 0)
    steep = MeasuredStepTime()  # an intercept below 0: fitted through the origin instead
    for tokens, seconds in ((10, 0.001), (100, 0.02), (200, 0.041)):
        steep.observe(tokens, 0, seconds)
    assert steep(1, 0, 0, 0) > 0


def _drive(engine: Engine, budgets: list[tuple[int, int]]) -> None:
    rng = random.Random(5)
    for i in range(12):
        prompt = [rng.randint(2, 90) for _ in range(rng.randint(20, 120))]
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=rng.randint(4, 30)))
    while engine.has_unfinished_requests():
        decodes = sum(1 for r in engine.scheduler.running if is_decoder(r))
        executor = engine.executor
        assert isinstance(executor, DeterministicExecutor)
        before = len(executor.outputs)
        engine.step()
        so = executor.outputs[-1] if len(executor.outputs) > before else None
        check_all(engine, so)
        if so is not None:
            assert so.total_num_scheduled_tokens <= so.token_budget
            budgets.append((decodes, so.token_budget))
    check_drained(engine)


def test_the_scheduler_fills_each_step_up_to_the_tpot_target() -> None:
    config = EngineConfig(
        max_num_batched_tokens=256, max_model_len=512, block_size=4, adaptive_chunk_ms=12.0
    )
    engine = Engine(config, PricedExecutor(400), check_stretches=True)
    budgets: list[tuple[int, int]] = []
    _drive(engine, budgets)
    # 1 ms + 0.5 ms a token within 12 ms: 22 tokens while anything decodes, else 256
    assert any(d == 0 for d, _ in budgets) and any(d > 0 for d, _ in budgets)
    for decodes, budget in budgets:
        assert budget == (256 if decodes == 0 else max(22, decodes))


def test_the_real_engine_path_learns_its_step_time() -> None:
    """Without an executor model the engine fits the steps it ran (steps of 10 ms here:
    a 5 ms target leaves only the decodes, a 15 ms one the whole budget)."""
    for target, expect_full in ((5.0, False), (15.0, True)):
        config = EngineConfig(
            max_num_batched_tokens=64, max_model_len=512, block_size=4, adaptive_chunk_ms=target
        )
        engine = Engine(config, DeterministicExecutor(400), check_stretches=False)
        budgets: list[tuple[int, int]] = []
        _drive(engine, budgets)
        if expect_full:
            assert all(budget == 64 for _, budget in budgets)
            continue
        # once the fit has seen steps of two sizes, a decode step takes only the decodes
        first = next(i for i, (d, b) in enumerate(budgets) if 0 < d == b)
        assert all(b == (64 if d == 0 else d) for d, b in budgets[first:])
        assert any(d > 0 for d, _ in budgets[first + 1 :])


def test_adaptive_chunking_is_refused_where_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="adaptive_chunk_ms"):
        EngineConfig(adaptive_chunk_ms=-1)
    with pytest.raises(ValueError, match="prefill_first"):
        EngineConfig(policy="prefill_first", adaptive_chunk_ms=30.0)
    assert untested_config(EngineConfig()) is None


def test_the_simulator_keeps_decode_steps_near_the_target() -> None:
    """On a simulated H100, long prompts arriving while others decode: with a fixed 8192
    budget some decode-carrying steps run far past 30 ms; with adaptive chunking at 30 ms
    none passes it by more than 1 % (the estimate prices one prefill chunk after the first
    prefilling request's context: several chunks in a step may run a little over)."""

    def longest_decode_step(config: EngineConfig) -> float:
        engine = Engine.simulated(config, gpu="h100", model="llama-3-8b")
        rng = random.Random(2)
        for i in range(24):
            prompt = [rng.randint(2, 30_000) for _ in range(rng.randint(3000, 6000))]
            engine.add_request(
                f"r{i}", prompt, SamplingParams(max_tokens=64, ignore_eos=True), i * 0.05
            )
        worst = 0.0
        while engine.has_unfinished_requests():
            decodes = any(is_decoder(r) for r in engine.scheduler.running)
            engine.step()
            if decodes and engine.last_step is not None:
                worst = max(worst, engine.last_step.duration_s)
        return worst

    base = EngineConfig(max_num_batched_tokens=8192, prefix_caching="none")
    assert longest_decode_step(base) > 0.2
    assert (
        longest_decode_step(EngineConfig(**{**base.to_dict(), "adaptive_chunk_ms": 30.0})) < 0.0303
    )


def test_the_torch_engine_fits_its_own_steps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The real engine (a tiny checkpoint on CPU) prices steps with the fit to the steps it
    ran: at a 1 µs target, once fitted, a step with decodes takes only them; the tokens
    are those of a run with a fixed budget."""
    from slotune.engine.model.init_model import init_model

    model = str(init_model(tmp_path / "tiny", preset="tiny", seed=0))
    prompts = [[(7 * i + j) % 200 + 3 for j in range(24 + 5 * i)] for i in range(4)]

    def run(adaptive_ms: float) -> tuple[dict[str, list[int]], list[tuple[int, int, bool]]]:
        config = EngineConfig(
            max_num_batched_tokens=32, max_model_len=256, adaptive_chunk_ms=adaptive_ms
        )
        engine = Engine.local(config, model=model, device="cpu")
        for i, prompt in enumerate(prompts):
            engine.add_request(
                f"r{i}", prompt, SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0)
            )
        tokens: dict[str, list[int]] = {}
        budgets = []
        while engine.has_unfinished_requests():
            decodes = sum(1 for r in engine.scheduler.running if is_decoder(r))
            fitted = engine._measured is not None and engine._measured(1, 0, 1, 0) > 1e-6
            budgets.append((decodes, engine.scheduler.step_budget(), fitted))
            for out in engine.step():
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        return tokens, budgets

    fixed, _ = run(0.0)
    adaptive, budgets = run(0.001)
    assert adaptive == fixed and all(len(t) == 6 for t in fixed.values())
    fitted = [(d, b) for d, b, ok in budgets if ok and d]
    assert fitted and all(b == d for d, b in fitted)
