"""Generators and the bundled traces."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from slotune.engine import EngineConfig
from slotune.workloads import (
    BUNDLED,
    AgentParams,
    ArrivalSpec,
    ClippedNormal,
    SharedPrefixParams,
    agent_sessions,
    inference_perf_shared_prefix,
    load_trace,
    reasoning,
    run_simulated,
    shared_prefix,
    sharegpt_like,
    summarize,
)
from slotune.workloads.load import bundled_path


def test_sharegpt_like_matches_published_means() -> None:
    trace = sharegpt_like(2000, seed=5)
    p = np.array([r.prompt_len for r in trace])
    o = np.array([r.output_len for r in trace])
    assert 200 < p.mean() < 260 and 170 < o.mean() < 230
    assert p.min() >= 4 and p.max() <= 1024 and (p + o).max() <= 2048 and o.min() >= 4


def test_generators_are_deterministic() -> None:
    a, b = agent_sessions(seed=3), agent_sessions(seed=3)
    assert a.requests == b.requests
    assert a.own_prompt_token_ids() == b.own_prompt_token_ids()
    assert agent_sessions(seed=4).requests != a.requests


def test_agent_sessions_share_system_prompt_and_tools_across_sessions() -> None:
    params = AgentParams(num_sessions=6, num_agents=2, system_prompt_len=100, tools_len=50)
    trace = agent_sessions(params, seed=1)
    firsts = [i for i, r in enumerate(trace) if r.turn == 0]
    ids = trace.own_prompt_token_ids()
    # sessions 0, 2, 4 use agent 0; 1, 3, 5 agent 1
    assert ids[firsts[0]][:150] == ids[firsts[2]][:150] == ids[firsts[4]][:150]
    assert ids[firsts[0]][:150] != ids[firsts[1]][:150]
    assert ids[firsts[0]][150:] != ids[firsts[2]][150:]  # each task is its own
    later = [r for r in trace if r.turn > 0]
    assert later and all(r.parent_id and r.think_time_s > 0 for r in later)
    assert (
        max(trace.full_prompt_lengths()) + max(r.output_len for r in trace)
        <= params.max_context_len + 2048
    )


def test_shared_prefix_groups() -> None:
    trace = shared_prefix(num_groups=3, requests_per_group=4, system_prompt_len=64, seed=0)
    ids = trace.own_prompt_token_ids()
    groups: dict[str, list[list[int]]] = {}
    for r, x in zip(trace, ids, strict=True):
        groups.setdefault(r.request_id.split("-")[0], []).append(x)
    assert len(groups) == 3
    for members in groups.values():
        assert all(m[:64] == members[0][:64] for m in members)
    assert trace.stats()["prefix_sharing_ratio"] > 0.2


@pytest.mark.parametrize("name", list(BUNDLED))
def test_bundled_traces_load_with_stats(name: str) -> None:
    trace = load_trace(name)
    stats = trace.stats()
    assert trace.name == name and stats["requests"] == len(trace) >= 200
    assert bundled_path(name).stat().st_size < 100_000
    if name in ("agent", "shared-prefix", "shared-prefix-chat", "agent-tiers"):
        assert stats["prefix_sharing_ratio"] > 0.5
    if name == "agent-tiers":  # the agent sessions, each session in one tier
        agent = load_trace("agent")
        assert [replace(r, tier=0, priority=0) for r in trace] == list(agent.requests)
        tier_of: dict[str, set[int]] = {}
        for r in trace:
            tier_of.setdefault(r.session_id or "", set()).add(r.tier)
        tiers = [t for ts in tier_of.values() for t in ts]
        assert all(len(ts) == 1 for ts in tier_of.values())
        assert 0.1 < tiers.count(0) / len(tiers) < 0.4 and set(tiers) == {0, 1}
    if name == "reasoning":
        assert stats["prompt_len"]["mean"] < 400 and stats["output_len"]["mean"] > 3000
    if name == "agent":
        assert stats["sessions"] >= 32
    if name == "sharegpt-like":
        assert 200 < stats["prompt_len"]["mean"] < 260 and 170 < stats["output_len"]["mean"] < 230
    assert max(trace.full_prompt_lengths()) <= 8192
    assert load_trace(name, num_requests=50).requests == trace.requests[:50]


def test_bundled_files_match_the_generator_script(tmp_path) -> None:
    import importlib.util
    from pathlib import Path

    script = Path(__file__).parents[2] / "traces" / "make_traces.py"
    spec = importlib.util.spec_from_file_location("make_traces", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in BUNDLED:
        assert (tmp_path / f"{name}.jsonl").read_text() == bundled_path(name).read_text()


def test_reasoning_has_short_prompts_and_long_outputs() -> None:
    trace = reasoning(2000, seed=2)
    p = np.array([r.prompt_len for r in trace])
    o = np.array([r.output_len for r in trace])
    assert 150 < p.mean() < 300 and 3000 < o.mean() < 5000
    assert o.min() >= 512 and (p + o).max() <= 18432


def test_clipped_normal_lengths() -> None:
    rng = np.random.default_rng(0)
    x = ClippedNormal(200, 50, 100, 260).sample(rng, 20_000)
    assert x.min() == 100 and x.max() == 260
    assert ClippedNormal(50).sample(rng, 3).tolist() == [50, 50, 50]
    with pytest.raises(ValueError, match="ClippedNormal"):
        ClippedNormal(10, low=20, high=5)


def test_inference_perf_shared_prefix_single_turn() -> None:
    trace = inference_perf_shared_prefix(SharedPrefixParams(num_groups=3, num_prompts_per_group=4))
    assert len(trace) == 12 and all(r.session_id is None for r in trace)
    assert all((r.prompt_len, r.output_len) == (150, 50) for r in trace)  # defaults: 100 + 50
    systems: dict[int, int] = {}
    for r in trace:
        (system, n), (_, q) = r.prompt_segments
        assert (n, q) == (100, 50)
        systems[system] = systems.get(system, 0) + 1
    assert sorted(systems.values()) == [4, 4, 4]  # each system prompt shared by its 4 users


def test_inference_perf_shared_prefix_multi_turn_sessions() -> None:
    params = SharedPrefixParams(
        num_groups=2,
        num_prompts_per_group=3,
        question_len=ClippedNormal(40, 10, 20, 60),
        output_len=ClippedNormal(30, 5, 10, 50),
        multi_turn=True,
        num_turns=3,
    )
    trace = inference_perf_shared_prefix(params, seed=4)
    assert len(trace) == 18 and len({r.session_id for r in trace}) == 6
    index = {r.request_id: r for r in trace}
    full = dict(zip(index, trace.full_prompt_lengths(), strict=True))
    for r in trace:
        if r.turn == 0:
            assert r.parent_id is None and r.prompt_segments[0][1] == 100
        else:
            parent = index[r.parent_id]
            assert parent.turn == r.turn - 1 and parent.session_id == r.session_id
            # each round sends the user's question again after the history
            assert r.prompt_segments == parent.prompt_segments[-1:]
            assert full[r.request_id] == full[parent.request_id] + parent.output_len + r.prompt_len
    with pytest.raises(ValueError, match="num_turns"):
        SharedPrefixParams(num_turns=2)


def test_shared_prefix_chat_hits_the_prefix_cache() -> None:
    trace = load_trace("shared-prefix-chat", num_requests=120)
    cfg = EngineConfig(prefix_caching="hash")
    s = summarize(run_simulated(cfg, trace, arrivals=ArrivalSpec(concurrency=16)))
    assert s["completed"] == 120 and s["prefix_cache_hit_rate"] > 0.6
