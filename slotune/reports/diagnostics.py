"""Plain-sentence diagnostics of one run, each with its threshold stated.

Every check returns a ``Diagnostic`` whether or not it fired, so the report can show what
was checked and the measured value; ``triggered`` is ``None`` when the data to decide is
missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from slotune.reports.columns import PREFIX_SHARING_MIN, TRACE_PREFIX_SHARING_KEYS
from slotune.reports.fmt import is_number
from slotune.reports.runs import RunData, percentile, prefix_cache_hit_rate

HOL_RATIO = 3.0
PREEMPTION_STEP_SHARE = 0.01
KV_HIGH = 0.85
KV_PERSISTENT_SHARE = 0.5
PREFIX_HIT_LOW = 0.30
TPOT_RATIO = 3.0


@dataclass(frozen=True)
class Diagnostic:
    key: str
    title: str
    triggered: bool | None
    message: str


def _tail(
    run: RunData, metric: str, name: str, threshold: float, digits: int
) -> tuple[bool, str] | None:
    """Whether p99/p50 of ``metric`` exceeds ``threshold``, and that measurement in words."""
    p50, p99 = percentile(run, metric, "p50"), percentile(run, metric, "p99")
    if p50 is None or p99 is None or p50 <= 0:
        return None
    ratio = p99 / p50
    measured = (
        f"p99 {name} is {ratio:.1f}× the median ({p99:.{digits}f} ms vs {p50:.{digits}f} ms; "
        f"threshold {threshold:g}×)"
    )
    return ratio > threshold, measured


def head_of_line(run: RunData) -> Diagnostic:
    title = "Head-of-line blocking"
    found = _tail(run, "ttft_ms", "TTFT", HOL_RATIO, digits=0)
    if found is None:
        return Diagnostic("hol", title, None, "Not evaluated: no TTFT percentiles were stored.")
    triggered, measured = found
    if triggered:
        return Diagnostic(
            "hol",
            title,
            True,
            f"{measured}. Some requests wait behind long prefills: split long prompts "
            "(lower long_prefill_token_threshold) or raise max_num_seqs so new requests are "
            "admitted sooner.",
        )
    return Diagnostic("hol", title, False, f"No head-of-line blocking: {measured}.")


def preemptions(run: RunData) -> Diagnostic:
    title = "Preemptions"
    preempted = run.steps["preempted"].dropna()
    if preempted.empty:
        return Diagnostic("preempt", title, None, "Not evaluated: no per-step preemption counts.")
    share = float((preempted > 0).mean())
    total = int(preempted.sum())
    measured = (
        f"{share:.1%} of {len(preempted):,} steps preempted a request ({total:,} preemptions; "
        f"threshold {PREEMPTION_STEP_SHARE:.0%} of steps)"
    )
    if share > PREEMPTION_STEP_SHARE:
        return Diagnostic(
            "preempt",
            title,
            True,
            f"{measured}. The KV cache runs out under this concurrency: lower max_num_seqs, "
            "raise gpu_memory_utilization, or use preemption_mode=swap.",
        )
    return Diagnostic("preempt", title, False, f"Preemptions are rare: {measured}.")


def kv_pressure(run: RunData) -> Diagnostic:
    title = "KV-cache pressure"
    steps = run.steps.dropna(subset=["kv_usage"])
    if steps.empty:
        return Diagnostic("kv", title, None, "Not evaluated: no per-step KV-cache usage.")
    weights = steps["step_time"].fillna(0).to_numpy(dtype=float)
    if weights.sum() <= 0:
        weights = np.ones(len(steps))
    high = (steps["kv_usage"].to_numpy(dtype=float) > KV_HIGH).astype(float)
    share = float((high * weights).sum() / weights.sum())
    measured = (
        f"KV-cache usage was above {KV_HIGH:.0%} for {share:.0%} of the run's engine time "
        f"(threshold: more than {KV_PERSISTENT_SHARE:.0%} of the time)"
    )
    if share > KV_PERSISTENT_SHARE:
        return Diagnostic(
            "kv",
            title,
            True,
            f"{measured}. The cache is persistently full, which limits the batch and invites "
            "preemption: give it more memory (gpu_memory_utilization) or admit fewer requests.",
        )
    return Diagnostic("kv", title, False, f"KV cache has headroom: {measured}.")


def trace_shares_prefixes(trace_stats: dict[str, Any] | None) -> bool | None:
    """Whether the trace's statistics say its prompts share prefixes; ``None`` if unknown.

    A share (``prefix_sharing_ratio``) counts from ``PREFIX_SHARING_MIN`` of prompt tokens.
    """
    if not trace_stats:
        return None
    for key in TRACE_PREFIX_SHARING_KEYS:
        value = trace_stats.get(key)
        if isinstance(value, bool):
            return value
        if is_number(value):
            return float(value) >= PREFIX_SHARING_MIN
    return None


def prefix_cache(run: RunData, shares_prefixes: bool | None) -> Diagnostic:
    title = "Prefix-cache hit rate"
    rate = prefix_cache_hit_rate(run)
    if rate is None:
        return Diagnostic("prefix", title, None, "Not evaluated: no prefix-cache hit rate.")
    measured = f"prefix-cache hit rate is {rate:.0%} (threshold {PREFIX_HIT_LOW:.0%})"
    if shares_prefixes is None:
        return Diagnostic(
            "prefix",
            title,
            None,
            f"Not evaluated: the trace's statistics don't say whether prompts share prefixes; "
            f"{measured}.",
        )
    if not shares_prefixes:
        return Diagnostic(
            "prefix",
            title,
            False,
            f"Not applicable: the trace's prompts don't share prefixes; {measured}.",
        )
    if rate < PREFIX_HIT_LOW:
        mode = run.config.get("prefix_caching")
        hint = (
            "prefix caching is off (prefix_caching=none): turn it on"
            if mode == "none"
            else "shared prefixes are evicted before reuse: give the cache more blocks"
        )
        return Diagnostic(
            "prefix",
            title,
            True,
            f"The trace shares prefixes but the {measured}; {hint}.",
        )
    return Diagnostic("prefix", title, False, f"Shared prefixes are reused: {measured}.")


def tpot_tail(run: RunData) -> Diagnostic:
    title = "TPOT tail"
    found = _tail(run, "tpot_ms", "TPOT", TPOT_RATIO, digits=1)
    if found is None:
        return Diagnostic("tpot", title, None, "Not evaluated: no TPOT percentiles were stored.")
    triggered, measured = found
    if triggered:
        budget = run.config.get("max_num_batched_tokens")
        budget_text = f"max_num_batched_tokens={budget}" if budget is not None else "the budget"
        return Diagnostic(
            "tpot",
            title,
            True,
            f"{measured}. First suspect: the chunk budget ({budget_text}) lets large prefill "
            "chunks share steps with decodes and stall them; try a smaller budget or a "
            "long_prefill_token_threshold.",
        )
    return Diagnostic("tpot", title, False, f"Decode pace is steady: {measured}.")


def diagnose(run: RunData, trace_stats: dict[str, Any] | None = None) -> list[Diagnostic]:
    return [
        head_of_line(run),
        preemptions(run),
        kv_pressure(run),
        prefix_cache(run, trace_shares_prefixes(trace_stats)),
        tpot_tail(run),
    ]
