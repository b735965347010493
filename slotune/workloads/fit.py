"""Fit a trace's statistics into a small spec, and synthesize any number of requests from it.

``fit_trace(trace)`` measures what decides how a workload loads a server, and
``synthesize(spec, n)`` (``synthesize.py``) draws a trace with the same statistics, so a
short production sample can drive a long steady-state run. The spec is JSON (``slotune
traces fit``; its checks are in ``spec.py``).

- Lengths: quantiles (every 2.5 %) of first-turn prompts, outputs and follow-up turns'
  own prompts. A first turn's own part (the prompt, or past a shared prefix the suffix)
  and its output are drawn together through a Gaussian copula with the sample's
  Spearman correlation.
- Arrivals (when the trace has timestamps): the mean rate, the burstiness (the gamma
  shape of the gaps: 1 / CV², vLLM's definition) and the shape of the rate over the
  trace (24 bins, mean 1) repeated with the trace's span as its period. New arrivals are a
  gamma renewal process in "expected-count" time, mapped through the shaped rate.
- Sessions: the share of sessions with more than one turn, the turn counts, think times.
- Prefix sharing: requests whose first 16-token block another request also starts with
  form a group; a group's weight is its share of those requests. Each shared request
  keeps the longest prefix it shares with another request of its group. A synthesized
  shared request takes a group by weight, a shared length and a suffix; equal groups are
  equal tokens (segments), so shorter shares are prefixes of longer ones as in the trace.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slotune.workloads.trace import STATS_BLOCK_SIZE, Trace

SPEC_VERSION = 1
QUANTILES = np.linspace(0.0, 1.0, 41)
PROFILE_BINS = 24
MAX_GROUPS = 256


def _quantiles(values: Sequence[float] | np.ndarray) -> list[float] | None:
    v = np.asarray(values, dtype=float)
    return None if len(v) == 0 else [round(float(x), 4) for x in np.quantile(v, QUANTILES)]


# fitting -----------------------------------------------------------------------------


def fit_trace(trace: Trace) -> dict[str, Any]:
    """The spec of ``trace`` (see module doc)."""
    reqs = trace.requests
    if not reqs:
        raise ValueError(f"trace {trace.name} has no requests to fit")
    roots = [i for i, r in enumerate(reqs) if r.parent_id is None]
    followups = [r for r in reqs if r.parent_id is not None]
    prompts = [reqs[i].prompt_len for i in roots]
    outputs = [r.output_len for r in reqs]
    prefix, shared = _fit_prefix(trace, roots)
    own = [p for p, s in zip(prompts, shared, strict=True) if s is None] or prompts
    own_part = [p - (s or 0) for p, s in zip(prompts, shared, strict=True)]
    return {
        "slotune_spec": SPEC_VERSION,
        "name": trace.name,
        "source": trace.source or trace.name,
        "requests": len(reqs),
        "lengths": {
            "prompt": _quantiles(own),
            "output": _quantiles(outputs),
            "followup_prompt": _quantiles([r.prompt_len for r in followups]),
            "prompt_output_spearman": _spearman(own_part, [reqs[i].output_len for i in roots]),
        },
        "arrivals": _fit_arrivals(trace, roots),
        "sessions": _fit_sessions(trace, roots),
        "prefix": prefix,
    }


def _spearman(a: list[int], b: list[int]) -> float:
    if len(a) < 3:
        return 0.0
    ra, rb = (np.argsort(np.argsort(x)).astype(float) for x in (a, b))
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return round(float(np.corrcoef(ra, rb)[0, 1]), 4)


def _fit_arrivals(trace: Trace, roots: list[int]) -> dict[str, Any] | None:
    if not trace.has_timestamps or len(roots) < 3:
        return None
    t = np.sort([trace.requests[i].arrival_time for i in roots]).astype(float)
    span = float(t[-1] - t[0])
    if span <= 0:
        return None
    counts, _ = np.histogram(t - t[0], bins=PROFILE_BINS, range=(0.0, span))
    profile = counts / counts.mean()
    rate = (len(t) - 1) / span
    # burstiness of the gaps in expected-count time, the rate's shape taken out
    edges, cumulative = cumulative_rate(rate, span, profile, 1)
    gaps = np.diff(np.interp(t - t[0], edges, cumulative))
    cv2 = float(gaps.var() / gaps.mean() ** 2) if gaps.mean() > 0 else 1.0
    return {
        "rate": round(rate, 6),
        "burstiness": round(min(1.0 / cv2, 1e3), 4) if cv2 > 0 else 1e3,
        "period_s": round(span, 6),
        "profile": [round(float(p), 4) for p in profile],
    }


def cumulative_rate(
    rate: float, period: float, profile: np.ndarray, periods: int
) -> tuple[np.ndarray, np.ndarray]:
    """Times and the expected arrivals by each, over ``periods`` repeats of the shape."""
    edges = np.linspace(0.0, period * periods, len(profile) * periods + 1)
    counts = np.tile(profile, periods) * rate * period / len(profile)
    return edges, np.concatenate([[0.0], np.cumsum(counts)])


def _fit_sessions(trace: Trace, roots: list[int]) -> dict[str, Any]:
    reqs = trace.requests
    flow: dict[str, int] = {}
    for i, r in enumerate(reqs):
        flow[r.request_id] = i if r.parent_id is None else flow[r.parent_id]
    turns = Counter(flow[r.request_id] for r in reqs)
    histogram = Counter(turns[i] for i in roots)
    thinks = [r.think_time_s for r in reqs if r.parent_id is not None]
    return {
        "turns": {str(k): v / len(roots) for k, v in sorted(histogram.items())},
        "think_time_s": _quantiles(thinks),
    }


def _fit_prefix(trace: Trace, roots: list[int]) -> tuple[dict[str, Any], list[int | None]]:
    """Shared-prefix groups of first turns (by first block) and their shared lengths;
    each first turn's shared length (None: it shares nothing)."""
    reqs = trace.requests
    shared: list[int | None] = [None] * len(roots)
    if all(reqs[i].prompt_token_ids is None and reqs[i].prompt_segments is None for i in roots):
        return {"share": 0.0, "weights": [], "shared_len": None, "suffix_len": None}, shared
    own = trace.own_prompt_token_ids()
    chains = [_block_chain(own[i]) for i in roots]
    groups: dict[int, list[int]] = {}
    for k, chain in enumerate(chains):
        if chain:
            groups.setdefault(chain[0], []).append(k)
    shared_len, suffix_len, sizes = [], [], []
    for members in groups.values():
        if len(members) < 2:
            continue
        sizes.append(len(members))
        depth = _shared_depths([chains[k] for k in members])
        for k, d in zip(members, depth, strict=True):
            n = d * STATS_BLOCK_SIZE
            shared[k] = n
            shared_len.append(n)
            suffix_len.append(len(own[roots[k]]) - n)
    sizes.sort(reverse=True)
    sizes = sizes[:MAX_GROUPS]
    prefix = {
        "share": round(len(shared_len) / len(roots), 4),
        "weights": [round(s / sum(sizes), 6) for s in sizes],
        "shared_len": _quantiles(shared_len),
        "suffix_len": _quantiles(suffix_len),
    }
    return prefix, shared


def _block_chain(ids: list[int]) -> list[int]:
    chain, h, bs = [], 0, STATS_BLOCK_SIZE
    for start in range(0, len(ids) - bs + 1, bs):
        h = hash((h, *ids[start : start + bs]))
        chain.append(h)
    return chain


def _shared_depths(chains: list[list[int]]) -> list[int]:
    """Per member: how many leading blocks it shares with at least one other member."""
    seen: Counter[int] = Counter()
    for chain in chains:
        seen.update(chain)
    return [next((d for d, h in enumerate(c) if seen[h] < 2), len(c)) for c in chains]


def write_spec(spec: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
