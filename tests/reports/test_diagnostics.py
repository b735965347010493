"""Each diagnostic fires above its threshold, stays quiet below it, and says so."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from slotune.reports import diagnostics as dx
from slotune.reports.columns import REQUEST_COLUMNS, STEP_COLUMNS
from slotune.reports.runs import RunData


def make_run(
    summary: dict[str, Any] | None = None,
    steps: dict[str, list[float]] | None = None,
    config: dict[str, Any] | None = None,
) -> RunData:
    frame = pd.DataFrame({k: pd.Series(v, dtype=float) for k, v in (steps or {}).items()})
    for key in STEP_COLUMNS:
        if key not in frame:
            frame[key] = np.nan
    requests = pd.DataFrame(columns=[*REQUEST_COLUMNS, "ttft_ms", "tpot_ms", "e2el_ms"])
    return RunData("run", summary or {}, requests, frame, np.empty(0), config or {})


def test_head_of_line_blocking_above_three_times_median() -> None:
    fired = dx.head_of_line(make_run({"ttft_ms": {"p50": 100.0, "p99": 450.0}}))
    assert fired.triggered is True
    assert "4.5×" in fired.message and "threshold 3×" in fired.message
    quiet = dx.head_of_line(make_run({"ttft_ms": {"p50": 100.0, "p99": 290.0}}))
    assert quiet.triggered is False and "2.9×" in quiet.message
    assert dx.head_of_line(make_run()).triggered is None


def test_preemption_rate_above_one_percent_of_steps() -> None:
    many = [1.0] * 3 + [0.0] * 97
    fired = dx.preemptions(make_run(steps={"preempted": many}))
    assert fired.triggered is True and "3.0% of 100 steps" in fired.message
    assert "threshold 1% of steps" in fired.message
    few = [1.0] + [0.0] * 199
    assert dx.preemptions(make_run(steps={"preempted": few})).triggered is False
    assert dx.preemptions(make_run()).triggered is None


def test_kv_usage_persistently_above_85_percent_weighted_by_step_time() -> None:
    usage = [0.9] * 6 + [0.5] * 4
    fired = dx.kv_pressure(make_run(steps={"kv_usage": usage, "step_time": [0.01] * 10}))
    assert fired.triggered is True and "above 85% for 60%" in fired.message
    brief = dx.kv_pressure(
        make_run(steps={"kv_usage": usage, "step_time": [0.001] * 6 + [0.1] * 4})
    )
    assert brief.triggered is False, "time-weighted: the full-cache steps were short"
    assert dx.kv_pressure(make_run()).triggered is None


@pytest.mark.parametrize(
    ("stats", "expected"),
    [
        ({"prefix_sharing_ratio": 0.4}, True),
        ({"prefix_sharing_ratio": 0.02}, False),
        ({"shares_prefixes": True}, True),
        ({"requests": 10}, None),
        (None, None),
    ],
)
def test_trace_prefix_sharing_from_its_statistics(stats: Any, expected: bool | None) -> None:
    assert dx.trace_shares_prefixes(stats) is expected


def test_prefix_cache_hit_rate_under_30_percent_on_a_sharing_trace() -> None:
    low = make_run({"prefix_cache_hit_rate": 0.1}, config={"prefix_caching": "none"})
    fired = dx.prefix_cache(low, shares_prefixes=True)
    assert fired.triggered is True
    assert "10%" in fired.message and "threshold 30%" in fired.message
    assert "prefix_caching=none" in fired.message
    high = make_run({"prefix_cache_hit_rate": 0.6})
    assert dx.prefix_cache(high, shares_prefixes=True).triggered is False
    not_sharing = dx.prefix_cache(low, shares_prefixes=False)
    assert not_sharing.triggered is False and "Not applicable" in not_sharing.message
    assert dx.prefix_cache(low, shares_prefixes=None).triggered is None


def test_tpot_tail_names_the_chunk_budget_first() -> None:
    run = make_run({"tpot_ms": {"p50": 20.0, "p99": 90.0}}, config={"max_num_batched_tokens": 8192})
    fired = dx.tpot_tail(run)
    assert fired.triggered is True
    assert "First suspect: the chunk budget (max_num_batched_tokens=8192)" in fired.message
    quiet = dx.tpot_tail(make_run({"tpot_ms": {"p50": 20.0, "p99": 40.0}}))
    assert quiet.triggered is False and "threshold 3×" in quiet.message


def test_diagnose_runs_every_check_once() -> None:
    results = dx.diagnose(make_run(), {"prefix_sharing_ratio": 0.5})
    assert [d.key for d in results] == ["hol", "preempt", "kv", "prefix", "tpot"]
    assert all(d.triggered is None for d in results)
