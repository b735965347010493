"""Fit a trace's statistics into a small spec, and synthesize any number of requests from it.

``fit_trace(trace)`` measures what decides how a workload loads a server, and
``synthesize(spec, n)`` draws a trace with the same statistics, so a short production
sample can drive a long steady-state run. The spec is JSON (``slotune traces fit``).

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
import math
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from slotune.workloads.limits import MAX_SECONDS, MAX_TOKENS, check_int, check_seconds
from slotune.workloads.trace import STATS_BLOCK_SIZE, Trace, TraceRequest

SPEC_VERSION = 1
QUANTILES = np.linspace(0.0, 1.0, 41)
PROFILE_BINS = 24
MAX_GROUPS = 256


def _quantiles(values: list[float] | np.ndarray) -> list[float] | None:
    v = np.asarray(values, dtype=float)
    return None if len(v) == 0 else [round(float(x), 4) for x in np.quantile(v, QUANTILES)]


def _draw(quantiles: list[float], u: np.ndarray) -> np.ndarray:
    return np.interp(u, QUANTILES, np.asarray(quantiles, dtype=float))


def _tokens(quantiles: list[float], u: np.ndarray) -> np.ndarray:
    return np.maximum(1, np.rint(_draw(quantiles, u))).astype(np.int64)


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
    edges, cumulative = _cumulative_rate(rate, span, profile, 1)
    gaps = np.diff(np.interp(t - t[0], edges, cumulative))
    cv2 = float(gaps.var() / gaps.mean() ** 2) if gaps.mean() > 0 else 1.0
    return {
        "rate": round(rate, 6),
        "burstiness": round(min(1.0 / cv2, 1e3), 4) if cv2 > 0 else 1e3,
        "period_s": round(span, 6),
        "profile": [round(float(p), 4) for p in profile],
    }


def _cumulative_rate(
    rate: float, period: float, profile: np.ndarray, periods: int
) -> tuple[np.ndarray, np.ndarray]:
    """Times and the expected arrivals by each, over ``periods`` repeats of the shape."""
    edges = np.linspace(0.0, period * periods, len(profile) * periods + 1)
    counts = np.tile(profile, periods) * rate * period / len(profile)
    return edges, np.concatenate([[0.0], np.cumsum(counts)])


def _fit_sessions(trace: Trace, roots: list[int]) -> dict[str, Any]:
    reqs = trace.requests
    flow = {}
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


# synthesis ---------------------------------------------------------------------------


def synthesize(spec: dict[str, Any], num_requests: int, *, seed: int = 0) -> Trace:
    """``num_requests`` requests drawn with the spec's statistics (the last session may be
    cut short to make the count)."""
    check_spec(spec)
    if num_requests < 1:
        raise ValueError(f"num_requests must be at least 1 (got {num_requests})")
    rng = np.random.default_rng(seed)
    turns = _session_turns(spec["sessions"], num_requests, rng)
    times = _arrival_times(spec.get("arrivals"), len(turns), rng)
    own, outputs = _root_lengths(spec, len(turns), rng)
    prompts = _tokens(spec["lengths"]["prompt"], own)
    segments = _root_segments(spec.get("prefix") or {}, own, rng)
    reqs: list[TraceRequest] = []
    for s, n_turns in enumerate(turns):
        segs = segments[s]  # None: a prompt of its own (unique tokens)
        reqs.append(
            TraceRequest(
                request_id=f"fit{s}-t0" if n_turns > 1 else f"fit{s}",
                prompt_len=int(prompts[s]) if segs is None else sum(n for _, n in segs),
                output_len=int(outputs[s]),
                arrival_time=None if times is None else round(float(times[s]), 6),
                prompt_segments=segs,
                session_id=f"fit{s}" if n_turns > 1 else None,
            )
        )
        reqs.extend(_followups(spec, s, n_turns, reqs[-1].request_id, rng))
        if len(reqs) >= num_requests:
            break
    name = f"{spec.get('name', 'spec')}-synth"
    return Trace(name=name, requests=tuple(reqs[:num_requests]), seed=seed)


def _session_turns(
    sessions: dict[str, Any], num_requests: int, rng: np.random.Generator
) -> list[int]:
    values = np.array([int(k) for k in sessions["turns"]])
    probs = np.array(list(sessions["turns"].values()), dtype=float)
    draws = rng.choice(values, size=num_requests, p=probs / probs.sum())
    total = np.cumsum(draws)
    return draws[: int(np.searchsorted(total, num_requests)) + 1].tolist()


def _arrival_times(
    arrivals: dict[str, Any] | None, n: int, rng: np.random.Generator
) -> np.ndarray | None:
    if not arrivals:
        return None
    shape = float(arrivals["burstiness"])
    expected = np.concatenate([[0.0], np.cumsum(rng.gamma(shape, 1.0 / shape, size=n - 1))])
    rate, period = float(arrivals["rate"]), float(arrivals["period_s"])
    periods = math.ceil(expected[-1] / (rate * period)) + 1
    profile = np.asarray(arrivals["profile"], dtype=float)
    edges, cumulative = _cumulative_rate(rate, period, profile, periods)
    return np.interp(expected, cumulative, edges)


def _root_lengths(
    spec: dict[str, Any], n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The quantile of each first turn's own part, and its output length."""
    rho = 2 * math.sin(math.pi * float(spec["lengths"]["prompt_output_spearman"]) / 6)
    z1 = rng.standard_normal(n)
    z2 = rho * z1 + math.sqrt(max(0.0, 1 - rho * rho)) * rng.standard_normal(n)
    return _uniform_ranks(z1), _tokens(spec["lengths"]["output"], _uniform_ranks(z2))


def _uniform_ranks(z: np.ndarray) -> np.ndarray:
    """Each value's rank scaled into (0, 1): the normal copula with exact uniform margins."""
    return (np.argsort(np.argsort(z)) + 0.5) / len(z)


def _root_segments(
    prefix: dict[str, Any], own: np.ndarray, rng: np.random.Generator
) -> list[tuple[tuple[int, int], ...] | None]:
    """Shared requests' segments (group stream, then a suffix of their own, at the own
    part's quantile ``own``); None: a prompt of its own."""
    n = len(own)
    out: list[tuple[tuple[int, int], ...] | None] = [None] * n
    if not prefix.get("weights"):
        return out
    weights = np.asarray(prefix["weights"], dtype=float)
    shared = rng.random(n) < prefix["share"]
    groups = rng.choice(len(weights), size=n, p=weights / weights.sum())
    lengths = _tokens(prefix["shared_len"], rng.random(n))
    suffixes = np.rint(_draw(prefix["suffix_len"], own)).astype(int)
    for s in np.flatnonzero(shared):
        segs = [(int(groups[s]), int(lengths[s]))]
        if suffixes[s] > 0:
            segs.append((2 * 10**9 + int(s), int(suffixes[s])))
        out[s] = tuple(segs)
    return out


def _followups(
    spec: dict[str, Any], s: int, n_turns: int, parent: str, rng: np.random.Generator
) -> list[TraceRequest]:
    lengths, sessions = spec["lengths"], spec["sessions"]
    out = []
    for turn in range(1, n_turns):
        own = int(_tokens(lengths["followup_prompt"] or lengths["prompt"], rng.random(1))[0])
        think = sessions.get("think_time_s")
        rid = f"fit{s}-t{turn}"
        out.append(
            TraceRequest(
                request_id=rid,
                prompt_len=own,
                output_len=int(_tokens(lengths["output"], rng.random(1))[0]),
                session_id=f"fit{s}",
                turn=turn,
                think_time_s=0.0 if not think else round(float(_draw(think, rng.random(1))[0]), 6),
                parent_id=parent,
            )
        )
        parent = rid
    return out


# files -------------------------------------------------------------------------------


def check_spec(spec: Any) -> None:
    """Every number a spec holds is usable (a hand-edited or corrupted file is an error)."""
    if not isinstance(spec, dict) or spec.get("slotune_spec") != SPEC_VERSION:
        raise ValueError(f'not a slotune workload spec (expected "slotune_spec": {SPEC_VERSION})')
    check_int(spec.get("requests", 1), "requests", minimum=1, maximum=MAX_TOKENS)
    lengths, sessions = spec.get("lengths"), spec.get("sessions")
    if not isinstance(lengths, dict) or not isinstance(sessions, dict):
        raise ValueError("'lengths' and 'sessions' must be objects")
    _check_quantiles(lengths.get("prompt"), "lengths.prompt", MAX_TOKENS)
    _check_quantiles(lengths.get("output"), "lengths.output", MAX_TOKENS)
    _check_quantiles(lengths.get("followup_prompt"), "lengths.followup_prompt", MAX_TOKENS, True)
    rho = lengths.get("prompt_output_spearman", 0.0)
    if isinstance(rho, bool) or not (isinstance(rho, (int, float)) and -1 <= rho <= 1):
        raise ValueError(f"lengths.prompt_output_spearman: expected [-1, 1], got {rho!r}")
    turns = sessions.get("turns")
    if not isinstance(turns, dict) or not turns:
        raise ValueError("sessions.turns: expected {turns: share}")
    for k, v in turns.items():
        if not str(k).isdigit():
            raise ValueError(f"sessions.turns: expected whole numbers of turns, got {k!r}")
        check_int(int(k), "sessions.turns key", minimum=1, maximum=10_000)
        check_seconds(v, "sessions.turns share", maximum=1.0)
    if not sum(turns.values()) > 0:
        raise ValueError("sessions.turns: the shares add up to 0")
    _check_quantiles(sessions.get("think_time_s"), "sessions.think_time_s", MAX_SECONDS, True)
    _check_arrivals(spec.get("arrivals"))
    _check_prefix(spec.get("prefix"))


def _check_quantiles(q: Any, name: str, maximum: float, optional: bool = False) -> None:
    if q is None and optional:
        return
    if not isinstance(q, list) or len(q) != len(QUANTILES):
        raise ValueError(f"{name}: expected {len(QUANTILES)} quantiles")
    values = [check_seconds(v, name, maximum=maximum) for v in q]
    if any(b < a for a, b in pairwise(values)):
        raise ValueError(f"{name}: quantiles must not decrease")


def _check_arrivals(arrivals: Any) -> None:
    if arrivals is None:
        return
    if not isinstance(arrivals, dict):
        raise ValueError("arrivals: expected an object or null")
    for key in ("rate", "burstiness", "period_s"):
        if not check_seconds(arrivals.get(key), f"arrivals.{key}", maximum=MAX_SECONDS) > 0:
            raise ValueError(f"arrivals.{key}: must be > 0")
    profile = arrivals.get("profile")
    if not isinstance(profile, list) or not profile:
        raise ValueError("arrivals.profile: expected a list of relative rates")
    if not sum(check_seconds(p, "arrivals.profile", maximum=1e6) for p in profile) > 0:
        raise ValueError("arrivals.profile: the rates add up to 0")


def _check_prefix(prefix: Any) -> None:
    if prefix is None:
        return
    if not isinstance(prefix, dict):
        raise ValueError("prefix: expected an object or null")
    check_seconds(prefix.get("share", 0.0), "prefix.share", maximum=1.0)
    weights = prefix.get("weights", [])
    if not isinstance(weights, list) or len(weights) > MAX_GROUPS:
        raise ValueError(f"prefix.weights: expected a list of at most {MAX_GROUPS} weights")
    if weights:
        if not sum(check_seconds(w, "prefix.weights", maximum=1.0) for w in weights) > 0:
            raise ValueError("prefix.weights: the weights add up to 0")
        _check_quantiles(prefix.get("shared_len"), "prefix.shared_len", MAX_TOKENS)
        _check_quantiles(prefix.get("suffix_len"), "prefix.suffix_len", MAX_TOKENS)


def write_spec(spec: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")


def read_spec(path: str | Path) -> dict[str, Any]:
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    check_spec(spec)
    return spec
