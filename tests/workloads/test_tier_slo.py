"""Per-tier SLOs: parsing, checks against the trace, and attainment per tier computed
against each tier's own targets (checked on hand-computed requests)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from slotune.workloads import RunResult, parse_slo, summarize
from slotune.workloads.result import REQUEST_COLUMNS, empty_steps


def test_tier_parts_parse_and_round_trip() -> None:
    slo = parse_slo("pro:ttft=200ms,tpot=30ms;free:ttft=2s,tpot=100ms")
    assert slo.for_tier(0).threshold_s("ttft") == pytest.approx(0.2)
    assert slo.for_tier(1).threshold_s("tpot") == pytest.approx(0.1)
    assert slo.threshold_s("ttft") == pytest.approx(2.0)  # run-wide: the loosest
    assert parse_slo(str(slo)) == slo
    default = parse_slo("pro:ttft=200ms;ttft=1s")
    assert default.for_tier(3).threshold_s("ttft") == pytest.approx(1.0)
    assert parse_slo("ttft:p90=300ms").get("ttft").percentile == 90  # a metric, not a tier
    assert parse_slo("tier2:ttft=1s;0:ttft=2s").for_tier(2).threshold_s("ttft") == 1.0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gold:ttft=1s", "unknown tier 'gold'"),
        ("pro:ttft=1s;pro:ttft=2s", "given twice"),
        ("pro:", "SLO part is empty"),
        ("ttft=1s;tpot=1s", "a second part without a tier name"),
        ("pro:ttft=fast", "not a number with a unit"),
    ],
)
def test_bad_tier_parts_say_what(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_slo(text)


def test_tiers_are_checked_against_the_trace() -> None:
    slo = parse_slo("pro:ttft=200ms;free:ttft=2s")
    slo.check_tiers({0, 1})
    with pytest.raises(ValueError, match="no request of that tier"):
        slo.check_tiers({1})
    with pytest.raises(ValueError, match="tier 'tier2' and the SLO gives them no targets"):
        slo.check_tiers({0, 1, 2})
    parse_slo("pro:ttft=200ms;ttft=2s").check_tiers({0, 1, 2})  # the default part covers 1, 2


def _result() -> RunResult:
    # ttft (ms) per request: pro 100, 300; free 300, 2500 (all single-token)
    rows = [
        ("p1", 0, 0.1),
        ("p2", 0, 0.3),
        ("f1", 1, 0.3),
        ("f2", 1, 2.5),
    ]
    data = []
    for rid, tier, ttft in rows:
        data.append(
            {
                "request_id": rid,
                "session_id": None,
                "turn": 0,
                "arrival_time": 0.0,
                "prompt_tokens": 10,
                "cached_tokens": 0,
                "num_preemptions": 0,
                "error": None,
                "token_times": [ttft],
                "first_token_time": ttft,
                "finish_time": ttft,
                "output_tokens": 1,
                "tier": tier,
            }
        )
    df = pd.DataFrame(data, columns=list(REQUEST_COLUMNS))
    return RunResult(requests=df, steps=empty_steps(), duration_s=10.0, engine_stats={})


def test_each_tier_is_scored_against_its_own_targets() -> None:
    result = _result()
    tiered = summarize(result, parse_slo("pro:ttft=200ms;free:ttft=2s"))
    # pro: 100 ms meets 200 ms, 300 ms does not; free: 300 ms meets 2 s, 2.5 s does not
    assert tiered["tiers"]["0"]["slo_attainment"] == 0.5
    assert tiered["tiers"]["1"]["slo_attainment"] == 0.5
    assert tiered["tiers"]["0"]["slo"] == "ttft=200ms"
    assert tiered["slo_attainment"] == 0.5
    assert math.isclose(tiered["goodput"], 2 / 10.0)
    # one SLO for all: 200 ms passes only p1; 2 s passes three
    assert summarize(result, parse_slo("ttft=200ms"))["slo_attainment"] == 0.25
    assert summarize(result, parse_slo("ttft=2s"))["slo_attainment"] == 0.75
