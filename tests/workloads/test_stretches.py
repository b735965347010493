"""Stretches change nothing: every token time, every step row and every
engine counter equal those of stepping one by one, to the bit."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pandas as pd
import pytest

from slotune.engine import EngineConfig
from slotune.workloads import ArrivalSpec, Trace, run_simulated
from slotune.workloads.arrivals import ALL_AT_ONCE
from slotune.workloads.generators import AgentParams, agent_sessions, shared_prefix, sharegpt_like

CASES = {
    "hash-recompute-poisson": (
        EngineConfig(prefix_caching="hash", num_gpu_blocks=400),
        sharegpt_like(150, seed=1),
        ArrivalSpec(rate=6.0),
    ),
    "radix-swap-shared-prefix": (
        EngineConfig(
            prefix_caching="radix", preemption_mode="swap", block_size=32, num_gpu_blocks=160
        ),
        shared_prefix(num_groups=4, requests_per_group=30, seed=2),
        ArrivalSpec(rate=8.0),
    ),
    "hash-shared-prefix-poisson-threshold": (
        EngineConfig(
            prefix_caching="hash",
            max_num_batched_tokens=512,
            long_prefill_token_threshold=96,
            num_gpu_blocks=1200,
        ),
        shared_prefix(num_groups=5, requests_per_group=30, seed=7),
        ArrivalSpec(rate=10.0),
    ),
    "none-swap-poisson-few-seats": (
        EngineConfig(
            prefix_caching="none",
            preemption_mode="swap",
            max_num_seqs=6,
            max_num_batched_tokens=256,
            num_gpu_blocks=200,
        ),
        sharegpt_like(150, seed=8),
        ArrivalSpec(rate=12.0),
    ),
    "hash-swap-all-at-once-block8": (
        EngineConfig(prefix_caching="hash", preemption_mode="swap", block_size=8),
        sharegpt_like(120, seed=3),
        ALL_AT_ONCE,
    ),
    "none-prefill-first-all-at-once": (
        EngineConfig(
            prefix_caching="none",
            policy="prefill_first",
            max_num_batched_tokens=4096,
            max_model_len=4096,
            num_gpu_blocks=600,
        ),
        sharegpt_like(120, seed=4),
        ALL_AT_ONCE,
    ),
    "hash-concurrency-capped": (
        EngineConfig(prefix_caching="hash", block_size=16),
        sharegpt_like(100, seed=6),
        ArrivalSpec(rate=20.0, concurrency=6),
    ),
    # a decode budget: a waiting queue in priority order, preempted requests moving up
    "hash-recompute-decode-budget": (
        EngineConfig(prefix_caching="hash", num_gpu_blocks=300, decode_budget_ms=30.0),
        sharegpt_like(150, seed=11),
        ArrivalSpec(rate=8.0),
    ),
    "none-recompute-decode-budget-short": (
        EngineConfig(
            prefix_caching="none",
            max_num_batched_tokens=512,
            num_gpu_blocks=250,
            decode_budget_ms=5.0,
        ),
        sharegpt_like(150, seed=12),
        ArrivalSpec(rate=10.0),
    ),
    "radix-recompute-agents": (
        EngineConfig(prefix_caching="radix", block_size=16, num_gpu_blocks=900),
        agent_sessions(AgentParams(num_sessions=12), seed=5),
        ArrivalSpec(rate=2.0),
    ),
}


@pytest.fixture(autouse=True)
def _check_stretches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine also replays each stretch step by step and compares its whole state."""
    monkeypatch.setenv("SLOTUNE_CHECK_STRETCHES", "1")


def _both(config: EngineConfig, trace: Trace, arrivals: ArrivalSpec) -> tuple:
    on = run_simulated(config, trace, arrivals=arrivals, model="llama-2-7b", gpu="a100-80g")
    off = run_simulated(
        config, trace, arrivals=arrivals, model="llama-2-7b", gpu="a100-80g", stretches=False
    )
    return on, off


@pytest.mark.parametrize("name", list(CASES))
def test_stretches_equal_single_steps(name: str) -> None:
    trace = CASES[name][1]
    prompts = [list(p) for p in trace.own_prompt_token_ids()]
    on, off = _both(*CASES[name])
    assert trace.own_prompt_token_ids() == prompts  # the runs keep them without a copy
    pd.testing.assert_frame_equal(on.requests, off.requests, check_exact=True)
    pd.testing.assert_frame_equal(on.steps, off.steps, check_exact=True)
    assert on.requests["token_times"].tolist() == off.requests["token_times"].tolist()
    assert on.duration_s == off.duration_s
    covered = on.engine_stats.pop("stretch_steps")
    assert off.engine_stats.pop("stretch_steps") == 0
    assert on.engine_stats == off.engine_stats
    assert covered > len(on.steps) // 4  # the stretches really ran
    assert len(on.steps) == on.engine_stats["steps"]


def test_stretches_equal_single_steps_for_a_quantized_moe_model() -> None:
    config = EngineConfig(prefix_caching="hash", kv_cache_dtype="fp8", num_gpu_blocks=500)
    trace, arrivals = sharegpt_like(100, seed=9), ArrivalSpec(rate=8.0)
    kw = {"model": "mixtral-8x7b", "gpu": "h100", "tp": 2, "quantization": "fp8", "ep": 2}
    on = run_simulated(config, trace, arrivals=arrivals, **kw)  # type: ignore[arg-type]
    off = run_simulated(config, trace, arrivals=arrivals, stretches=False, **kw)  # type: ignore[arg-type]
    pd.testing.assert_frame_equal(on.steps, off.steps, check_exact=True)
    assert on.requests["token_times"].tolist() == off.requests["token_times"].tolist()
    assert on.engine_stats["stretch_steps"] > len(on.steps) // 4
    plain = run_simulated(config, trace, arrivals=arrivals, model="mixtral-8x7b", tp=2)
    assert plain.duration_s != on.duration_s  # the precision and EP reached the cost model


def test_stretches_stop_at_the_horizon() -> None:
    """A stretch must not run (or take arrivals) past a run's horizon."""
    trace = sharegpt_like(200, seed=3)
    cfg = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=64)
    runs = [
        run_simulated(cfg, trace, arrivals=ArrivalSpec(rate=40), horizon_s=3.0, stretches=s)
        for s in (True, False)
    ]
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests)
    assert runs[0].duration_s == runs[1].duration_s
    assert (runs[0].requests["error"] == "not sent").any()


@pytest.mark.parametrize("name", [n for n in CASES if "decode-budget" in n])
def test_the_decode_budget_cases_preempt_and_move_requests_up(name: str) -> None:
    """The budget cases above test what they are for: requests are preempted, and the
    budget changes the run (the same run without it differs)."""
    config, trace, arrivals = CASES[name]
    on = run_simulated(config, trace, arrivals=arrivals, model="llama-2-7b", gpu="a100-80g")
    plain = replace(config, decode_budget_ms=0.0)
    off = run_simulated(plain, trace, arrivals=arrivals, model="llama-2-7b", gpu="a100-80g")
    assert on.engine_stats["num_preemptions"] > 10
    assert on.requests["first_token_time"].tolist() != off.requests["first_token_time"].tolist()


@pytest.mark.parametrize("name", [n for n in CASES if "decode-budget" in n])
def test_under_a_decode_budget_stretches_plan_preemptions_and_readmissions(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A victim that waits at the queue's front (it sorts before the waiting head) is
    preempted inside a stretch, its time joining the budget's watch there; the stretch
    ends where a watched request comes due. A preempted request that sorts behind every
    running one is readmitted inside a stretch, one preempted before it and one the stretch
    preempted itself; a victim readmitted before it comes due is no longer watched, so the
    stretch runs on past that time. Every stretch is replayed step by step and compared
    (the checking mode above), and the run equals one stepped one by one."""
    import slotune.engine.engine as engine_module
    from slotune.engine.request import RequestStatus
    from slotune.engine.rules import may_earn_priority

    config = CASES[name][0]
    budget_s = config.decode_budget_ms / 1000
    preempts = readmits = again = outlived = 0
    apply = engine_module.apply_stretch

    def counting(scheduler, plan, tokens, durations=None):  # type: ignore[no-untyped-def]
        nonlocal preempts, readmits, again, outlived
        preempts += sum(len(s.preempts or ()) for s in plan.steps)
        status = [m.request.status for m in plan.requests]
        readmits += sum(
            status[i] is RequestStatus.PREEMPTED for s in plan.steps for i, _ in s.admits
        )
        starts = list(itertools.accumulate(durations, initial=0.0))
        for m in plan.requests:
            if m.next_stay >= 0:
                again += 1
                # it would have come due before the stretch's last step, had it waited
                earns = may_earn_priority(m.request.boosted, m.preempted_with_output)
                outlived += earns and starts[-2] - starts[m.preempted] > (budget_s * 1.01)
        return apply(scheduler, plan, tokens, durations)

    monkeypatch.setattr(engine_module, "apply_stretch", counting)
    on, off = _both(*CASES[name])
    pd.testing.assert_frame_equal(on.requests, off.requests, check_exact=True)
    assert preempts > 5 and readmits > 2 and again > 2, (preempts, readmits, again)
    if budget_s > 0.02:  # (a 5 ms budget has passed before a victim's next step)
        assert outlived > 0


TIMEOUT_CASES = {
    # overloaded: requests time out waiting and while decoding; arrivals join stretches
    "hash-few-seats-timeouts": (
        EngineConfig(prefix_caching="hash", max_num_seqs=8, max_num_batched_tokens=512),
        sharegpt_like(200, seed=13),
        ArrivalSpec(rate=12.0),
        "vllm-0.34",  # schedule ahead: arrivals join after the step that starts after them
    ),
    "none-threshold-timeouts-no-lookahead": (
        EngineConfig(prefix_caching="none", long_prefill_token_threshold=64, num_gpu_blocks=300),
        sharegpt_like(200, seed=14),
        ArrivalSpec(rate=15.0),
        "vllm-0.11",
    ),
    # sessions: a finish releases the next turn, so stretches take no arrivals and end
    # at the next arrival or deadline
    "radix-agents-timeouts": (
        EngineConfig(prefix_caching="radix", block_size=16, num_gpu_blocks=700),
        agent_sessions(AgentParams(num_sessions=16), seed=15),
        ArrivalSpec(rate=3.0),
        "sglang-0.5",
    ),
}


@pytest.mark.parametrize("name", list(TIMEOUT_CASES))
def test_stretches_take_arrivals_up_to_the_first_deadline(name: str) -> None:
    """With client timeouts a stretch runs through arrivals but ends with the step that
    reaches the earliest pending deadline (none taken in later is earlier)."""
    config, trace, arrivals, stack = TIMEOUT_CASES[name]
    kw = {"model": "llama-2-7b", "gpu": "a100-80g", "stack": stack, "timeout_s": 4.0}
    on = run_simulated(config, trace, arrivals=arrivals, **kw)  # type: ignore[arg-type]
    off = run_simulated(config, trace, arrivals=arrivals, stretches=False, **kw)  # type: ignore[arg-type]
    pd.testing.assert_frame_equal(on.requests, off.requests, check_exact=True)
    pd.testing.assert_frame_equal(on.steps, off.steps, check_exact=True)
    assert on.requests["token_times"].tolist() == off.requests["token_times"].tolist()
    assert (on.requests["error"] == "timeout").sum() > 5
    assert on.engine_stats["stretch_steps"] > len(on.steps) // 4
