"""The cluster simulation: one instance is the single engine; routers against brute force;
prefill/decode disaggregation's KV accounting."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from slotune.cluster import ClusterSpec, InstanceSpec, RouterSpec, get_link, run_cluster
from slotune.engine.config import EngineConfig
from slotune.engine.sim.capacity import kv_block_bytes
from slotune.engine.sim.models import get_model
from slotune.workloads import load_trace, run_simulated
from slotune.workloads.arrivals import ArrivalSpec

CFG = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=64)


@pytest.fixture(scope="module")
def chat():
    return load_trace("sharegpt-like").head(150)


@pytest.fixture(scope="module")
def agent():
    return load_trace("agent").head(120)


def _same(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert a.duration_s == b.duration_s


@pytest.mark.parametrize(
    "kw",
    [
        {"arrivals": ArrivalSpec(rate=20)},
        {"arrivals": ArrivalSpec()},
        {"arrivals": ArrivalSpec(rate=40), "timeout_s": 2.0},
        {"arrivals": ArrivalSpec(rate=40), "horizon_s": 3.0},
        {"arrivals": ArrivalSpec(rate=20), "stack": "eager"},
    ],
    ids=["rate", "burst", "timeout", "horizon", "eager"],
)
def test_one_instance_is_the_single_engine(chat, kw) -> None:
    stack = kw.pop("stack", None)
    single = run_simulated(CFG, chat, stack=stack, **kw)
    cluster = run_cluster(ClusterSpec((InstanceSpec(CFG, stack=stack),)), chat, **kw)
    _same(single, cluster.result)


@pytest.mark.parametrize(
    ("arrivals", "stack", "timeout"),
    [
        (ArrivalSpec(rate=4), None, 20.0),
        (ArrivalSpec(concurrency=6), "eager", 20.0),
    ],
    ids=["sessions", "capped"],
)
def test_one_instance_is_the_single_engine_with_sessions(agent, arrivals, stack, timeout) -> None:
    """(A known difference: under a concurrency cap on a schedule-ahead stack, a flow that
    a freed slot starts may join a step other than ``drive_engine``'s.)"""
    cfg = EngineConfig(prefix_caching="hash")
    single = run_simulated(cfg, agent, arrivals=arrivals, timeout_s=timeout, stack=stack)
    cluster = run_cluster(
        ClusterSpec((InstanceSpec(cfg, stack=stack),)), agent, arrivals=arrivals, timeout_s=timeout
    )
    _same(single, cluster.result)


@pytest.mark.parametrize("policy", ["least-outstanding", "least-kv", "prefix-aware"])
def test_stretches_change_nothing_in_a_cluster(agent, policy) -> None:
    spec = ClusterSpec.replicas(3, InstanceSpec(EngineConfig(prefix_caching="hash")), policy)
    fast = run_cluster(spec, agent, arrivals=ArrivalSpec(rate=6))
    slow = run_cluster(spec, agent, arrivals=ArrivalSpec(rate=6), stretches=False)
    _same(fast.result, slow.result)
    assert fast.decisions == slow.decisions


def test_round_robin_cycles(chat) -> None:
    c = run_cluster(ClusterSpec.replicas(3, InstanceSpec(CFG)), chat, arrivals=ArrivalSpec(rate=30))
    assert [d.instance for d in c.decisions] == [k % 3 for k in range(len(chat))]
    assert [x.routed for x in c.instances] == [50, 50, 50]


def _brute_outstanding(c, k: int) -> list[int]:
    """Requests sent to each instance before decision ``k`` and not answered in full by its
    time, from the client's records."""
    finish = c.result.requests["finish_time"].to_numpy()
    t = c.decisions[k].time
    counts = [0] * len(c.instances)
    for d in c.decisions[:k]:
        if not finish[d.index] <= t:
            counts[d.instance] += 1
    return counts


def test_least_outstanding_against_brute_force(chat) -> None:
    c = run_cluster(
        ClusterSpec.replicas(3, InstanceSpec(CFG), "least-outstanding"),
        chat,
        arrivals=ArrivalSpec(rate=60),
    )
    for k, d in enumerate(c.decisions):
        counts = _brute_outstanding(c, k)
        assert d.instance == counts.index(min(counts)), (k, counts)
    assert len({x.routed for x in c.instances}) > 1  # not a disguised round robin


def test_least_kv_against_brute_force(chat) -> None:
    c = run_cluster(
        ClusterSpec.replicas(2, InstanceSpec(CFG), "least-kv"), chat, arrivals=ArrivalSpec(rate=60)
    )
    steps = c.result.steps
    for k, d in enumerate(c.decisions):
        usage = []
        for j in range(2):
            mine = steps[(steps["instance"] == j) & (steps["time"] <= d.time)]
            usage.append(float(mine["kv_cache_usage"].iloc[-1]) if len(mine) else 0.0)
        counts = _brute_outstanding(c, k)
        best = min(range(2), key=lambda j: (usage[j], counts[j], j))
        assert d.instance == best, (k, usage, counts)


def test_prefix_aware_keeps_a_session_on_one_replica(agent) -> None:
    c = run_cluster(
        ClusterSpec.replicas(4, InstanceSpec(EngineConfig(prefix_caching="hash")), "prefix-aware"),
        agent,
        arrivals=ArrivalSpec(rate=2),
    )
    where = {d.index: d.instance for d in c.decisions}
    sessions: dict[str, set[int]] = {}
    for i, r in enumerate(agent.requests):
        sessions.setdefault(r.session_id or r.request_id, set()).add(where[i])
    assert all(len(s) == 1 for s in sessions.values())
    # later turns were sent for their prefix
    assert sum(d.reason == "prefix" for d in c.decisions) >= len(agent) - len(sessions)
    rr = run_cluster(
        ClusterSpec.replicas(4, InstanceSpec(EngineConfig(prefix_caching="hash")), "round-robin"),
        agent,
        arrivals=ArrivalSpec(rate=2),
    )
    hits = c.result.requests["cached_tokens"].sum()
    assert hits > rr.result.requests["cached_tokens"].sum()


def test_prefix_aware_leaves_a_session_only_for_load(agent) -> None:
    router = RouterSpec("prefix-aware", balance_abs=2, balance_rel=1.0)
    c = run_cluster(
        ClusterSpec.replicas(4, InstanceSpec(CFG), router), agent, arrivals=ArrivalSpec(rate=8)
    )
    where = {d.index: d for d in c.decisions}
    index = {r.request_id: i for i, r in enumerate(agent.requests)}
    prompts = c.result.requests["prompt_tokens"].to_numpy()
    moved = 0
    for i, r in enumerate(agent.requests):
        if r.parent_id is None:
            continue
        parent = index[r.parent_id]
        if where[i].instance != where[parent].instance:
            # for load, or to a replica matching as much (the parent's own tokens did not
            # fill a block of the router's)
            full = prompts[parent] // router.block_tokens * router.block_tokens
            assert where[i].reason == "balance" or where[i].matched_tokens >= full
            moved += where[i].reason == "balance"
    assert moved and len({d.instance for d in c.decisions}) == 4


def test_prefix_aware_gives_way_to_load(agent) -> None:
    """With no slack for imbalance every request goes to the least loaded replica."""
    router = RouterSpec("prefix-aware", balance_abs=0, balance_rel=1.0)
    c = run_cluster(
        ClusterSpec.replicas(3, InstanceSpec(CFG), router), agent, arrivals=ArrivalSpec(rate=8)
    )
    for k, d in enumerate(c.decisions):
        counts = _brute_outstanding(c, k)
        if max(counts) > min(counts):
            assert d.reason == "balance" and d.instance == counts.index(min(counts))


@pytest.mark.parametrize("dtype", ["auto", "fp8"])
def test_kv_transfer_moves_the_prompts_kv(chat, dtype) -> None:
    cfg = EngineConfig(kv_cache_dtype=dtype)
    link = get_link("rdma")
    spec = ClusterSpec.disaggregate(InstanceSpec(cfg, tp=2), 1, InstanceSpec(cfg), 2, link=link)
    c = run_cluster(spec, chat.head(40), arrivals=ArrivalSpec(rate=5))
    model = get_model("llama-3-8b")
    prompts = c.result.requests["prompt_tokens"].to_numpy()
    per_token = (
        model.kv_bytes_per_token
        if dtype == "auto"
        else kv_block_bytes(model, 1, cfg.block_size, dtype) / cfg.block_size
    )
    assert len(c.transfers) == 40
    requests = c.result.requests
    for tr in c.transfers:
        assert tr.num_bytes == pytest.approx(prompts[tr.index] * per_token)
        # one lane: the decode side has tp 1
        assert tr.end - tr.start == pytest.approx(link.seconds(tr.num_bytes))
        # the first token comes from the decode instance after the KV landed
        assert requests["first_token_time"][tr.index] > tr.end
    if dtype == "fp8":
        assert per_token < model.kv_bytes_per_token / 1.9


def test_disaggregated_requests_finish_with_all_their_tokens(chat) -> None:
    spec = ClusterSpec.disaggregate(InstanceSpec(CFG), 1, InstanceSpec(CFG), 1, link="tcp")
    c = run_cluster(spec, chat, arrivals=ArrivalSpec(rate=10))
    r = c.result.requests
    assert r["error"].isna().all()
    assert (r["output_tokens"].to_numpy() == [q.output_len for q in chat.requests]).all()
    lengths = [len(ts) for ts in r["token_times"]]
    assert lengths == [q.output_len for q in chat.requests]
    # the prefill instance computes every prompt and nothing else; the decode instance
    # one token of each prompt (the last, for its logits) and the outputs after the first
    steps = c.result.steps
    pre, dec = steps[steps["instance"] == 0], steps[steps["instance"] == 1]
    assert pre["num_scheduled_tokens"].sum() == sum(q.prompt_len for q in chat.requests)
    assert dec["num_scheduled_tokens"].sum() == sum(q.output_len for q in chat.requests)
    assert not math.isnan(c.result.duration_s)


@pytest.mark.parametrize(
    "kw",
    [{"timeout_s": 4.0}, {"horizon_s": 15.0}],
    ids=["timeout", "horizon"],
)
def test_disaggregated_sessions_do_not_depend_on_stretches(agent, kw) -> None:
    spec = ClusterSpec.disaggregate(
        InstanceSpec(EngineConfig(prefix_caching="hash")),
        2,
        InstanceSpec(CFG),
        2,
        router="prefix-aware",
        link="tcp",
    )
    fast = run_cluster(spec, agent, arrivals=ArrivalSpec(rate=10), **kw)
    slow = run_cluster(spec, agent, arrivals=ArrivalSpec(rate=10), stretches=False, **kw)
    _same(fast.result, slow.result)
    assert fast.transfers == slow.transfers
    done = fast.result.requests["error"].isna()
    assert done.sum() > len(agent) // 2
    # a later turn hits the prefix cache of the prefill instance its session went to
    assert fast.result.requests["cached_tokens"][done].sum() > 0
