"""The simulated engine end to end: preemption (recompute and swap), both prefix caches."""

from __future__ import annotations

import pytest

from slotune.engine import Engine, EngineConfig, SamplingParams


def _run(
    engine: Engine, prompts: dict[str, list[int]], max_tokens: int, stagger: bool = False
) -> tuple[dict[str, list[int]], float]:
    """Run to completion; return every request's tokens and the simulated time."""
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    clock = 0.0
    pending = list(prompts.items())
    if not stagger:
        for rid, prompt in pending:
            engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens))
        pending = []
    while pending or engine.has_unfinished_requests():
        if pending and not engine.has_unfinished_requests():
            rid, prompt = pending.pop(0)
            engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens))
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
        assert engine.last_step is not None
        clock += engine.last_step.duration_s
    return tokens, clock


def _prompts(n: int, length: int, shared: int = 0) -> dict[str, list[int]]:
    return {
        f"r{i}": list(range(1, shared + 1)) + [1000 + i * 7919 + j for j in range(length)]
        for i in range(n)
    }


def _engine(**kw: object) -> Engine:
    base: dict[str, object] = dict(
        block_size=16, max_num_batched_tokens=512, prefix_caching="none", max_model_len=2048
    )
    base.update(kw)
    return Engine.simulated(EngineConfig(**base), gpu="a100-80g", model="llama-2-7b")  # type: ignore[arg-type]


def test_an_unconstrained_run_uses_the_cost_model_capacity() -> None:
    engine = _engine()
    assert engine.capacity.num_gpu_blocks > 7000
    tokens, clock = _run(engine, _prompts(4, 100), max_tokens=20)
    assert all(len(t) == 20 for t in tokens.values())
    assert clock > 0 and engine.stats()["num_preemptions"] == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_every_token_the_same(mode: str) -> None:
    prompts = _prompts(8, 100)
    reference, free_clock = _run(_engine(), prompts, max_tokens=150)
    tight = _engine(num_gpu_blocks=40, preemption_mode=mode, swap_space_gb=1.0)
    tokens, clock = _run(tight, prompts, max_tokens=150)
    stats = tight.stats()
    assert stats["num_preemptions"] > 0
    if mode == "swap":
        assert stats["num_swap_outs"] > 0 and stats["num_swap_ins"] > 0
    assert tokens == reference  # tokens depend on request and position only
    assert clock > free_clock  # preemption costs time: recomputed prefills or swap traffic


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_prefix_caches_hit_and_save_simulated_time(cache: str) -> None:
    prompts = _prompts(6, 40, shared=480)
    tokens_off, clock_off = _run(_engine(), prompts, max_tokens=8, stagger=True)
    engine = _engine(prefix_caching=cache)
    tokens_on, clock_on = _run(engine, prompts, max_tokens=8, stagger=True)
    assert engine.stats()["prefix_cache_hit_tokens"] >= 5 * 480 - 16 * 5
    assert tokens_on == tokens_off
    assert clock_on < clock_off
