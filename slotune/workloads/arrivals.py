"""Arrival processes: when each session's first request is sent.

Open loop: Poisson at ``rate``; gamma with shape ``burstiness`` and mean gap ``1/rate``
(vLLM's definition: burstiness 1 is Poisson, lower is burstier, the coefficient of
variation of the gaps is ``1/sqrt(burstiness)``); ``constant`` gaps of ``1/rate``; the
trace's own timestamps times ``time_scale``; or everything at t=0 when nothing is set.
Closed loop: ``concurrency`` caps the sessions in flight (a single request is a session of
one), so N concurrent users each send their next request when the previous one finishes.
Later turns of a session always wait for the turn before them (see the runner).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ArrivalSpec:
    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None
    timestamps: bool = False
    time_scale: float = 1.0
    constant: bool = False

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"ArrivalSpec.rate: must be > 0 requests/s (got {self.rate})")
        if not self.burstiness > 0:
            raise ValueError(f"ArrivalSpec.burstiness: must be > 0 (got {self.burstiness})")
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            raise ValueError(
                f"ArrivalSpec.concurrency: must be an integer >= 1 (got {self.concurrency!r})"
            )
        if not self.time_scale > 0:
            raise ValueError(f"ArrivalSpec.time_scale: must be > 0 (got {self.time_scale})")
        if self.timestamps and self.rate is not None:
            raise ValueError("ArrivalSpec: give either timestamps=True or a rate, not both")
        if self.constant and self.rate is None:
            raise ValueError("ArrivalSpec.constant: needs a rate")
        if self.burstiness != 1.0 and self.rate is None:
            raise ValueError("ArrivalSpec.burstiness: needs a rate (the mean gap is 1/rate)")

    def describe(self) -> str:
        parts = []
        if self.timestamps:
            parts.append(
                "trace timestamps" + (f" x{self.time_scale:g}" if self.time_scale != 1 else "")
            )
        elif self.rate is not None:
            kind = (
                "constant"
                if self.constant
                else (
                    "Poisson" if self.burstiness == 1 else f"gamma(burstiness={self.burstiness:g})"
                )
            )
            parts.append(f"{kind} at {self.rate:g} req/s")
        elif self.concurrency is None:
            parts.append("all at once")
        if self.concurrency is not None:
            parts.append(f"closed loop, concurrency {self.concurrency}")
        return ", ".join(parts)


ALL_AT_ONCE = ArrivalSpec()


def arrival_times(
    spec: ArrivalSpec, n: int, *, trace_times: list[float | None] | None = None, seed: int = 0
) -> list[float]:
    """Start times of ``n`` sessions, first at 0 for generated processes.

    ``trace_times`` are the trace's timestamps of the same sessions (needed for
    ``timestamps=True``). With only ``concurrency`` set, every session is ready at t=0
    and the concurrency cap decides when it really starts.
    """
    if n == 0:
        return []
    if spec.timestamps:
        if trace_times is None or any(t is None for t in trace_times):
            raise ValueError(
                "ArrivalSpec.timestamps: the trace has no timestamps; use a rate instead"
            )
        first = min(trace_times)  # type: ignore[type-var]
        return [(t - first) * spec.time_scale for t in trace_times]  # type: ignore[operator]
    if spec.rate is None:
        return [0.0] * n
    if spec.constant:
        gaps = np.full(n - 1, 1.0 / spec.rate)
    else:
        rng = np.random.default_rng(seed)
        theta = 1.0 / (spec.rate * spec.burstiness)
        gaps = rng.gamma(shape=spec.burstiness, scale=theta, size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]
