"""Metric definitions (vLLM bench serve) on hand-computed examples."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotune.workloads import RunResult, parse_slo, summarize
from slotune.workloads.metrics import request_metrics
from slotune.workloads.result import REQUEST_COLUMNS, empty_steps, token_times_json


def _result(rows: list[dict], duration: float, stats: dict | None = None) -> RunResult:
    base = {
        "session_id": None,
        "turn": 0,
        "prompt_tokens": 100,
        "cached_tokens": 0,
        "num_preemptions": 0,
        "error": None,
    }
    data = []
    for r in rows:
        row = {**base, **r}
        ts = row["token_times"]
        row.setdefault("first_token_time", ts[0] if ts else math.nan)
        row.setdefault("finish_time", ts[-1] if ts else math.nan)
        row.setdefault("output_tokens", len(ts))
        data.append(row)
    df = pd.DataFrame(data, columns=list(REQUEST_COLUMNS))
    return RunResult(
        requests=df, steps=empty_steps(), duration_s=duration, engine_stats=stats or {}
    )


# a: arrives 0, tokens at 0.1 0.2 0.3 0.5 -> ttft 100 ms, e2e 500 ms, tpot 400/3 ms, itl 100 100 200
# b: arrives 1, tokens at 1.3 1.35       -> ttft 300 ms, e2e 350 ms, tpot 50 ms, itl 50
# c: arrives 2, one token at 2.05        -> ttft 50 ms, e2e 50 ms, no tpot, no itl
# d: failed
ROWS = [
    {"request_id": "a", "arrival_time": 0.0, "token_times": [0.1, 0.2, 0.3, 0.5]},
    {"request_id": "b", "arrival_time": 1.0, "token_times": [1.3, 1.35], "cached_tokens": 50},
    {"request_id": "c", "arrival_time": 2.0, "token_times": [2.05], "num_preemptions": 2},
    {
        "request_id": "d",
        "arrival_time": 3.0,
        "token_times": [],
        "error": "HTTP 500: boom",
        "finish_time": 3.1,
    },
]


def test_latency_definitions() -> None:
    s = summarize(_result(ROWS, duration=4.0))
    assert (s["num_requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["ttft_ms"]["mean"] == pytest.approx((100 + 300 + 50) / 3)
    assert s["ttft_ms"]["p50"] == pytest.approx(100)
    assert s["e2el_ms"]["mean"] == pytest.approx((500 + 350 + 50) / 3)
    # TPOT = (E2E - TTFT) / (output - 1), only for requests with more than one token
    assert s["tpot_ms"]["mean"] == pytest.approx((400 / 3 + 50) / 2)
    # ITL pools every gap: 100, 100, 200, 50
    assert s["itl_ms"]["mean"] == pytest.approx(112.5)
    assert s["itl_ms"]["p50"] == pytest.approx(100)
    assert s["itl_ms"]["p99"] == pytest.approx(197.0)  # numpy linear interpolation
    assert s["request_throughput"] == pytest.approx(3 / 4.0)
    assert s["output_throughput"] == pytest.approx(7 / 4.0)
    assert s["num_preemptions"] == 2
    assert s["prefix_cache_hit_rate"] == pytest.approx(50 / 400)
    assert s["errors"] == {"HTTP 500: boom": 1}
    assert set(s["ttft_ms"]) == {"mean", "p50", "p90", "p95", "p99"}


def test_slo_attainment_and_goodput_count_failures_as_misses() -> None:
    res = _result(ROWS, duration=4.0)
    s = summarize(res, parse_slo("ttft=200ms,tpot=100ms"))
    # a: tpot 133 ms > 100 -> miss; b: ttft 300 > 200 -> miss; c: meets; d: failed -> miss
    assert s["slo_attainment"] == pytest.approx(1 / 4)
    assert s["goodput"] == pytest.approx(1 / 4.0)
    s = summarize(res, parse_slo("ttft=400ms,e2e=1s"))
    assert s["slo_attainment"] == pytest.approx(3 / 4)
    s = summarize(res, parse_slo("itl=150ms"))  # a has a 200 ms gap
    assert s["slo_attainment"] == pytest.approx(2 / 4)


def test_percentile_targets_are_checked_on_the_distribution() -> None:
    s = summarize(_result(ROWS, duration=4.0), parse_slo("ttft:p50=150ms,tpot:p90=60ms"))
    by_metric = {c["metric"]: c for c in s["slo_checks"]}
    assert by_metric["ttft"]["value_ms"] == pytest.approx(100)
    assert by_metric["ttft"]["met"] is True
    assert by_metric["tpot"]["met"] is False


def test_engine_counters_win_over_per_request_cached_tokens() -> None:
    stats = {
        "num_preemptions": 7,
        "prefix_cache_queries_tokens": 1000,
        "prefix_cache_hit_tokens": 250,
    }
    s = summarize(_result(ROWS, duration=4.0, stats=stats))
    assert s["num_preemptions"] == 7
    assert s["prefix_cache_hit_rate"] == pytest.approx(0.25)


def test_no_completed_request_gives_empty_distributions() -> None:
    rows = [
        {
            "request_id": "x",
            "arrival_time": 0.0,
            "token_times": [],
            "error": "timeout",
            "finish_time": 1.0,
        }
    ]
    s = summarize(_result(rows, duration=1.0), parse_slo("ttft=1s"))
    assert s["ttft_ms"]["p99"] is None
    assert s["slo_attainment"] == 0.0
    assert s["completed"] == 0


def test_custom_percentiles() -> None:
    s = summarize(_result(ROWS, duration=4.0), percentiles=(75, 99.9))
    assert set(s["ttft_ms"]) == {"mean", "p75", "p99.9"}


def test_run_result_round_trips_through_csv(tmp_path) -> None:
    res = _result(ROWS, duration=4.0)
    res.save(tmp_path)
    back = RunResult.load(tmp_path, duration_s=4.0)
    assert back.requests["token_times"].tolist() == res.requests["token_times"].tolist()
    assert summarize(back) == summarize(res)


@given(st.lists(st.floats(0, 1e7, allow_nan=False) | st.integers(0, 10**9).map(lambda u: u / 1e6)))
@settings(max_examples=300, deadline=None)
def test_saved_token_times_read_back_rounded_to_the_microsecond(times: list[float]) -> None:
    assert json.loads(token_times_json(times)) == [round(t, 6) for t in times]


token_lists = st.lists(
    st.lists(st.floats(0, 1e4, allow_nan=False), max_size=6).map(sorted), max_size=8
)


@given(token_lists, st.data())
@settings(max_examples=200, deadline=None)
def test_pooled_gaps_match_each_request_diffed_alone(times: list[list[float]], data) -> None:
    ok = data.draw(st.lists(st.booleans(), min_size=len(times), max_size=len(times)))
    rows = [
        {"request_id": f"r{i}", "arrival_time": 0.0, "token_times": ts}
        | ({} if good else {"error": "failed"})
        for i, (ts, good) in enumerate(zip(times, ok, strict=True))
    ]
    m = request_metrics(_result(rows, 1.0))
    per_request = [np.diff(np.asarray(ts, dtype=float)) for ts in times]
    expected_itl = [g for gaps, good in zip(per_request, ok, strict=True) if good for g in gaps]
    assert m["itl"].tolist() == expected_itl
    assert m["max_itl"].tolist() == [float(g.max()) if len(g) else 0.0 for g in per_request]
