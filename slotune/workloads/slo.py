"""Service-level objectives written ``ttft=300ms,tpot=50ms`` or ``ttft:p90=300ms``.

Metrics: ``ttft`` (time to first token), ``tpot`` (time per output token after the first),
``itl`` (every gap between tokens), ``e2e`` (end-to-end latency); units ``ms`` or ``s``.
A target without a percentile is checked per request (a request meets the SLO when it
meets every target; for ``itl``, every one of its gaps). A target with a percentile is
also checked on the run's distribution (``ttft:p90=300ms``: the p90 TTFT at most 300 ms).

Per service tier: ``pro:ttft=200ms,tpot=30ms;free:ttft=2s,tpot=100ms`` gives each tier its
own targets (tiers by name, ``pro`` = 0 and ``free`` = 1, or by number, ``tier2`` or
``2``); a part without a tier name covers the tiers not named. Each request is checked
against its tier's targets; the run-wide targets (``SLO.targets``: horizons, latency
weights, percentile checks) are the default part's, else the loosest of the tiers' per
metric.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

METRICS = ("ttft", "tpot", "itl", "e2e")
_ITEM = re.compile(r"^(?P<metric>[a-z0-9_]+)(?::p(?P<pct>\d+(?:\.\d+)?))?=(?P<value>[^=]*)$")
_VALUE = re.compile(r"^(?P<num>\d+(?:\.\d+)?|\.\d+)(?P<unit>ms|s)$")
_EXPECTED = (
    "expected e.g. ttft=300ms,tpot=50ms or ttft:p90=300ms "
    "(metrics ttft, tpot, itl, e2e; units ms or s), per tier "
    "pro:ttft=200ms,tpot=30ms;free:ttft=2s"
)
TIER_NAMES = {"pro": 0, "free": 1}
_TIER = re.compile(r"^(?:tier)?(?P<num>\d+)$")


def tier_number(name: str) -> int | None:
    """``pro`` -> 0, ``free`` -> 1, ``tier3`` or ``3`` -> 3; None for anything else."""
    name = name.strip().lower()
    if name in TIER_NAMES:
        return TIER_NAMES[name]
    m = _TIER.match(name)
    return int(m["num"]) if m else None


def tier_name(tier: int) -> str:
    """The name a tier is written with: ``pro``, ``free``, ``tier2``..."""
    return next((n for n, t in TIER_NAMES.items() if t == tier), f"tier{tier}")


@dataclass(frozen=True)
class SLOTarget:
    metric: str
    threshold_s: float
    percentile: float | None = None

    @property
    def threshold_ms(self) -> float:
        return self.threshold_s * 1000.0

    def __str__(self) -> str:
        pct = "" if self.percentile is None else f":p{self.percentile:g}"
        return f"{self.metric}{pct}={self.threshold_ms:g}ms"


@dataclass(frozen=True)
class SLO:
    """``targets`` hold for every request, unless ``tiers`` gives a tier its own SLO
    (``for_tier``); ``default`` says whether ``targets`` were written for the tiers not
    named (False: they are only the loosest of the tiers', for run-wide views)."""

    targets: tuple[SLOTarget, ...]
    tiers: tuple[tuple[int, SLO], ...] = ()
    default: bool = True

    def for_tier(self, tier: int) -> SLO:
        """The SLO a request of ``tier`` is checked against."""
        return next((s for t, s in self.tiers if t == tier), SLO(self.targets))

    def check_tiers(self, trace_tiers: set[int]) -> None:
        """ValueError when a tier named here has no request in the trace, or a tier of
        the trace has no targets (no part of its own and no part without a tier name)."""
        named = {t for t, _ in self.tiers}
        have = ", ".join(tier_name(t) for t in sorted(trace_tiers)) or "none"
        for t in sorted(named - trace_tiers):
            raise ValueError(
                f"SLO part for tier {tier_name(t)!r}: the trace has no request of that tier "
                f"(its tiers: {have})"
            )
        if named and not self.default:
            for t in sorted(trace_tiers - named):
                raise ValueError(
                    f"the trace has requests of tier {tier_name(t)!r} and the SLO gives "
                    f"them no targets (add '{tier_name(t)}:ttft=...' or a part without a "
                    "tier name)"
                )

    def get(self, metric: str) -> SLOTarget | None:
        return next((t for t in self.targets if t.metric == metric), None)

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(t.metric for t in self.targets)

    def threshold_s(self, metric: str) -> float | None:
        t = self.get(metric)
        return None if t is None else t.threshold_s

    def longest_meeting_s(self, output_tokens: int) -> float | None:
        """The longest a request of ``output_tokens`` tokens can take (arrival to last
        token) and still meet every target; None when the targets set no such bound."""
        bounds = []
        if (e2e := self.threshold_s("e2e")) is not None:
            bounds.append(e2e)
        gaps = [g for g in (self.threshold_s("tpot"), self.threshold_s("itl")) if g is not None]
        if (ttft := self.threshold_s("ttft")) is not None and (gaps or output_tokens <= 1):
            bounds.append(ttft + min(gaps, default=0.0) * max(output_tokens - 1, 0))
        return min(bounds, default=None)

    def __str__(self) -> str:
        own = ",".join(str(t) for t in self.targets)
        if not self.tiers:
            return own
        parts = [f"{tier_name(t)}:{s}" for t, s in self.tiers]
        return ";".join([*parts, own] if self.default else parts)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            t.metric: {"threshold_ms": t.threshold_ms, "percentile": t.percentile}
            for t in self.targets
        }
        if self.tiers:
            out["tiers"] = {tier_name(t): s.to_dict() for t, s in self.tiers}
        return out


def parse_slo(text: str) -> SLO:
    """Parse ``ttft=300ms,tpot=50ms`` or per tier ``pro:ttft=200ms;free:ttft=2s``; a
    ValueError names the bad part and the expected form."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"SLO is empty; {_EXPECTED}")
    if ";" not in text and _tier_prefix(text)[0] is None:
        return _parse_targets(text)
    tiers: dict[int, SLO] = {}
    default: SLO | None = None
    for raw in text.split(";"):
        name, body = _tier_prefix(raw)
        if name is None:
            if default is not None:
                raise ValueError(f"SLO part {raw.strip()!r}: a second part without a tier name")
            default = _parse_targets(body)
            continue
        tier = tier_number(name)
        if tier is None:
            raise ValueError(
                f"SLO part {raw.strip()!r}: unknown tier {name!r} (pro, free, or tier0..); "
                f"{_EXPECTED}"
            )
        if tier in tiers:
            raise ValueError(f"SLO part {raw.strip()!r}: tier {name} is given twice")
        tiers[tier] = _parse_targets(body)
    ordered = tuple(sorted(tiers.items()))
    if default is not None:
        return SLO(default.targets, ordered, default=True)
    return SLO(_loosest([s for _, s in ordered]), ordered, default=False)


def _tier_prefix(text: str) -> tuple[str | None, str]:
    """``("pro", "ttft=200ms")`` for ``pro:ttft=200ms``; ``(None, text)`` without a tier
    name (``ttft:p90=300ms`` names a metric, not a tier)."""
    head, sep, rest = text.strip().partition(":")
    if not sep or "=" in head or "," in head or head.strip().lower() in METRICS:
        return None, text
    return head.strip(), rest


def _loosest(slos: list[SLO]) -> tuple[SLOTarget, ...]:
    """Per metric, the largest threshold any of ``slos`` sets (its percentile with it)."""
    best: dict[str, SLOTarget] = {}
    for slo in slos:
        for t in slo.targets:
            if t.metric not in best or t.threshold_s > best[t.metric].threshold_s:
                best[t.metric] = t
    return tuple(best.values())


def _parse_targets(text: str) -> SLO:
    if not text.strip():
        raise ValueError(f"SLO part is empty; {_EXPECTED}")
    targets: list[SLOTarget] = []
    for raw in text.split(","):
        item = raw.strip().lower()
        m = _ITEM.match(item)
        if not m:
            raise ValueError(f"SLO part {raw.strip()!r} is not metric=value; {_EXPECTED}")
        metric = m["metric"]
        if metric not in METRICS:
            raise ValueError(f"SLO part {raw.strip()!r}: unknown metric {metric!r}; {_EXPECTED}")
        if any(t.metric == metric for t in targets):
            raise ValueError(f"SLO part {raw.strip()!r}: {metric} is given twice; {_EXPECTED}")
        v = _VALUE.match(m["value"].strip())
        if not v:
            raise ValueError(
                f"SLO part {raw.strip()!r}: {m['value']!r} is not a number with a unit; {_EXPECTED}"
            )
        seconds = float(v["num"]) / (1000.0 if v["unit"] == "ms" else 1.0)
        if seconds <= 0:
            raise ValueError(
                f"SLO part {raw.strip()!r}: the threshold must be positive; {_EXPECTED}"
            )
        pct = None if m["pct"] is None else float(m["pct"])
        if pct is not None and not 0 < pct <= 100:
            raise ValueError(
                f"SLO part {raw.strip()!r}: percentile must be in (0, 100]; {_EXPECTED}"
            )
        targets.append(SLOTarget(metric=metric, threshold_s=seconds, percentile=pct))
    return SLO(targets=tuple(targets))
