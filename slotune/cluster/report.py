"""What a deployment's run says, as plain data (for the terminal, ``deployment.json`` and
its HTML report, ``slotune.reports.deploy``): its instance kinds, per-instance
utilization, KV transfers, router decisions, where the SLO was lost (per instance kind and,
disaggregated, per phase of the TTFT), and its scores."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from slotune.cluster.run import ClusterResult
    from slotune.cluster.search import DeployStudy, Scored
    from slotune.cluster.spec import ClusterSpec, InstanceSpec
    from slotune.workloads.slo import SLO

_TUNED = ("max_num_batched_tokens", "max_num_seqs")


def instance_kinds(spec: ClusterSpec) -> list[tuple[InstanceSpec, int]]:
    """Each distinct instance with how many of it, in order of first appearance."""
    counts = Counter(spec.instances)
    return [(inst, counts[inst]) for inst in dict.fromkeys(spec.instances)]


def kind_label(inst: InstanceSpec) -> str:
    """``mixed TP2``, ``prefill TP4 EP4``, ``mixed TP2 PP2``."""
    pp = f" PP{inst.pp}" if inst.pp > 1 else ""
    ep = f" EP{inst.ep}" if inst.ep > 1 else ""
    return f"{inst.role} TP{inst.tp}{pp}{ep}"


def describe(spec: ClusterSpec) -> str:
    """``4 × mixed TP2`` or ``3 × prefill TP1 + 1 × decode TP1``, with the router."""
    kinds = " + ".join(f"{n} × {kind_label(i)}" for i, n in instance_kinds(spec))
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


def slo_losses_by_kind(run: ClusterResult, slo: SLO) -> dict[str, dict[str, int]]:
    """``slo_losses`` per kind of answering instance (``kind_label``), every kind listed."""
    by_instance = slo_losses_by_instance(run, slo)
    out: dict[str, dict[str, int]] = {}
    for x in run.instances:
        if x.role == "prefill":
            continue  # a prefill instance answers no request (its losses show in the phases)
        kind = out.setdefault(kind_label(run.spec.instances[x.index]), {})
        for k, n in by_instance.get(x.index, {}).items():
            kind[k] = kind.get(k, 0) + n
    return out


PHASES = ("prefill", "kv link", "decode")


def ttft_phases(run: ClusterResult, slo: SLO) -> dict[str, Any] | None:
    """Where a disaggregated request's time to first token went: ``prefill`` (arrival to
    the router hearing the prefill finish: queue and compute on the prefill instance),
    ``kv link`` (waiting for the decode instance's link and the transfer) and ``decode``
    (the landed KV to the first token). Per group (the requests that missed the TTFT
    target and those that met it): the mean of each phase in ms; and for each request that
    missed, its longest phase counted (``lost_in``). None when co-located."""
    if not run.transfers:
        return None
    r = run.result.requests
    arrival = r["arrival_time"].to_numpy()
    first = r["first_token_time"].to_numpy()
    tr = sorted(run.transfers, key=lambda t: t.index)
    idx = np.array([t.index for t in tr])
    handed = np.array([t.handed for t in tr])
    start = np.array([t.start for t in tr])
    end = np.array([t.end for t in tr])
    phases = np.stack(
        [handed - arrival[idx], end - handed, first[idx] - end], axis=1
    )  # seconds; the three sum to the TTFT
    ok = ~np.isnan(phases).any(axis=1)
    missed = _misses(run, slo).get("ttft", np.zeros(len(r), dtype=bool))[idx] & ok
    met = ok & ~missed
    out: dict[str, Any] = {
        "phases": list(PHASES),
        "link_wait_ms": float((start - handed)[ok].mean() * 1e3) if ok.any() else None,
        "groups": {},
    }
    for name, mask in (("missed TTFT", missed), ("met TTFT", met)):
        if mask.any():
            out["groups"][name] = {
                "count": int(mask.sum()),
                "mean_ms": [float(v) * 1e3 for v in phases[mask].mean(axis=0)],
            }
    longest = phases[missed].argmax(axis=1) if missed.any() else np.array([], dtype=int)
    out["lost_in"] = {p: int((longest == k).sum()) for k, p in enumerate(PHASES)}
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
                "ep": i.ep,
                "kind": kind_label(i),
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
            "kind": kind_label(spec.instances[x.index]),
            "busy_share": x.busy_s / duration if duration > 0 else 0.0,
            "steps": x.num_steps,
            "requests": x.routed,
        }
        for x in run.instances
    ]
    reasons = Counter(d.reason for d in run.decisions)
    out["router_decisions"] = dict(reasons)
    out["prefix_hit_share"] = reasons["prefix"] / len(run.decisions) if run.decisions else None
    if run.transfers:
        secs = np.array([t.end - t.start for t in run.transfers])
        out["kv_transfers"] = {
            "count": len(run.transfers),
            "gib": float(sum(t.num_bytes for t in run.transfers)) / 2**30,
            "mean_ms": float(secs.mean() * 1e3),
            "p99_ms": float(np.percentile(secs, 99) * 1e3),
            "ms": [float(v) * 1e3 for v in secs],
        }
    out["slo_lost"] = slo_losses(run, slo)
    out["slo_lost_by_instance"] = slo_losses_by_instance(run, slo)
    out["slo_lost_by_kind"] = slo_losses_by_kind(run, slo)
    out["ttft_phases"] = ttft_phases(run, slo)
    return out


def study_report(study: DeployStudy, slo: SLO, about: dict[str, Any]) -> dict[str, Any]:
    """What ``deployment.json`` holds: the study's settings (``about``), the best
    deployment and the best single instance (``run_report``), every trial in brief."""
    return {
        "study": about,
        "best": run_report(study.best, slo),
        "single_instance": run_report(study.single, slo) if study.single else None,
        "trials": [
            {
                "deployment": describe(s.spec),
                "gpus": s.spec.num_gpus,
                "goodput_per_gpu": s.per_gpu,
                "slo_attainment": s.attainment,
                "feasible": s.feasible,
                "chosen": s.spec == study.best.spec,
                "single": study.single is not None and s.spec == study.single.spec,
            }
            for s in study.trials
        ],
        "search_seconds": study.seconds,
    }
