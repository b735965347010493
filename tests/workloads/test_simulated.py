"""The runner on the real engine core with the simulated executor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slotune.engine import EngineConfig
from slotune.workloads import (
    ArrivalSpec,
    Trace,
    TraceRequest,
    load_trace,
    parse_slo,
    run_simulated,
    summarize,
)


def _mooncake(tmp_path: Path) -> Path:
    rows = [
        {"timestamp": 0, "input_length": 1300, "output_length": 8, "hash_ids": [1, 2, 3]},
        {"timestamp": 2000, "input_length": 1100, "output_length": 8, "hash_ids": [1, 2, 4]},
        {"timestamp": 4000, "input_length": 700, "output_length": 8, "hash_ids": [1, 5]},
        {"timestamp": 6000, "input_length": 900, "output_length": 8, "hash_ids": [6, 7]},
    ]
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_mooncake_hash_ids_become_prefix_cache_hits(tmp_path: Path, cache: str) -> None:
    trace = load_trace(_mooncake(tmp_path))
    arrivals = ArrivalSpec(timestamps=True)
    res = run_simulated(EngineConfig(prefix_caching=cache), trace, arrivals=arrivals)
    cached = res.requests.set_index("request_id")["cached_tokens"]
    assert cached["mc0"] == 0
    assert cached["mc1"] == 1024  # blocks 1 and 2
    assert cached["mc2"] == 512  # block 1
    assert cached["mc3"] == 0
    s = summarize(res)
    assert s["prefix_cache_hit_rate"] > 0.3
    off = run_simulated(EngineConfig(prefix_caching="none"), trace, arrivals=arrivals)
    assert off.requests["cached_tokens"].sum() == 0
    assert summarize(off)["prefix_cache_hit_rate"] == 0.0


def _mixed_trace(n: int = 200, seed: int = 0) -> Trace:
    """Short chats decoding while long prompts (3-6k tokens) keep arriving."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        prompt = int(rng.integers(3000, 6000)) if i % 10 == 0 else int(rng.integers(50, 300))
        reqs.append(
            TraceRequest(
                request_id=f"r{i}", prompt_len=prompt, output_len=int(rng.integers(100, 300))
            )
        )
    return Trace(name="mixed", requests=tuple(reqs))


def test_chunked_prefill_lowers_p99_tpot_on_long_prompts() -> None:
    trace = _mixed_trace()
    arrivals = ArrivalSpec(rate=8)
    chunked = EngineConfig(policy="chunked", max_num_batched_tokens=512, max_model_len=8192)
    whole = EngineConfig(policy="prefill_first", max_num_batched_tokens=8192, max_model_len=8192)
    a = summarize(run_simulated(chunked, trace, arrivals=arrivals, seed=1))
    b = summarize(run_simulated(whole, trace, arrivals=arrivals, seed=1))
    assert a["completed"] == b["completed"] == len(trace)
    assert a["tpot_ms"]["p99"] < b["tpot_ms"]["p99"]
    assert a["itl_ms"]["p99"] < b["itl_ms"]["p99"]  # no decode step waits for a whole prompt


def test_agent_sessions_on_the_simulator_are_closed_loop() -> None:
    trace = load_trace("agent", num_requests=60)
    res = run_simulated(EngineConfig(), trace, arrivals=ArrivalSpec(concurrency=4))
    df = res.requests.set_index("request_id")
    assert df["error"].isna().all()
    for r in trace:
        if r.parent_id is not None:
            start = df.loc[r.request_id, "arrival_time"]
            assert start >= df.loc[r.parent_id, "finish_time"] + r.think_time_s - 1e-9
            # the turn's prompt holds the parent's prompt and its actual answer
            assert df.loc[r.request_id, "prompt_tokens"] == (
                df.loc[r.parent_id, "prompt_tokens"]
                + df.loc[r.parent_id, "output_tokens"]
                + r.prompt_len
            )
    s = summarize(res, parse_slo("ttft=2s,tpot=100ms"))
    assert s["prefix_cache_hit_rate"] > 0.5  # system prompt, tools and history are reused
    assert s["slo_attainment"] > 0.5


def test_simulated_run_is_deterministic_and_virtual() -> None:
    trace = load_trace("sharegpt-like", num_requests=100)
    cfg = EngineConfig(max_num_batched_tokens=1024)
    a = run_simulated(cfg, trace, arrivals=ArrivalSpec(rate=20, burstiness=0.5), seed=3)
    b = run_simulated(cfg, trace, arrivals=ArrivalSpec(rate=20, burstiness=0.5), seed=3)
    assert a.requests["token_times"].tolist() == b.requests["token_times"].tolist()
    assert (a.requests["output_tokens"] == [r.output_len for r in trace]).all()
    assert a.steps["duration_s"].sum() <= a.duration_s + 1e-9
    assert (a.steps["num_scheduled_tokens"] <= 1024).all()


@pytest.mark.parametrize("stretches", [True, False])
def test_timeouts_on_the_simulated_engine_fail_at_the_deadline_and_free_blocks(
    stretches: bool,
) -> None:
    trace = load_trace("sharegpt-like", num_requests=150)
    cfg = EngineConfig(max_num_batched_tokens=512, max_num_seqs=16)
    res = run_simulated(
        cfg, trace, arrivals=ArrivalSpec(rate=60), timeout_s=2.0, stretches=stretches
    )
    df = res.requests
    timed_out = df["error"] == "timeout"
    assert 0 < timed_out.sum() < len(df)  # overloaded: some give up, some are served
    assert df["error"][~timed_out].isna().all()
    deadline = df["arrival_time"] + 2.0
    assert np.allclose(df["finish_time"][timed_out], deadline[timed_out])
    assert (df["finish_time"][~timed_out] <= deadline[~timed_out] + 1e-9).all()
    assert all(
        not ts or ts[-1] <= d + 1e-9 for ts, d in zip(df["token_times"], deadline, strict=True)
    )
    assert (df["output_tokens"] == [len(ts) for ts in df["token_times"]]).all()
    stats = res.engine_stats
    assert stats["num_free_blocks"] == stats["num_total_blocks"]  # aborts freed every block
    assert summarize(res)["failed"] == timed_out.sum()


def test_timeouts_are_the_same_with_and_without_stretches() -> None:
    trace = load_trace("sharegpt-like", num_requests=120)
    cfg = EngineConfig(max_num_batched_tokens=512, max_num_seqs=16)
    runs = [
        run_simulated(cfg, trace, arrivals=ArrivalSpec(rate=50), timeout_s=1.5, stretches=on)
        for on in (True, False)
    ]
    a, b = (r.requests for r in runs)
    assert a["error"].tolist() == b["error"].tolist()
    assert a["token_times"].tolist() == b["token_times"].tolist()


def test_a_horizon_stops_the_run_and_fails_what_is_in_flight() -> None:
    trace = load_trace("sharegpt-like", num_requests=300)
    cfg = EngineConfig(max_num_batched_tokens=512, max_num_seqs=16)
    spec = ArrivalSpec(rate=40)
    full = run_simulated(cfg, trace, arrivals=spec).requests
    cut = run_simulated(cfg, trace, arrivals=spec, horizon_s=8.0)
    df = cut.requests
    unfinished = df["error"] == "unfinished when the run ended"
    assert unfinished.sum() > 0 and (full["finish_time"][unfinished] > 8.0).all()
    assert (df["finish_time"][unfinished] >= 8.0).all()
    assert (df["output_tokens"] == [len(ts) for ts in df["token_times"]]).all()
    sent = df["arrival_time"].notna()
    assert (full["arrival_time"][~sent] > 8.0).all(), "only arrivals after the stop go unsent"
    done = sent & ~unfinished
    for column in ("arrival_time", "finish_time", "token_times"):
        assert df[column][done].tolist() == full[column][done].tolist()
    assert cut.duration_s < full["finish_time"].max()
