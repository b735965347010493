"""Speculative decoding in the simulator: the acceptance model, the price of a verifying
step, and simulated runs that are reproducible and emit the same tokens as without."""

from __future__ import annotations

import random

import pytest

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine.sim import SimExecutor
from slotune.engine.sim.speculative import (
    crossover_batch_size,
    decode_step_seconds,
    draw_accepted,
    expected_tokens_per_step,
    speculation_curve,
)


def test_expected_tokens_per_step_is_the_geometric_sum() -> None:
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


@pytest.mark.parametrize("alpha", [0.2, 0.6, 0.9])
def test_drawn_acceptance_follows_alpha_to_the_power_of_the_position(alpha: float) -> None:
    rng = random.Random(1)
    k, n = 4, 40_000
    draws = [draw_accepted(rng, alpha, k) for _ in range(n)]
    for i in range(1, k + 1):  # P(position i accepted) = alpha**i
        assert sum(d >= i for d in draws) / n == pytest.approx(alpha**i, abs=0.01)
    assert 1 + sum(draws) / n == pytest.approx(expected_tokens_per_step(alpha, k), abs=0.02)


def run(k: int, alpha: float = 0.5, seed: int = 0, n: int = 6) -> tuple[dict, list, dict]:
    config = EngineConfig(num_speculative_tokens=k, max_num_batched_tokens=512)
    engine = Engine(
        config, SimExecutor("h100", "llama-3-8b", spec_acceptance=alpha, spec_seed=seed)
    )
    for i in range(n):
        prompt = list(range(100 + i, 400 + i))
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=120, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    durations = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        durations.append(engine.last_step.duration_s)  # type: ignore[union-attr]
    return tokens, durations, engine.stats()


def test_simulated_speculation_is_reproducible_and_changes_only_the_steps() -> None:
    plain, plain_steps, _ = run(0)
    first, first_steps, stats = run(4, seed=7)
    again, again_steps, _ = run(4, seed=7)
    other, other_steps, _ = run(4, seed=8)
    assert first == again == other == plain
    assert first_steps == again_steps
    assert other_steps != first_steps
    assert len(first_steps) < len(plain_steps)
    rate = stats["spec_num_accepted_tokens"] / stats["spec_num_drafts"]
    assert rate == pytest.approx(0.5 + 0.25 + 0.125 + 0.0625, abs=0.15)


def test_no_acceptance_only_costs_and_full_acceptance_takes_k_plus_one_tokens() -> None:
    _, plain_steps, _ = run(0)
    _, none_steps, none_stats = run(4, alpha=0.0)
    _, all_steps, all_stats = run(4, alpha=1.0)
    assert none_stats["spec_num_accepted_tokens"] == 0
    assert len(none_steps) == len(plain_steps) and sum(none_steps) > sum(plain_steps)
    assert all_stats["spec_num_accepted_tokens"] == all_stats["spec_num_draft_tokens"] > 0
    assert sum(all_steps) < sum(plain_steps)


def test_a_verifying_step_is_priced_as_a_step_of_more_query_tokens() -> None:
    cost = SimExecutor("h100", "llama-3-8b").cost_model
    for batch in (1, 64):
        plain = decode_step_seconds(cost, batch, 1000)
        spec = decode_step_seconds(cost, batch, 1000, 4)
        assert spec >= plain
        assert spec == cost.step_seconds(5 * batch, 5 * batch, batch, batch, batch * 1005)
        assert plain == cost.decode_step_seconds(batch, batch * 1001)


def test_speculation_pays_at_small_batches_and_costs_at_large_ones() -> None:
    cost = SimExecutor("h100", "llama-3-8b").cost_model
    batches = [1, 4, 16, 64, 256]
    points = speculation_curve(cost, 0.5, 4, 1000, batches)
    assert points[0].speedup > 1.5
    assert points[-1].speedup < 1.0
    crossover = crossover_batch_size(points)
    assert crossover is not None and 1 < crossover <= 256
    assert all(p.spec_tpot_s < p.tpot_s for p in points if p.batch < crossover)
    # with every draft accepted, speculation never loses
    assert crossover_batch_size(speculation_curve(cost, 1.0, 4, 1000, batches)) is None


def test_a_bad_acceptance_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="acceptance rate"):
        SimExecutor("h100", "llama-3-8b", spec_acceptance=1.5)


def test_the_runner_times_every_token_of_a_speculative_step() -> None:
    from slotune.workloads import load_trace
    from slotune.workloads.runner.engine_loop import run_simulated
    from slotune.workloads.trace import default_max_model_len

    trace = load_trace("agent").repeat_to(3)
    results = {}
    for k in (0, 4):
        config = EngineConfig(max_model_len=default_max_model_len(trace), num_speculative_tokens=k)
        results[k] = run_simulated(config, trace).requests
    plain, spec = results[0], results[4]
    assert list(spec["output_tokens"]) == list(plain["output_tokens"])
    columns = (spec["token_times"], spec["output_tokens"], spec["finish_time"])
    for times, n, finish in zip(*columns, strict=True):
        assert len(times) == n and list(times) == sorted(times) and times[-1] == finish
    assert (spec["finish_time"] - spec["arrival_time"]).sum() < (
        plain["finish_time"] - plain["arrival_time"]
    ).sum()


def test_a_draft_model_adds_its_passes_and_pulls_the_crossover_in() -> None:
    """The engine's draft path: one pass over the step's tokens (its KV), then k decode
    passes of the verifying requests (tests/model/test_spec_draft_vs_hf.py counts them)."""
    from slotune.engine.sim.speculative import draft_seconds

    cost = SimExecutor("h100", "llama-3-70b", tp=4).cost_model
    draft = SimExecutor("h100", "llama-3-8b", tp=4).cost_model
    batches = [1, 4, 16, 64, 256]
    free = speculation_curve(cost, 0.5, 4, 1000, batches)
    drafted = speculation_curve(cost, 0.5, 4, 1000, batches, draft)
    for f, d in zip(free, drafted, strict=True):
        assert d.spec_tpot_s > f.spec_tpot_s and d.tpot_s == f.tpot_s
    gap = decode_step_seconds(cost, 8, 1000, 4, draft) - decode_step_seconds(cost, 8, 1000, 4)
    passes = [draft.gpu_step_seconds(8, 8, 8, 8 * (1001 + j)) for j in range(4)]
    catch_up = draft.gpu_step_seconds(8 * 5, 0, 8, 8 * 1005)  # 8 requests of 1 + 4 tokens
    assert gap == pytest.approx(catch_up + sum(passes))
    assert all(p < draft.decode_step_seconds(8, 8 * (1001 + j)) for j, p in enumerate(passes))
    assert gap == pytest.approx(catch_up + draft_seconds(draft, 8, 8 * 1001, 4))
    crossover_free = crossover_batch_size(free)
    crossover_drafted = crossover_batch_size(drafted)
    assert crossover_free is not None and crossover_drafted is not None
    assert crossover_drafted <= crossover_free


def test_a_simulated_draft_model_slows_every_drafted_step() -> None:
    def total(draft_model: str | None) -> float:
        config = EngineConfig(num_speculative_tokens=3, max_num_batched_tokens=512)
        executor = SimExecutor("h100", "llama-3-70b", 4, spec_draft_model=draft_model)
        engine = Engine(config, executor)
        for i in range(4):
            prompt = list(range(100 + i, 300 + i))
            engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=50, ignore_eos=True))
        seconds = 0.0
        while engine.has_unfinished_requests():
            engine.step()
            seconds += engine.last_step.duration_s  # type: ignore[union-attr]
        return seconds

    assert total("llama-3-8b") > total(None)


def test_the_configured_draft_model_prices_drafts_at_its_measured_default() -> None:
    from slotune.engine.sim.speculative import DRAFT_ACCEPTANCE, NGRAM_ACCEPTANCE

    def executor(**fields: object) -> SimExecutor:
        ex = SimExecutor("h100", "llama-3-70b", 4)
        config = EngineConfig(num_speculative_tokens=3, **fields)  # type: ignore[arg-type]
        Engine(config, ex)
        return ex

    ngram = executor()
    assert ngram.draft_cost is None and ngram.spec_acceptance == NGRAM_ACCEPTANCE
    drafted = executor(speculative_model="llama-3-8b")
    assert drafted.draft_cost is not None and drafted.spec_acceptance == DRAFT_ACCEPTANCE
    assert (
        executor(speculative_model="llama-3-8b", speculative_acceptance=0.3).spec_acceptance == 0.3
    )
    # its weights and its KV in every block come out of the pool
    assert drafted.capacity is not None and ngram.capacity is not None
    assert drafted.capacity.num_gpu_blocks < ngram.capacity.num_gpu_blocks
    off = SimExecutor("h100", "llama-3-70b", 4)
    Engine(EngineConfig(speculative_model="llama-3-8b"), off)  # k = 0: no draft runs
    assert off.draft_cost is None and off.capacity == ngram.capacity


def test_the_default_draft_acceptance_reproduces_its_source() -> None:
    """vllm-project/vllm#24322: mean acceptance lengths 2.79 (k=3) and 3.12 (k=4)."""
    from slotune.engine.sim.speculative import DRAFT_ACCEPTANCE

    assert expected_tokens_per_step(DRAFT_ACCEPTANCE, 3) == pytest.approx(2.79, abs=0.02)
    assert expected_tokens_per_step(DRAFT_ACCEPTANCE, 4) == pytest.approx(3.12, abs=0.02)
