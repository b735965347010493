"""A request's priority and tier: read from traces, kept, and used by the simulated engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slotune.engine import EngineConfig
from slotune.workloads import TraceFormatError, load_trace
from slotune.workloads.metrics import request_metrics
from slotune.workloads.runner.engine_loop import run_simulated
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
