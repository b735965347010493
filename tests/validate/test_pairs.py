"""The shipped vLLM stack against single-knob changes measured on real vLLM (held out: the
BLIS sim-to-real study's runs as quoted in issue 25; never fitted). A tuner ranks
configurations by these differences, so a wrong direction is a wrong decision."""

import numpy as np
import pytest

from slotune.validate.pairs import (
    MEASURED_PAIRS,
    direction_ok,
    simulate_pair,
    study_workload,
)

# The study's "general" load (8 then 20 req/s), each stage shortened to 30 s.
TRACE = study_workload(((8.0, 30.0), (20.0, 30.0)))
BY_NAME = {p.name: p for p in MEASURED_PAIRS}


def test_direction_rule() -> None:
    assert direction_ok(-0.37, -0.30) and not direction_ok(-0.37, 0.0)
    assert not direction_ok(0.11, -0.02) and direction_ok(0.11, 0.05)
    assert direction_ok(0.0, 0.03) and not direction_ok(0.0, 0.08)


def test_study_workload_runs_its_stages_one_after_the_other() -> None:
    trace = study_workload(((8.0, 100.0), (20.0, 100.0)), seed=3)
    t = np.array([r.arrival_time for r in trace.requests])
    assert np.all(np.diff(t) >= 0) and t[-1] < 200.0
    first, second = (t < 100.0).sum(), (t >= 100.0).sum()
    assert 700 <= first <= 900 and 1800 <= second <= 2200  # Poisson: ±4 sigma of 800 / 2000
    # inference-perf's pool: request k sends prompt k mod 100 behind its group's system prompt
    r0, r100, r9 = trace.requests[0], trace.requests[100], trace.requests[9]
    assert r0.prompt_segments == r100.prompt_segments != r9.prompt_segments
    assert r0.prompt_segments[0] == r9.prompt_segments[0]  # 9 groups, round robin
    with pytest.raises(ValueError, match="stages"):
        study_workload(((8.0, 0.0),))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "Llama-3.1-8B TP1 -> TP2",
        "Mixtral-8x7B TP2 -> TP4",
        "Llama-3.1-8B budget 2048 -> 8192",
        "Llama-3.1-8B memory 0.90 -> 0.95",
        pytest.param(
            "Llama-3.1-8B budget 2048 -> 1024",
            marks=pytest.mark.xfail(
                strict=True,
                reason="vLLM's +11 % E2E / +9 % TTFT at a 1024 budget is the signature of every "
                "step slowing ~11 %, decode-only steps included, which no budget-dependent "
                "mechanism of vLLM 0.15.1 explains at this load (BENCHMARKS, issue 25)",
            ),
        ),
    ],
)
def test_shipped_stack_moves_the_way_vllm_did(name: str) -> None:
    pair = BY_NAME[name]
    r = simulate_pair(pair, TRACE)
    assert direction_ok(pair.e2e or 0.0, r["e2e_sim"]), r
    if pair.ttft is not None:
        assert direction_ok(pair.ttft, r["ttft_sim"]), r
    if not pair.tie and pair.e2e is not None:
        # the size: within a factor 1.3 (the target is 1.1; see BENCHMARKS)
        assert 1 / 1.3 <= r["e2e_sim"] / pair.e2e <= 1.3, r


@pytest.mark.slow
def test_budget_1024_binds_only_before_the_prompt_pool_is_cached() -> None:
    """The premise of the budget pair's finding (BENCHMARKS): on the study's load a 1024
    budget caps the largest step and leaves the share of mixed steps as it was."""
    r = simulate_pair(BY_NAME["Llama-3.1-8B budget 2048 -> 1024"], TRACE)
    assert r["largest_step_after"] <= 1024 < r["largest_step_before"], r
    assert abs(r["mixed_after"] - r["mixed_before"]) < 0.005, r
    assert abs(r["steps_after"] / r["steps_before"] - 1) < 0.005, r
