"""What-if: the recommendation rerun with slotune's own policies for a target that lacks
them; the gain is computed on the simulator and the report section shows it."""

from __future__ import annotations

from typing import Any

import pytest

from slotune.engine.config import EngineConfig
from slotune.reports.what_if import what_if_html
from slotune.targets import get_target
from slotune.tuner.evaluate import Evaluator
from slotune.tuner.what_if import what_if
from tests.tuner.studies import evaluator_for

RATE = 6.0
CONFIG = EngineConfig(max_num_batched_tokens=8192, max_model_len=8192)


@pytest.fixture(scope="module")
def gains() -> tuple[dict[str, Any], Evaluator, dict[str, Any]]:
    """Long prompts at 6 req/s on an H100 under a 20 ms TPOT target: fixed 8192-token
    steps stall the decodes (a quarter of the requests miss it)."""
    evaluator = evaluator_for(
        gpu="h100",
        slo="ttft=3s,tpot=20ms",
        trace="long-context",
        num_requests=40,
        objective="weighted",
        rate=RATE,
        target="vllm==0.34",
    )
    summary = evaluator.summarize(evaluator.run(CONFIG, RATE), RATE)
    calls: list[str] = []
    target = get_target("vllm==0.34")
    data = what_if(evaluator, target, CONFIG, summary, RATE, lambda: calls.append("written"))
    assert data is not None and calls == ["written"]  # once, while the reruns go
    return data, evaluator, summary


def test_each_missing_policy_is_rerun_and_adaptive_chunking_gains(gains: Any) -> None:
    data, evaluator, summary = gains
    by_name = {p["name"]: p for p in data["policies"]}
    assert set(by_name) == {"hybrid preemption", "decode budget", "adaptive chunking"}
    base = data["base"]
    assert base["slo_attainment"] == summary["slo_attainment"] < 0.9
    assert base["tpot_p99_ms"] == summary["tpot_ms"]["p99"] > 20
    adaptive = by_name["adaptive chunking"]
    assert adaptive["settings"] == {"adaptive_chunk_ms": 20.0, "max_num_batched_tokens": 8192}
    assert adaptive["scores"]["tpot_p99_ms"] < 20 < base["tpot_p99_ms"]
    assert adaptive["scores"]["slo_attainment"] > base["slo_attainment"]
    # without a preemption in the run, hybrid preemption and the decode budget change nothing
    assert summary["num_preemptions"] == 0
    assert by_name["hybrid preemption"]["same"] and by_name["decode budget"]["scores"] == base
    hybrid = EngineConfig(**{**CONFIG.to_dict(), "preemption_mode": "hybrid"})
    rerun = evaluator.summarize(evaluator.run(hybrid, RATE), RATE)
    assert rerun["tpot_ms"] == summary["tpot_ms"] and rerun["ttft_ms"] == summary["ttft_ms"]
    # the row is the variant's own run (the same load, the policy on)
    variant = EngineConfig(**{**CONFIG.to_dict(), "adaptive_chunk_ms": 20.0})
    direct = evaluator.summarize(evaluator.run(variant, RATE), RATE)
    assert adaptive["scores"]["tpot_p99_ms"] == direct["tpot_ms"]["p99"]


def test_no_what_if_where_the_target_runs_every_policy(gains: Any) -> None:
    _, evaluator, summary = gains
    calls: list[str] = []
    target = get_target("slotune")
    assert what_if(evaluator, target, CONFIG, summary, RATE, lambda: calls.append("x")) is None
    assert calls == ["x"]  # nothing to rerun: still called


def test_the_report_section_says_the_gain_with_numbers(gains: Any) -> None:
    data, _, _ = gains
    html = what_if_html({"what_if": data})
    assert html is not None
    base, adaptive = data["base"], data["policies"][2]["scores"]
    points = 100 * (adaptive["slo_attainment"] - base["slo_attainment"])
    assert "With adaptive chunking, the recommended configuration would reach" in html
    assert f"{100 * adaptive['slo_attainment']:.1f}%" in html and f"{points:+.1f} points" in html
    assert "hybrid preemption" in html and "decode_budget_ms=20" in html
    assert what_if_html({}) is None
