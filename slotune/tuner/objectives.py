"""Objective math: the weighted SLO score, the attainment constraint, and the rate search.

Everything here works on a run's summary dict (as ``slotune.workloads.summarize`` returns
it), so it is checked on hand-made summaries without running anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

OBJECTIVES = ("weighted", "goodput", "pareto")
METRIC_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e": "e2el_ms"}
"""SLO metric name -> the summary's latency key (values in milliseconds)."""
PENALTY_SCORE = 1e6
"""Score of a run whose percentile is undefined (no request finished): worse than any real one."""


def parse_weights(text: str) -> dict[str, float]:
    """``"ttft=0.5,tpot=0.5"`` -> ``{"ttft": 0.5, "tpot": 0.5}``; ValueError when malformed."""
    weights: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep:
            raise ValueError(f"--weights: {part!r} is not METRIC=WEIGHT (e.g. ttft=0.5,tpot=0.5)")
        if name not in METRIC_KEYS:
            raise ValueError(f"--weights: unknown metric {name!r}; use {', '.join(METRIC_KEYS)}")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"--weights: {name}={value!r} is not a number") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"--weights: {name}={value} must be a finite number >= 0")
        weights[name] = weight
    if not weights:
        raise ValueError("--weights: no weight given (e.g. ttft=0.5,tpot=0.5)")
    return weights


def resolve_weights(weights: dict[str, float] | None, slo_metrics: list[str]) -> dict[str, float]:
    """Weights normalized to sum 1, over metrics that the SLO names.

    Without ``--weights``: equal weights over the SLO's metrics (ttft=0.5,tpot=0.5 for the
    usual ``ttft=...,tpot=...``).
    """
    if weights is None:
        chosen = dict.fromkeys(slo_metrics, 1.0)
    else:
        missing = [m for m, w in weights.items() if w > 0 and m not in slo_metrics]
        if missing:
            raise ValueError(
                f"--weights: {', '.join(missing)} has no SLO target; the SLO names "
                f"{', '.join(slo_metrics)} (add it to --slo or drop its weight)"
            )
        chosen = {m: w for m, w in weights.items() if w > 0}
    total = sum(chosen.values())
    if not total > 0:
        raise ValueError("--weights: the weights must sum to a positive number")
    return {m: w / total for m, w in chosen.items()}


def percentile_key(percentile: float) -> str:
    return f"p{percentile:g}"


def weighted_score(
    summary: dict[str, Any],
    targets_ms: dict[str, float],
    weights: dict[str, float],
    percentile: float,
    own_percentiles: dict[str, float] | None = None,
) -> float:
    """Σ weight · metric_p / SLO target: 1.0 means every weighted metric sits at its target.

    p is ``percentile`` (``--percentile``), or the SLO's own for a metric written with one
    (``ttft:p90=300ms`` scores TTFT p90).
    """
    score = 0.0
    for metric, weight in weights.items():
        p = (own_percentiles or {}).get(metric, percentile)
        value = summary.get(METRIC_KEYS[metric], {}).get(percentile_key(p))
        if value is None or not math.isfinite(value):
            return PENALTY_SCORE
        score += weight * float(value) / targets_ms[metric]
    return score


def attainment(summary: dict[str, Any]) -> float:
    value = summary.get("slo_attainment")
    return float(value) if value is not None and math.isfinite(value) else 0.0


def sustained_share(summary: dict[str, Any], rate: float | None) -> float:
    """The share of the offered ``rate`` the server kept up with: 1 unless the run's
    steady-state check saw the requests in flight grow, then 1 - their growth per second
    / ``rate`` (what arrives and is not completed piles up)."""
    steady = summary.get("steady_state") or {}
    if steady.get("steady") is not False or not rate:
        return 1.0
    growth = steady.get("growth_per_s") or 0.0
    return min(1.0, max(0.0, 1.0 - growth / rate))


def total_violation(constraints: dict[str, float]) -> float:
    """How far a trial misses its constraints in all (each is met when <= 0): what ranks
    a weighted study's trials before their score."""
    return sum(max(v, 0.0) for v in constraints.values())


def attainment_violation(summary: dict[str, Any], target: float) -> float:
    """Optuna constraint value: ``target - attainment``, feasible when <= 0."""
    return target - attainment(summary)


@dataclass(frozen=True)
class RateLadder:
    """The request rates the goodput search probes: ``base · ratio**k`` for integer k.

    A fixed ladder makes every trial's goodput comparable (equal rungs are ties, broken by
    the weighted score) and lets probes be cached by rung.
    """

    base: float
    ratio: float = 1.02
    lowest: int = -400
    highest: int = 400
    max_gallop: int = 800  # the exact search's longest step, in rungs

    def rate(self, k: int) -> float:
        return self.base * self.ratio**k

    def rung(self, rate: float) -> int:
        return round(math.log(rate / self.base) / math.log(self.ratio))

    def to_dict(self) -> dict[str, float]:
        return {
            "base": self.base,
            "ratio": self.ratio,
            "lowest": self.lowest,
            "highest": self.highest,
            "max_gallop": self.max_gallop,
        }

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> RateLadder:
        """The ladder ``to_dict`` wrote (a study stored before ``max_gallop``: unlimited)."""
        gallop = int(data.get("max_gallop", cls.max_gallop))
        return cls(data["base"], data["ratio"], int(data["lowest"]), int(data["highest"]), gallop)


@dataclass
class RateSearch:
    """The highest ladder rung where a config meets its attainment target.

    A trial starts at the best rung so far: when it meets the target there, it gallops
    upward (1, 2, 4, ... rungs) and bisects, so an improvement or a tie is found exactly.
    When it misses, it cannot win, and the search stops after that one run (``run`` returns
    None; the objective then ranks the config by its goodput at that rate). ``exact`` (the
    baseline, whose rate nobody knows yet) gallops 16, 32, 64, ... rungs (at most the
    ladder's ``max_gallop``) either way and bisects to the rung.
    """

    feasible: Callable[[int], bool]
    ladder: RateLadder
    exact: bool = False
    probes: dict[int, bool] = field(default_factory=dict)

    def probe(self, k: int) -> bool:
        if k not in self.probes:
            self.probes[k] = self.feasible(k)
        return self.probes[k]

    def run(self, start: int) -> int | None:
        """The best feasible rung, or None (missed at ``start``; exact: at every rung)."""
        lo, hi = self.ladder.lowest, self.ladder.highest
        start = min(max(start, lo), hi)
        if self.probe(start):
            return self._up(start, hi)
        return self._down(start, lo) if self.exact else None

    def _up(self, ok: int, hi: int) -> int:
        step = self._first_step()
        while ok < hi:
            k = min(ok + step, hi)
            if not self.probe(k):
                return self._bisect(ok, k)
            ok, step = k, self._next_step(step)
        return ok

    def _down(self, bad: int, lo: int) -> int | None:
        step = self._first_step()
        while bad > lo:
            k = max(bad - step, lo)
            if self.probe(k):
                return self._bisect(k, bad)
            bad, step = k, self._next_step(step)
        return None

    def _first_step(self) -> int:
        return min(16, self.ladder.max_gallop) if self.exact else 1

    def _next_step(self, step: int) -> int:
        return min(step * 2, self.ladder.max_gallop) if self.exact else step * 2

    def _bisect(self, ok: int, bad: int) -> int:
        while bad - ok > 1:
            mid = (ok + bad) // 2
            if self.probe(mid):
                ok = mid
            else:
                bad = mid
        return ok


@dataclass(frozen=True)
class TierObjective:
    """``--tier-objective pro>=0.99,free=1``: attainment floors (constraints: a config
    below a tier's floor is infeasible) and weights of the tiers whose attainment the
    study maximizes (normalized to sum 1). Tiers by number (``pro`` 0, ``free`` 1)."""

    floors: tuple[tuple[int, float], ...]
    weights: tuple[tuple[int, float], ...]

    @property
    def tiers(self) -> set[int]:
        return {t for t, _ in self.floors} | {t for t, _ in self.weights}

    def tier_attainment(self, summary: dict[str, Any]) -> dict[int, float]:
        """Each named tier's attainment in the run (0 for a tier without requests)."""
        tiers = summary.get("tiers") or {}
        out = {}
        for t in sorted(self.tiers):
            value = (tiers.get(str(t)) or {}).get("slo_attainment")
            out[t] = float(value) if value is not None and math.isfinite(value) else 0.0
        return out

    def violations(self, summary: dict[str, Any]) -> dict[int, float]:
        """Optuna constraint values, one per floor: ``floor - attainment`` (<= 0 met)."""
        att = self.tier_attainment(summary)
        return {t: floor - att[t] for t, floor in self.floors}

    def attainment(self, summary: dict[str, Any]) -> float:
        """The weighted attainment of the maximized tiers (the floors' tiers when no tier
        has a weight)."""
        att = self.tier_attainment(summary)
        if not self.weights:
            return min((att[t] for t, _ in self.floors), default=0.0)
        return sum(w * att[t] for t, w in self.weights)


def parse_tier_objective(text: str) -> TierObjective:
    """``pro>=0.99,free=1`` -> floors {0: 0.99}, weights {1: 1.0}; ValueError naming the
    bad part."""
    from slotune.workloads.slo import tier_number

    floors: dict[int, float] = {}
    weights: dict[int, float] = {}
    expected = "expected e.g. pro>=0.99,free=1 (a floor with >=, a weight with =)"
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        floor = ">=" in part
        name, _, value = part.partition(">=" if floor else "=")
        if not _:
            raise ValueError(
                f"--tier-objective: {part!r} is not TIER>=SHARE or TIER=WEIGHT; {expected}"
            )
        tier = tier_number(name)
        if tier is None:
            raise ValueError(
                f"--tier-objective: {part!r}: unknown tier {name.strip()!r} (pro, free, or "
                f"tier0..); {expected}"
            )
        try:
            number = float(value)
        except ValueError:
            raise ValueError(
                f"--tier-objective: {part!r}: {value.strip()!r} is not a number"
            ) from None
        target = floors if floor else weights
        if tier in target:
            raise ValueError(f"--tier-objective: {part!r}: tier {name.strip()} is given twice")
        if floor and not 0 < number <= 1:
            raise ValueError(f"--tier-objective: {part!r}: a floor is a share in (0, 1]")
        if not floor and not (math.isfinite(number) and number >= 0):
            raise ValueError(f"--tier-objective: {part!r}: a weight is a number >= 0")
        target[tier] = number
    if not floors and not weights:
        raise ValueError(f"--tier-objective: nothing given; {expected}")
    total = sum(weights.values())
    if weights and not total > 0:
        raise ValueError("--tier-objective: the weights must sum to a positive number")
    normalized = tuple(sorted((t, w / total) for t, w in weights.items() if w > 0))
    return TierObjective(tuple(sorted(floors.items())), normalized)
