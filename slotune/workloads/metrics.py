"""Metric summaries of a run, with vLLM ``bench serve``'s definitions.

Over completed requests: TTFT = first token - arrival; E2E = finish - arrival;
TPOT = (E2E - TTFT) / (output tokens - 1), for requests with more than one output token;
ITL = every gap between consecutive tokens of a request, pooled over requests.
Throughputs divide by the run's duration. A request meets the SLO when it completed and
meets every target (for ``itl``, every gap; for ``tpot``, a single-token request passes);
failed requests count as misses. Attainment is the share of all requests that meet it,
goodput the number per second. A run with requests of more than one service tier gets
the same scores per tier (``tiers``: counts, throughputs, latencies, attainment and
goodput of that tier's requests against that tier's SLO, over the whole run's duration).
With per-tier targets (``pro:...;free:...``) each request meets the SLO when it meets its
own tier's.

With a warm-up or a cool-down (see ``steady.py``) only the requests that arrive in the
scoring window are counted, and every rate is per second of the window: throughputs
count what finished (requests) or was generated (tokens) inside it, goodput the window's
requests that met the SLO. ``steady_state`` says whether the run reached one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from slotune.workloads.arrivals import Stage
from slotune.workloads.result import RunResult
from slotune.workloads.slo import SLO
from slotune.workloads.steady import ScoringWindow, steady_state

_METRIC_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e": "e2el_ms"}


def request_metrics(
    result: RunResult, token_times: tuple[np.ndarray, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Per-request arrays in seconds (NaN where undefined) plus ``ok`` and pooled ``itl``.
    ``token_times``: the requests' token times already flat, as ``flat_token_times`` gives
    them (then the frame's own column is not read)."""
    df = result.requests
    ok = df["error"].isna().to_numpy() & df["finish_time"].notna().to_numpy()
    arrival = df["arrival_time"].to_numpy(dtype=float)
    ttft = df["first_token_time"].to_numpy(dtype=float) - arrival
    e2e = df["finish_time"].to_numpy(dtype=float) - arrival
    out = df["output_tokens"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), np.nan)
    gaps, gap_counts = token_gaps(*(token_times or flat_token_times(df["token_times"])))
    max_gap = np.zeros(len(gap_counts))
    has_gaps = gap_counts > 0
    if gaps.size:
        max_gap[has_gaps] = np.maximum.reduceat(gaps, _starts(gap_counts)[has_gaps])
    itl = gaps[np.repeat(ok, gap_counts)]
    ttft[~ok] = np.nan
    e2e[~ok] = np.nan
    tpot[~ok] = np.nan
    return {
        "ok": ok,
        "ttft": ttft,
        "tpot": tpot,
        "e2e": e2e,
        "itl": itl,
        "max_itl": max_gap,
        "output_tokens": out,
    }


def flat_token_times(token_times: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """All token times in one array, request after request, and each request's count."""
    counts = np.fromiter(map(len, token_times), dtype=np.int64, count=len(token_times))
    flat = np.fromiter(chain.from_iterable(token_times), dtype=float, count=int(counts.sum()))
    return flat, counts


def token_gaps(flat: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every gap between consecutive tokens, request after request, and each request's
    number of gaps, from the flat token times (``flat_token_times``: a run has millions)."""
    first = np.zeros(len(flat), dtype=bool)  # a request's first token: no gap before it
    first[_starts(counts)[counts > 0]] = True
    gaps = np.diff(flat)[~first[1:]]
    return gaps, np.maximum(counts - 1, 0)


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each request's run begins in a flat array of runs of these lengths."""
    return np.cumsum(counts) - counts


def meets_slo(
    metrics: dict[str, np.ndarray], slo: SLO, tiers: np.ndarray | None = None
) -> np.ndarray:
    """Whether each request meets the SLO: with per-tier targets and the requests'
    ``tiers``, each against its own tier's."""
    if slo.tiers and tiers is not None:
        good = np.zeros(len(metrics["ok"]), dtype=bool)
        for t in np.unique(tiers).tolist():
            mask = tiers == t
            good[mask] = _meets(metrics, slo.for_tier(int(t)))[mask]
        return good
    return _meets(metrics, slo)


def _meets(metrics: dict[str, np.ndarray], slo: SLO) -> np.ndarray:
    good = metrics["ok"].copy()
    for t in slo.targets:
        if t.metric == "ttft":
            good &= metrics["ttft"] <= t.threshold_s
        elif t.metric == "e2e":
            good &= metrics["e2e"] <= t.threshold_s
        elif t.metric == "tpot":
            good &= np.nan_to_num(metrics["tpot"], nan=0.0) <= t.threshold_s
        elif t.metric == "itl":
            good &= metrics["max_itl"] <= t.threshold_s
    return good


def distribution_ms(values_s: np.ndarray, percentiles: Sequence[float]) -> dict[str, float | None]:
    """Mean and percentiles in ms; None for each when there are no values."""
    v = values_s[~np.isnan(values_s)] * 1000.0
    keys = ["mean", *(f"p{p:g}" for p in percentiles)]
    if len(v) == 0:
        return dict.fromkeys(keys)
    pct = np.percentile(v, list(percentiles))
    return {
        "mean": float(v.mean()),
        **{f"p{p:g}": float(x) for p, x in zip(percentiles, pct, strict=True)},
    }


def summarize(
    result: RunResult,
    slo: SLO | None = None,
    percentiles: Sequence[float] = (50, 90, 95, 99),
    *,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
    stages: Sequence[Stage] = (),
    offered_rate: float | None = None,
) -> dict[str, Any]:
    """The summary.json of a run (callers add ``config``); ``warmup_s`` and ``cooldown_s``
    leave the start and the end of the arrivals out of the scores; ``stages`` (the run's
    load stages) have the steady-state check look at each stage apart. With the run's
    ``offered_rate`` (req/s), goodput is the SLO-meeting share of it (attainment × rate):
    a window's count of Poisson arrivals may run above the rate, goodput never does."""
    window = ScoringWindow.of(result, warmup_s, cooldown_s)
    if not (warmup_s or cooldown_s):
        summary = _summary(result, slo, percentiles, float(result.duration_s))
    else:
        scored = RunResult(
            requests=result.requests[window.mask(result)].reset_index(drop=True),
            steps=result.steps,
            duration_s=result.duration_s,
            engine_stats=result.engine_stats,
        )
        summary = _summary(scored, slo, percentiles, window.length_s)
        summary.update(_window_throughput(result, window))
        summary["duration_s"] = float(result.duration_s)
        summary["scoring_window"] = window.to_dict(result)
    ends = np.cumsum([s.duration_s for s in stages])[:-1].tolist() if stages else []
    summary["steady_state"] = steady_state(result, window, ends)
    if offered_rate and summary.get("slo_attainment") is not None:
        summary["goodput"] = summary["slo_attainment"] * offered_rate
        summary["offered_rate"] = offered_rate
    return summary


def _window_throughput(result: RunResult, window: ScoringWindow) -> dict[str, float]:
    """Requests finished and tokens generated inside the window, per second of it."""
    m = request_metrics(result)
    finish = result.requests["finish_time"].to_numpy(dtype=float)
    inside = m["ok"] & (finish >= window.start_s) & (finish <= window.end_s)
    times, counts = flat_token_times(result.requests["token_times"])
    times = times[np.repeat(m["ok"], counts)]
    tokens = int(np.count_nonzero((times >= window.start_s) & (times <= window.end_s)))
    return {
        "request_throughput": float(inside.sum()) / window.length_s,
        "output_throughput": tokens / window.length_s,
    }


def _summary(
    result: RunResult, slo: SLO | None, percentiles: Sequence[float], duration: float
) -> dict[str, Any]:
    m = request_metrics(result)
    df = result.requests
    ok = m["ok"]
    n = len(df)
    completed = int(ok.sum())
    out_tokens = float(m["output_tokens"][ok].sum())

    def rate(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    summary: dict[str, Any] = {
        "num_requests": n,
        "completed": completed,
        "failed": n - completed,
        "duration_s": duration,
        "request_throughput": rate(completed),
        "output_throughput": rate(out_tokens),
        "total_input_tokens": int(df["prompt_tokens"][ok].sum()),
        "total_output_tokens": int(out_tokens),
        "ttft_ms": distribution_ms(m["ttft"], percentiles),
        "tpot_ms": distribution_ms(m["tpot"], percentiles),
        "itl_ms": distribution_ms(m["itl"], percentiles),
        "e2el_ms": distribution_ms(m["e2e"], percentiles),
        "slo": None,
        "slo_attainment": None,
        "goodput": None,
        "slo_checks": [],
        "num_preemptions": _preemptions(result),
        "prefix_cache_hit_rate": _prefix_hit_rate(result),
    }
    stats = result.engine_stats
    if "num_recomputed_tokens" in stats:  # what preemptions cost: recomputed vs swapped
        summary["preemption_mix"] = {
            "recomputed_tokens": int(stats["num_recomputed_tokens"]),
            "swapped_tokens": int(stats.get("num_swapped_tokens", 0)),
        }
    if "hardware" in stats:  # what a real engine's steps are read against (reports)
        summary["hardware"] = stats["hardware"]
    if slo is not None:
        good = meets_slo(m, slo, _tiers(df))
        summary["slo"] = str(slo)
        summary["slo_attainment"] = float(good.sum() / n) if n else 0.0
        summary["goodput"] = rate(float(good.sum()))
        summary["slo_checks"] = _percentile_checks(m, slo)
    tiers = per_tier(result, slo, percentiles, duration)
    if tiers:
        summary["tiers"] = tiers
    errors = df["error"].dropna()
    if len(errors):
        summary["errors"] = {
            str(k): int(v) for k, v in errors.str.slice(0, 120).value_counts().head(5).items()
        }
    return summary


_TIER_KEYS = (
    "num_requests",
    "completed",
    "failed",
    "request_throughput",
    "output_throughput",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "slo",
    "slo_attainment",
    "goodput",
)


def _tiers(df: Any) -> np.ndarray | None:
    return df["tier"].fillna(0).astype(int).to_numpy() if "tier" in df.columns else None


def per_tier(
    result: RunResult, slo: SLO | None, percentiles: Sequence[float], duration: float
) -> dict[str, dict[str, Any]]:
    """The summary's scores for each service tier's requests (against the tier's own SLO,
    ``slo``); empty for one tier."""
    df = result.requests
    tier = _tiers(df)
    if tier is None:
        return {}
    names = sorted(set(tier.tolist()))
    if len(names) < 2:
        return {}
    out = {}
    for t in names:
        part = RunResult(
            requests=df[tier == t].reset_index(drop=True),
            steps=result.steps,
            duration_s=result.duration_s,
        )
        s = _summary(part, None if slo is None else slo.for_tier(t), percentiles, duration)
        out[str(t)] = {k: s[k] for k in _TIER_KEYS}
    return out


def _percentile_checks(m: dict[str, np.ndarray], slo: SLO) -> list[dict[str, Any]]:
    checks = []
    for t in slo.targets:
        if t.percentile is None:
            continue
        values = m["itl"] if t.metric == "itl" else m[t.metric]
        values = values[~np.isnan(values)]
        value = float(np.percentile(values, t.percentile)) if len(values) else math.inf
        checks.append(
            {
                "metric": t.metric,
                "percentile": t.percentile,
                "threshold_ms": t.threshold_ms,
                "value_ms": value * 1000.0,
                "met": bool(value <= t.threshold_s),
            }
        )
    return checks


def _preemptions(result: RunResult) -> int:
    stat = result.engine_stats.get("num_preemptions")
    if stat is not None:
        return int(stat)
    return int(result.requests["num_preemptions"].sum())


def _prefix_hit_rate(result: RunResult) -> float:
    """Engine counters when present (hit tokens / queried tokens), else cached / prompt tokens."""
    queries = result.engine_stats.get("prefix_cache_queries_tokens")
    if queries is not None:
        hits = result.engine_stats.get("prefix_cache_hit_tokens", 0)
        return float(hits) / float(queries) if queries else 0.0
    prompt = float(result.requests["prompt_tokens"].sum())
    return float(result.requests["cached_tokens"].sum()) / prompt if prompt else 0.0
