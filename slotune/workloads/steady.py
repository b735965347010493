"""Steady state: the scoring window of a run and a check that the run reached one.

A run starts empty (the first requests meet an idle server) and ends draining (the last
ones meet a server with nothing behind them); both flatter the latencies a server could
hold. The scoring window leaves out requests that arrive in the first ``warmup_s``
seconds of the run (arrival times count from its start) and in the last ``cooldown_s``
seconds before the last arrival.

A run in steady state has as many requests in flight at the end of its window as at the
start. ``steady_state`` samples the requests in flight (arrived, not yet finished or
failed) across the window and compares the mean of its last third with its first third:
growth beyond ``max(2, 5 % of the window's arrivals)`` means the server fell behind and
the latencies measured depend on how long the run was, not on the server; the growth per
second is then how far the offered rate exceeds what the server completes. With load
stages the check runs on each stage's part of the window (by Little's law a higher rate
holds more requests in flight at the same latency, so a step up is no growth).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import numpy as np

from slotune.workloads.result import RunResult

GROWTH_SHARE = 0.05  # of the window's arrivals
MIN_GROWTH = 2.0  # requests: below this, noise in a short run
_SAMPLES = 60


@dataclass(frozen=True)
class ScoringWindow:
    """Requests that arrive in ``[start_s, end_s]`` are scored."""

    start_s: float
    end_s: float
    warmup_s: float = 0.0
    cooldown_s: float = 0.0

    @classmethod
    def of(cls, result: RunResult, warmup_s: float = 0.0, cooldown_s: float = 0.0) -> ScoringWindow:
        """The window of ``result``'s arrivals less the warm-up and the cool-down."""
        for name, value in (("warmup_s", warmup_s), ("cooldown_s", cooldown_s)):
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be >= 0 seconds (got {value})")
        arrivals = _sent_arrivals(result)
        last = float(arrivals.max()) if len(arrivals) else 0.0
        window = cls(warmup_s, last - cooldown_s, warmup_s, cooldown_s)
        if (warmup_s or cooldown_s) and not window.end_s > window.start_s:
            raise ValueError(
                f"a warm-up of {warmup_s:g} s and a cool-down of {cooldown_s:g} s leave nothing "
                f"of the {last:.3g} s of arrivals; run longer (e.g. load stages) "
                "or shorten them"
            )
        return window

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    def mask(self, result: RunResult) -> np.ndarray:
        arrival = result.requests["arrival_time"].to_numpy(dtype=float)
        return (arrival >= self.start_s) & (arrival <= self.end_s)

    def to_dict(self, result: RunResult) -> dict[str, Any]:
        return {
            "start_s": self.start_s,
            "end_s": self.end_s,
            "warmup_s": self.warmup_s,
            "cooldown_s": self.cooldown_s,
            "requests": int(self.mask(result).sum()),
        }


def _sent_arrivals(result: RunResult) -> np.ndarray:
    arrival = result.requests["arrival_time"].to_numpy(dtype=float)
    return arrival[~np.isnan(arrival)]


def in_flight(result: RunResult, times: np.ndarray) -> np.ndarray:
    """Requests arrived by each time and not yet finished (or failed) by then."""
    df = result.requests
    arrival = np.sort(_sent_arrivals(result))
    finish = df["finish_time"].to_numpy(dtype=float)
    finish = np.sort(np.where(np.isnan(finish), np.inf, finish)[~df["arrival_time"].isna()])
    return np.searchsorted(arrival, times, side="right") - np.searchsorted(
        finish, times, side="right"
    )


def steady_state(
    result: RunResult, window: ScoringWindow | None = None, boundaries: Sequence[float] = ()
) -> dict[str, Any]:
    """Whether the requests in flight stopped growing over the window (see module doc);
    ``boundaries`` (the times where a load stage ends) split it into parts checked apart.
    The answer is that of the part that grew most beyond its allowance."""
    window = window or ScoringWindow.of(result)
    cuts = [t for t in boundaries if window.start_s < t < window.end_s]
    if not cuts:
        return _check(result, window)
    edges = [window.start_s, *cuts, window.end_s]
    parts = [_check(result, replace(window, start_s=a, end_s=b)) for a, b in pairwise(edges)]
    checked = [p for p in parts if p["steady"] is not None]
    worst = max(checked, key=lambda p: p["growth"] - p["allowed_growth"], default=parts[0])
    return {**worst, "parts": parts}


def _check(result: RunResult, window: ScoringWindow) -> dict[str, Any]:
    if not window.length_s > 0:
        return {"steady": None, "note": "all requests arrived at once: no steady state"}
    times = np.linspace(window.start_s, window.end_s, _SAMPLES)
    counts = in_flight(result, times)
    third = _SAMPLES // 3
    start, end = float(counts[:third].mean()), float(counts[-third:].mean())
    apart_s = float(times[-third:].mean() - times[:third].mean())
    arrivals = int(window.mask(result).sum())
    # a stable queue's in-flight count fluctuates like a Poisson count: growth within two
    # of its standard deviations (2·sqrt(n)) is noise, not a queue building up
    allowed = max(MIN_GROWTH, GROWTH_SHARE * arrivals, 2.0 * math.sqrt(max(end, 0.0)))
    steady = end - start <= allowed
    out: dict[str, Any] = {
        "steady": bool(steady),
        "in_flight_start": start,
        "in_flight_end": end,
        "growth": end - start,
        "growth_per_s": (end - start) / apart_s,
        "allowed_growth": allowed,
    }
    if not steady:
        out["note"] = (
            f"requests in flight grew from {start:.1f} to {end:.1f} over the scoring window: "
            "the run never settled, so its latencies depend on its length. Either the load is "
            f"more than the server holds, or the warm-up ({window.warmup_s:g} s) is shorter "
            f"than a request's time in the system (median {_median_e2e(result):.3g} s)"
        )
    return out


def _median_e2e(result: RunResult) -> float:
    df = result.requests
    e2e = (df["finish_time"] - df["arrival_time"]).to_numpy(dtype=float)
    e2e = e2e[~np.isnan(e2e)]
    return float(np.median(e2e)) if len(e2e) else float("nan")
