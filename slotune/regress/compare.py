"""Judging a run against a baseline, metric by metric.

Each side's value is the median of its repeats. A change counts as a regression when it
goes the worse way by more than the tolerance allows *and* by more than the noise band:
the larger of the two runs' ranges (max - min over the repeats). A single run, and every
simulated metric, has no spread, so simulated benchmarks compare exactly within their
tolerance; real backends repeat, so a noisy runner widens the band instead of failing the
build. Metrics a benchmark lists under ``report_only`` are judged and shown but never fail.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Literal

from slotune.regress.identity import check_comparable
from slotune.regress.results import BenchmarkResult, SuiteResult
from slotune.regress.tolerance import Tolerance, parse_tolerance

Verdict = Literal["ok", "improved", "noise", "regressed", "missing", "no baseline"]
FAILING: tuple[Verdict, ...] = ("regressed", "missing", "no baseline")


@dataclass(frozen=True)
class Judgement:
    benchmark: str
    metric: str
    tolerance: str
    baseline: float | None
    current: float | None
    noise: float
    verdict: Verdict
    gate: bool
    reason: str

    @property
    def change(self) -> float | None:
        if self.baseline is None or self.current is None:
            return None
        return self.current - self.baseline

    @property
    def relative_change(self) -> float | None:
        change = self.change
        if change is None or not self.baseline:
            return None
        return change / abs(self.baseline)

    @property
    def failed(self) -> bool:
        return self.gate and self.verdict in FAILING


@dataclass(frozen=True)
class Comparison:
    judgements: list[Judgement]
    not_run: list[str]  # benchmarks of the baseline that this run does not have

    @property
    def failures(self) -> list[Judgement]:
        return [j for j in self.judgements if j.failed]

    @property
    def exit_code(self) -> int:
        """0 when everything is within tolerance, 1 when anything regressed."""
        return 1 if self.failures else 0


def compare(baseline: SuiteResult, current: SuiteResult) -> Comparison:
    """Judge every metric of ``current`` (with its own tolerances) against ``baseline``;
    ``NotComparable`` when the baseline measured something else (see ``regress.identity``)."""
    identities = {b.name: b.identity for b in current.benchmarks}
    check_comparable(baseline, identities, where="this run")
    base = baseline.by_name()
    judgements = [
        judge(bench, metric, base.get(bench.name))
        for bench in current.benchmarks
        for metric in bench.tolerances
    ]
    names = {b.name for b in current.benchmarks}
    return Comparison(judgements, [b.name for b in baseline.benchmarks if b.name not in names])


def judge(current: BenchmarkResult, metric: str, baseline: BenchmarkResult | None) -> Judgement:
    tol = parse_tolerance(current.tolerances[metric])
    cur_values = _present(current.samples.get(metric, []))
    base_values = _present(baseline.samples.get(metric, [])) if baseline else []
    b = statistics.median(base_values) if base_values else None
    c = statistics.median(cur_values) if cur_values else None
    noise = max(_spread(base_values), _spread(cur_values))

    def verdict(v: Verdict, reason: str) -> Judgement:
        return Judgement(
            current.name,
            metric,
            str(tol),
            b,
            c,
            noise,
            v,
            metric not in current.report_only,
            reason,
        )

    if c is None:
        return verdict("missing", f"{metric} has no value in this run")
    if b is None:
        return verdict("no baseline", f"{metric} is not in the baseline; record a new baseline")
    return verdict(*_decide(metric, tol, b, c, noise))


def _decide(metric: str, tol: Tolerance, b: float, c: float, noise: float) -> tuple[Verdict, str]:
    change = c - b
    worse = {"up": change, "down": -change, "both": abs(change)}[tol.worse]
    allowed = tol.allowed(b)
    eps = 1e-9 * max(1.0, abs(b))
    moved = f"{metric} {_describe(change, b)} (allowed {tol})"
    if worse > allowed + eps:
        if worse > noise + eps:
            return "regressed", moved
        return "noise", f"{moved}, within the noise band ±{noise:.4g}"
    if tol.worse != "both" and -worse > max(allowed, noise) + eps:
        return "improved", moved
    return "ok", moved


def _describe(change: float, base: float) -> str:
    if change == 0:
        return "unchanged"
    way = "rose" if change > 0 else "fell"
    if base:
        return f"{way} {abs(change) / abs(base):.1%} ({base:.6g} → {base + change:.6g})"
    return f"{way} by {abs(change):.6g}"


def _present(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else 0.0
