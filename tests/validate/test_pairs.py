"""The shipped vLLM stack against single-knob changes measured on real vLLM (held out: the
BLIS sim-to-real study's runs as quoted in issue 25; never fitted). A tuner ranks
configurations by these differences, so a wrong direction is a wrong decision."""

import pytest

from slotune.validate.pairs import (
    MEASURED_PAIRS,
    direction_ok,
    simulate_pair,
    study_workload,
)

TRACE = study_workload(rate=8.0, duration_s=40.0)
BY_NAME = {p.name: p for p in MEASURED_PAIRS}


def test_direction_rule() -> None:
    assert direction_ok(-0.37, -0.30) and not direction_ok(-0.37, 0.0)
    assert not direction_ok(0.11, -0.02) and direction_ok(0.11, 0.05)
    assert direction_ok(0.0, 0.03) and not direction_ok(0.0, 0.08)


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
                reason="the simulator does not reproduce vLLM's +11 % at a 1024 budget with "
                "max_num_seqs 128 (graph capture stays at 256 tokens; prompts are cached)",
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
