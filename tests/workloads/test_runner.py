"""The runner's bookkeeping, driven against a tiny fake engine on the virtual clock."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from slotune.workloads import (
    ArrivalSpec,
    Trace,
    TraceRequest,
    agent_sessions,
    parse_slo,
    summarize,
)
from slotune.workloads.arrivals import ALL_AT_ONCE
from slotune.workloads.generators import AgentParams, LengthDist
from slotune.workloads.runner.engine_loop import VirtualClock, drive_engine, run_engine

from .conftest import FakeEngine


def _simple_trace(n: int = 20, prompt: int = 40, output: int = 8) -> Trace:
    reqs = tuple(
        TraceRequest(request_id=f"r{i}", prompt_len=prompt, output_len=output) for i in range(n)
    )
    return Trace(name="t", requests=reqs)


def _run(trace: Trace, arrivals: ArrivalSpec, engine: FakeEngine | None = None):
    engine = engine or FakeEngine()
    return engine, drive_engine(engine, trace, arrivals, VirtualClock())


def test_every_request_finishes_with_its_output_length() -> None:
    _, res = _run(_simple_trace(), ArrivalSpec(rate=50, burstiness=0.5))
    df = res.requests
    assert df["error"].isna().all()
    assert (df["output_tokens"] == 8).all()
    assert all(len(ts) == 8 for ts in df["token_times"])
    assert (df["first_token_time"] > df["arrival_time"]).all()
    assert (df["finish_time"] >= df["first_token_time"]).all()
    assert res.duration_s == pytest.approx(df["finish_time"].max())


def test_virtual_clock_does_not_sleep_and_advances_by_step_durations() -> None:
    trace = _simple_trace(n=5)
    started = time.perf_counter()
    engine, res = _run(trace, ArrivalSpec(rate=0.01, constant=True))  # 100 s apart
    assert time.perf_counter() - started < 5.0  # hundreds of virtual seconds, no sleeping
    assert res.duration_s > 400
    assert len(res.steps) == 5 * 8
    # the idle engine jumps to each arrival: first token = arrival + prefill step
    prefill_step = engine.base_s + engine.per_token_s * 40
    ttft = res.requests["first_token_time"] - res.requests["arrival_time"]
    assert np.allclose(ttft, prefill_step)
    assert res.steps["time"].is_monotonic_increasing


def test_arrival_during_a_step_keeps_its_true_arrival_time() -> None:
    engine, res = _run(_simple_trace(n=30), ArrivalSpec(rate=400))
    for rid, (_, arrival) in engine.added.items():
        assert arrival == pytest.approx(
            res.requests.set_index("request_id").loc[rid, "arrival_time"]
        )
    df = res.requests
    # requests added at a step boundary after they arrived: their waiting counts in TTFT
    assert (df["first_token_time"] - df["arrival_time"] >= engine.base_s - 1e-12).all()


def test_closed_loop_concurrency_caps_requests_in_flight() -> None:
    _, res = _run(_simple_trace(n=24), ArrivalSpec(concurrency=3))
    df = res.requests.sort_values("arrival_time")
    events = [(t, 1) for t in df["arrival_time"]] + [(t, -1) for t in df["finish_time"]]
    in_flight = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # finishes before starts at a tie
        in_flight += delta
        peak = max(peak, in_flight)
    assert peak == 3
    # each new request starts exactly when an earlier one finished
    finishes = set(np.round(df["finish_time"], 9))
    later = df["arrival_time"].iloc[3:]
    assert all(round(t, 9) in finishes for t in later)


def _agent_trace() -> Trace:
    params = AgentParams(
        num_sessions=6,
        turns=(3, 4),
        num_agents=2,
        system_prompt_len=64,
        tools_len=64,
        task=LengthDist(20, 0.3, 8, 64),
        tool_result=LengthDist(30, 0.3, 8, 64),
        output=LengthDist(6, 0.3, 2, 12),
    )
    return agent_sessions(params, seed=3)


def test_agent_turns_start_after_previous_turn_ends_plus_tool_time() -> None:
    trace = _agent_trace()
    _, res = _run(trace, ArrivalSpec())
    df = res.requests.set_index("request_id")
    checked = 0
    for r in trace:
        if r.parent_id is None:
            continue
        parent_end = df.loc[r.parent_id, "finish_time"]
        assert df.loc[r.request_id, "arrival_time"] >= parent_end + r.think_time_s - 1e-9
        assert df.loc[r.request_id, "arrival_time"] == pytest.approx(parent_end + r.think_time_s)
        checked += 1
    assert checked >= 12


def test_turn_prompt_is_parent_prompt_plus_actual_output_plus_own_tokens() -> None:
    trace = _agent_trace()
    engine, _ = _run(trace, ArrivalSpec(concurrency=2))
    own = trace.own_prompt_token_ids()
    by_id = {r.request_id: i for i, r in enumerate(trace)}
    for r in trace:
        prompt, _ = engine.added[r.request_id]
        if r.parent_id is None:
            assert prompt == own[by_id[r.request_id]]
            continue
        parent_prompt, _ = engine.added[r.parent_id]
        parent_out = [1000 + k for k in range(trace.requests[by_id[r.parent_id]].output_len)]
        assert prompt == parent_prompt + parent_out + own[by_id[r.request_id]]
    # sessions of the same agent share the system prompt and tools: real prefix hits
    assert engine.stats()["prefix_cache_hit_tokens"] > 0


def test_concurrency_counts_sessions_not_turns() -> None:
    trace = _agent_trace()
    _, res = _run(trace, ArrivalSpec(concurrency=2))
    df = res.requests
    spans = df.groupby("session_id").agg(start=("arrival_time", "min"), end=("finish_time", "max"))
    events = sorted(
        [(t, 1) for t in spans["start"]] + [(t, -1) for t in spans["end"]],
        key=lambda e: (e[0], e[1]),
    )
    active = peak = 0
    for _, d in events:
        active += d
        peak = max(peak, active)
    assert peak == 2


def test_rejected_request_is_recorded_and_the_run_continues() -> None:
    reqs = [
        TraceRequest(request_id=f"r{i}", prompt_len=5000 if i == 2 else 30, output_len=4)
        for i in range(6)
    ]
    _, res = _run(Trace(name="t", requests=tuple(reqs)), ArrivalSpec(rate=10))
    df = res.requests.set_index("request_id")
    assert df.loc["r2", "error"].startswith("rejected:")
    assert df.drop(index="r2")["error"].isna().all()
    s = summarize(res)
    assert (s["completed"], s["failed"]) == (5, 1)


def test_prompt_tokens_are_checked_once_per_trace_and_bad_ones_still_rejected() -> None:
    """Drawn prompts and a trace's valid given ids skip the engine's per-request token
    check; a trace with a bad given id leaves every given prompt to the engine, which
    rejects the bad one as before; a later turn's prompt (with output) is always checked."""
    drawn = [TraceRequest(request_id=f"d{i}", prompt_len=20, output_len=3) for i in range(3)]
    given = [TraceRequest(request_id="g0", prompt_len=3, output_len=3, prompt_token_ids=(5, 6, 7))]
    engine, _ = _run(Trace(name="t", requests=(*drawn, *given)), ArrivalSpec(rate=10))
    assert engine.tokens_checked == {"d0": True, "d1": True, "d2": True, "g0": True}

    bad = TraceRequest(request_id="b0", prompt_len=2, output_len=3, prompt_token_ids=(1, -2))
    trace = Trace(name="t", requests=(*drawn, *given, bad))
    assert trace.prompts_checked() == [True, True, True, False, False]
    from slotune.engine.config import EngineConfig
    from slotune.workloads import run_simulated

    res = run_simulated(EngineConfig(num_gpu_blocks=64), trace, arrivals=ArrivalSpec(rate=10))
    df = res.requests.set_index("request_id")
    assert "non-negative integers" in df.loc["b0", "error"]
    assert df.drop(index="b0")["error"].isna().all()

    turns = agent_sessions(AgentParams(num_sessions=2, turns=(3, 3)))
    engine, _ = _run(turns, ArrivalSpec(rate=10), FakeEngine(max_len=1 << 16))
    later = {r.request_id for r in turns.requests if r.parent_id is not None}
    assert later and not any(engine.tokens_checked[rid] for rid in later)
    assert all(v for rid, v in engine.tokens_checked.items() if rid not in later)


def test_timestamps_with_time_scale() -> None:
    reqs = tuple(
        TraceRequest(request_id=f"r{i}", prompt_len=10, output_len=2, arrival_time=10.0 + i)
        for i in range(4)
    )
    _, res = _run(Trace(name="t", requests=reqs), ArrivalSpec(timestamps=True, time_scale=0.5))
    assert res.requests["arrival_time"].tolist() == [0.0, 0.5, 1.0, 1.5]


def test_steps_table_matches_engine_steps() -> None:
    engine, res = _run(_simple_trace(n=10), ArrivalSpec())
    assert len(res.steps) == engine.stats()["steps"]
    assert (
        res.steps["num_scheduled_tokens"]
        == res.steps["num_prefill_tokens"] + res.steps["num_decode_tokens"]
    ).all()
    assert res.steps["duration_s"].sum() == pytest.approx(res.duration_s)


def test_wall_clock_runner_records_real_times() -> None:
    engine = FakeEngine(base_s=0.0, per_token_s=0.0)
    res = run_engine(engine, _simple_trace(n=4, output=3), ArrivalSpec(rate=50, constant=True))
    df = res.requests
    assert df["error"].isna().all()
    assert (df["first_token_time"] >= df["arrival_time"]).all()
    assert df["arrival_time"].tolist() == pytest.approx([0.0, 0.02, 0.04, 0.06])
    assert res.duration_s >= 0.06


def test_rate_and_concurrency_together() -> None:
    from slotune.workloads import arrival_times

    spec = ArrivalSpec(rate=200, concurrency=2)
    _, res = _run(_simple_trace(n=12), spec)
    df = res.requests
    scheduled = arrival_times(spec, 12, seed=0)
    assert (df["arrival_time"].to_numpy() >= np.array(scheduled) - 1e-12).all()
    events = sorted(
        [(t, 1) for t in df["arrival_time"]] + [(t, -1) for t in df["finish_time"]],
        key=lambda e: (e[0], e[1]),
    )
    active = peak = 0
    for _, d in events:
        active += d
        peak = max(peak, active)
    assert peak == 2
    # a request held back by the cap starts when a slot frees, not at its scheduled time
    assert (df["arrival_time"].to_numpy() > np.array(scheduled) + 1e-9).any()


def test_timeout_on_the_virtual_clock_gives_up_at_the_deadline_and_aborts() -> None:
    # one step costs 0.01 s + 0.0001 s per token: r0's first token (after a 40-token prefill)
    # comes at 0.014 s, then one every 0.0101 s; 49 tokens come by its 0.5 s deadline
    reqs = (
        TraceRequest(request_id="r0", prompt_len=40, output_len=100),
        TraceRequest(request_id="r1", prompt_len=40, output_len=5),
    )
    engine = FakeEngine()
    res = drive_engine(
        engine,
        Trace(name="t", requests=reqs),
        ArrivalSpec(rate=1, constant=True),
        VirtualClock(),
        timeout_s=0.5,
    )
    df = res.requests.set_index("request_id")
    assert df.loc["r0", "error"] == "timeout"
    assert df.loc["r0", "finish_time"] == pytest.approx(0.5)
    assert df.loc["r0", "output_tokens"] == 49
    assert df.loc["r0", "token_times"][-1] <= 0.5 < df.loc["r0", "token_times"][-1] + 0.0101
    assert engine.aborted == ["r0"]  # aborted at the first step boundary after 0.5 s
    assert pd.isna(df.loc["r1", "error"]) and df.loc["r1", "output_tokens"] == 5
    assert not engine.has_unfinished_requests()
    s = summarize(res, parse_slo("e2e=10s"))
    assert (s["failed"], s["slo_attainment"], s["errors"]) == (1, 0.5, {"timeout": 1})


def test_a_request_finishing_after_its_deadline_timed_out() -> None:
    # 8 tokens: the last comes at 0.014 + 7 * 0.0101 = 0.0847 s, after a 0.08 s deadline
    engine = FakeEngine()
    res = drive_engine(engine, _simple_trace(n=1), ALL_AT_ONCE, VirtualClock(), timeout_s=0.08)
    row = res.requests.iloc[0]
    assert (row["error"], row["finish_time"], row["output_tokens"]) == ("timeout", 0.08, 7)
    assert engine.aborted == []  # it had finished in the engine: nothing to abort


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout: must be a positive number"):
        drive_engine(FakeEngine(), _simple_trace(n=1), ALL_AT_ONCE, VirtualClock(), timeout_s=0)
