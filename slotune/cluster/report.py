"""What a deployment's run says, as plain data (for the terminal and ``deployment.json``):
its instance kinds, per-instance utilization, KV transfers, router decisions, where the
SLO was lost, and its scores."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from slotune.cluster.run import ClusterResult
    from slotune.cluster.search import Scored
    from slotune.cluster.spec import ClusterSpec, InstanceSpec
    from slotune.workloads.slo import SLO

_TUNED = ("max_num_batched_tokens", "max_num_seqs")


def instance_kinds(spec: ClusterSpec) -> list[tuple[InstanceSpec, int]]:
    """Each distinct instance with how many of it, in order of first appearance."""
    counts = Counter(spec.instances)
    return [(inst, counts[inst]) for inst in dict.fromkeys(spec.instances)]


def describe(spec: ClusterSpec) -> str:
    """``4 × mixed TP2`` or ``3 × prefill TP1 + 1 × decode TP1``, with the router."""
    kinds = " + ".join(
        f"{n} × {i.role} TP{i.tp}" + (f" PP{i.pp}" if i.pp > 1 else "")
        for i, n in instance_kinds(spec)
    )
    link = f", KV over {spec.link.name}" if spec.disaggregated else ""
    return f"{kinds} ({spec.num_gpus} GPUs; router {spec.router.policy}{link})"


def serving_instance(run: ClusterResult) -> list[int]:
    """Which instance answered each request (its decode instance when disaggregated; -1:
    never routed)."""
    where = [-1] * len(run.result.requests)
    for d in run.decisions:
        where[d.index] = d.instance
    for t in run.transfers:
        where[t.index] = t.decode
    return where


def slo_losses(run: ClusterResult, slo: SLO) -> dict[str, int]:
    """How many requests missed each per-request target (a request may miss several), and
    how many failed outright."""
    return {k: int(v.sum()) for k, v in _misses(run, slo).items()}


def _misses(run: ClusterResult, slo: SLO) -> dict[str, np.ndarray]:
    r = run.result.requests
    ok = r["error"].isna().to_numpy()
    ttft = (r["first_token_time"] - r["arrival_time"]).to_numpy() * 1e3
    out = r["output_tokens"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(
            out > 1,
            (r["finish_time"] - r["first_token_time"]).to_numpy() * 1e3 / (out - 1),
            0.0,
        )
    e2e = (r["finish_time"] - r["arrival_time"]).to_numpy() * 1e3
    values = {"ttft": ttft, "tpot": tpot, "e2e": e2e}
    losses = {"failed": ~ok}
    for t in slo.targets:
        if t.metric in values:
            losses[t.metric] = ok & (values[t.metric] > t.threshold_ms)
    return losses


def slo_losses_by_instance(run: ClusterResult, slo: SLO) -> dict[int, dict[str, int]]:
    """``slo_losses`` per answering instance (only instances that lost some)."""
    where = np.array(serving_instance(run))
    out = {}
    for x in run.instances:
        mine = where == x.index
        lost = {k: int((v & mine).sum()) for k, v in _misses(run, slo).items()}
        if any(lost.values()):
            out[x.index] = lost
    return out


def run_report(scored: Scored, slo: SLO) -> dict[str, Any]:
    """The deployment, its scores and what happened inside its run."""
    spec, run = scored.spec, scored.run
    s = scored.summary
    out: dict[str, Any] = {
        "deployment": describe(spec),
        "gpus": spec.num_gpus,
        "goodput": scored.goodput,
        "goodput_per_gpu": scored.per_gpu,
        "slo_attainment": scored.attainment,
        "feasible": scored.feasible,
        "ttft_p99_ms": s["ttft_ms"].get("p99"),
        "tpot_p99_ms": s["tpot_ms"].get("p99"),
        "instances": [
            {
                "role": i.role,
                "count": n,
                "tp": i.tp,
                "pp": i.pp,
                "gpu": i.gpu,
                "model": i.model,
                **{k: getattr(i.config, k) for k in _TUNED},
            }
            for i, n in instance_kinds(spec)
        ],
        "router": {
            "policy": spec.router.policy,
            **(
                {
                    "balance_abs": spec.router.balance_abs,
                    "balance_rel": spec.router.balance_rel,
                    "cache_threshold": spec.router.cache_threshold,
                    "block_tokens": spec.router.block_tokens,
                }
                if spec.router.policy == "prefix-aware"
                else {}
            ),
        },
        "link": (
            {
                "name": spec.link.name,
                "bandwidth_gb_s": spec.link.bandwidth_bytes_s / 1e9,
                "latency_us": spec.link.latency_s * 1e6,
            }
            if spec.disaggregated
            else None
        ),
    }
    if run is None:
        return out
    duration = run.result.duration_s
    out["utilization"] = [
        {
            "instance": x.index,
            "role": x.role,
            "busy_share": x.busy_s / duration if duration > 0 else 0.0,
            "steps": x.num_steps,
            "requests": x.routed,
        }
        for x in run.instances
    ]
    out["router_decisions"] = dict(Counter(d.reason for d in run.decisions))
    if run.transfers:
        secs = np.array([t.end - t.start for t in run.transfers])
        out["kv_transfers"] = {
            "count": len(run.transfers),
            "gib": float(sum(t.num_bytes for t in run.transfers)) / 2**30,
            "mean_ms": float(secs.mean() * 1e3),
            "p99_ms": float(np.percentile(secs, 99) * 1e3),
        }
    out["slo_lost"] = slo_losses(run, slo)
    out["slo_lost_by_instance"] = slo_losses_by_instance(run, slo)
    return out
