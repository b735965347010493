"""Draw a trace from a workload spec (``fit.py`` fits one; the module doc there says how)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from slotune.workloads.fit import QUANTILES, cumulative_rate
from slotune.workloads.spec import check_spec
from slotune.workloads.trace import Trace, TraceRequest


def _draw(quantiles: list[float], u: np.ndarray) -> np.ndarray:
    return np.interp(u, QUANTILES, np.asarray(quantiles, dtype=float))


def _tokens(quantiles: list[float], u: np.ndarray) -> np.ndarray:
    return np.maximum(1, np.rint(_draw(quantiles, u))).astype(np.int64)


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
    edges, cumulative = cumulative_rate(rate, period, profile, periods)
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
