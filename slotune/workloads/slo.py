"""Service-level objectives written ``ttft=300ms,tpot=50ms`` or ``ttft:p90=300ms``.

Metrics: ``ttft`` (time to first token), ``tpot`` (time per output token after the first),
``itl`` (every gap between tokens), ``e2e`` (end-to-end latency); units ``ms`` or ``s``.
A target without a percentile is checked per request (a request meets the SLO when it
meets every target; for ``itl``, every one of its gaps). A target with a percentile is
also checked on the run's distribution (``ttft:p90=300ms``: the p90 TTFT at most 300 ms).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

METRICS = ("ttft", "tpot", "itl", "e2e")
_ITEM = re.compile(r"^(?P<metric>[a-z0-9_]+)(?::p(?P<pct>\d+(?:\.\d+)?))?=(?P<value>[^=]*)$")
_VALUE = re.compile(r"^(?P<num>\d+(?:\.\d+)?|\.\d+)(?P<unit>ms|s)$")
_EXPECTED = (
    "expected e.g. ttft=300ms,tpot=50ms or ttft:p90=300ms "
    "(metrics ttft, tpot, itl, e2e; units ms or s)"
)


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
    targets: tuple[SLOTarget, ...]

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
        return ",".join(str(t) for t in self.targets)

    def to_dict(self) -> dict[str, dict[str, float | None]]:
        return {
            t.metric: {"threshold_ms": t.threshold_ms, "percentile": t.percentile}
            for t in self.targets
        }


def parse_slo(text: str) -> SLO:
    """Parse ``ttft=300ms,tpot=50ms``; a ValueError names the bad part and the expected form."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"SLO is empty; {_EXPECTED}")
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
