"""A request's priority and tier: read from traces, kept, and used by the simulated engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slotune.engine import EngineConfig
from slotune.workloads import TraceFormatError, load_trace
from slotune.workloads.metrics import request_metrics, summarize
from slotune.workloads.runner.engine_loop import run_simulated
from slotune.workloads.slo import parse_slo
from slotune.workloads.trace import Trace, TraceRequest


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_priority_and_tier_round_trip(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "prompt_len": 5, "output_len": 2, "priority": -3, "tier": 1},
        {"id": "b", "prompt_len": 5, "output_len": 2},
    ]
    trace = load_trace(_write_jsonl(tmp_path / "t.jsonl", rows), tokenizer="bytes")
    assert [(r.priority, r.tier) for r in trace] == [(-3, 1), (0, 0)]
    trace.to_jsonl(tmp_path / "again.jsonl")
    again = load_trace(tmp_path / "again.jsonl", tokenizer="bytes")
    assert [(r.priority, r.tier) for r in again] == [(-3, 1), (0, 0)]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tier", -1, "tier"),
        ("tier", 99, "tier"),
        ("priority", 1.5, "priority"),
        ("priority", "x", "priority"),
    ],
)
def test_jsonl_bad_priority_or_tier_names_the_line(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    rows = [{"id": "a", "prompt_len": 5, "output_len": 2, field: value}]
    with pytest.raises(TraceFormatError, match=rf"line 1.*{message}"):
        load_trace(_write_jsonl(tmp_path / "t.jsonl", rows), tokenizer="bytes")


def test_csv_priority_and_tier_columns(tmp_path: Path) -> None:
    path = tmp_path / "az.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens,priority,tier\n"
        "2023-11-16 18:15:46.6805900,100,10,2,1\n"
        "2023-11-16 18:15:47.0000000,50,5,,\n"
    )
    trace = load_trace(path)
    assert [(r.priority, r.tier) for r in trace] == [(2, 1), (0, 0)]
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens,tier\n2023-11-16 18:15:46.68,100,10,-2\n"
    )
    with pytest.raises(TraceFormatError, match=r"row 2.*tier"):
        load_trace(path)


def test_priority_scheduling_serves_urgent_requests_first_in_the_simulator() -> None:
    reqs = tuple(
        TraceRequest(f"r{i}", 600, 60, arrival_time=0.0, priority=i % 2) for i in range(48)
    )
    trace = Trace("mixed", reqs)
    ttft = {}
    for policy in ("fcfs", "priority"):
        config = EngineConfig(max_num_seqs=8, scheduling_policy=policy)  # type: ignore[arg-type]
        metrics = request_metrics(run_simulated(config, trace))
        assert metrics["ok"].all()
        urgent = np.array([r.priority == 0 for r in reqs])
        ttft[policy] = (metrics["ttft"][urgent].mean(), metrics["ttft"][~urgent].mean())
    assert ttft["priority"][0] < ttft["fcfs"][0]
    assert ttft["priority"][0] < ttft["priority"][1] / 2  # all urgent ones went first


def test_summary_scores_each_tier_and_quotas_favour_tier_zero() -> None:
    reqs = tuple(
        TraceRequest(f"r{i}", 800, 80, arrival_time=0.0, tier=int(i % 4 != 0)) for i in range(48)
    )
    trace = Trace("two-tiers", reqs)
    slo = parse_slo("ttft=1500ms")
    scores = {}
    for name, extra in (("plain", {}), ("quotas", {"top_tier_token_share": 0.5})):
        config = EngineConfig(max_num_seqs=16, max_num_batched_tokens=2048, **extra)
        summary = summarize(run_simulated(config, trace), slo)
        tiers = summary["tiers"]
        assert set(tiers) == {"0", "1"}
        assert tiers["0"]["num_requests"] == 12 and tiers["1"]["num_requests"] == 36
        assert tiers["0"]["completed"] + tiers["1"]["completed"] == summary["completed"]
        assert "preemption_mix" in summary
        scores[name] = (tiers["0"]["slo_attainment"], tiers["1"]["slo_attainment"])
    assert scores["quotas"][0] > scores["plain"][0]  # tier 0 admitted first, its share kept
    one_tier = summarize(run_simulated(EngineConfig(), Trace("one", reqs[1:4])), slo)
    assert "tiers" not in one_tier  # all of tier 1: nothing to split
