"""Arrival processes: when each session's first request is sent.

Open loop: Poisson at ``rate``; gamma with shape ``burstiness`` and mean gap ``1/rate``
(vLLM's definition: burstiness 1 is Poisson, lower is burstier, the coefficient of
variation of the gaps is ``1/sqrt(burstiness)``); ``constant`` gaps of ``1/rate``; the
trace's own timestamps times ``time_scale``; or everything at t=0 when nothing is set.

Load stages (inference-perf's ``stages``): a rate for a duration, then the next, e.g.
``parse_stages("5:60,10:60")``. A stage of ``rate`` for ``duration_s`` sends
``round(rate * duration_s)`` sessions spread over its time (Poisson: uniformly at random,
which is a Poisson process given its count; gamma: gaps of that shape scaled to fill the
stage; constant: every ``1/rate`` from its start). The stages fix the number of sessions
(``ArrivalSpec.num_sessions``), so a run lasts as long in time whatever the trace; size
the trace with ``Trace.repeat_to``.
Closed loop: ``concurrency`` caps the sessions in flight (a single request is a session of
one), so N concurrent users each send their next request when the previous one finishes.
Later turns of a session always wait for the turn before them (see the runner), so a rate
counts sessions: on a multi-turn trace it sends ``Trace.requests_per_session`` times as
many requests per second while sessions arrive (``describe`` says both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stage:
    """``rate`` requests (sessions) per second for ``duration_s`` seconds."""

    rate: float
    duration_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"Stage.rate: must be > 0 requests/s (got {self.rate})")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"Stage.duration_s: must be > 0 seconds (got {self.duration_s})")

    @property
    def num_sessions(self) -> int:
        return round(self.rate * self.duration_s)

    def __str__(self) -> str:
        return f"{self.rate:g}:{self.duration_s:g}"


def parse_stages(text: str) -> tuple[Stage, ...]:
    """``"5:60,10:60"``: 5 req/s for 60 s, then 10 req/s for 60 s."""
    stages = []
    for part in text.split(","):
        rate, sep, duration = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError("no ':'")
            stages.append(Stage(float(rate), float(duration)))
        except ValueError as exc:
            raise ValueError(
                f"stage {part.strip()!r}: expected RATE:SECONDS such as 5:60 "
                f"(stages as 5:60,10:60); {exc}"
            ) from None
    return tuple(stages)


TIME_SCALE_RANGE = (1e-6, 1e6)
"""Timestamps stretched or squeezed further lose the float precision of the clock (1e300
made every latency 0.0 ms): a day-long trace squeezed into 0.1 s, or a 1 s gap stretched
to 11 days, are the limits."""


@dataclass(frozen=True)
class ArrivalSpec:
    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None
    timestamps: bool = False
    time_scale: float = 1.0
    constant: bool = False
    stages: tuple[Stage, ...] = ()

    @property
    def num_sessions(self) -> int | None:
        """How many sessions the stages send (None without stages: the trace decides)."""
        return sum(s.num_sessions for s in self.stages) if self.stages else None

    @property
    def duration_s(self) -> float | None:
        """How long the stages send for (None without stages)."""
        return sum(s.duration_s for s in self.stages) if self.stages else None

    @property
    def drawn(self) -> bool:
        """Whether ``arrival_times`` draws the times at random (its ``seed`` changes them):
        a Poisson or gamma rate or stages; not the trace's timestamps, a constant rate,
        all at once or a closed loop alone."""
        drawn = bool(self.stages) or self.rate is not None
        return drawn and not self.timestamps and not self.constant

    def __post_init__(self) -> None:
        if self.stages:
            self._check_stages()
        if self.rate is not None and not 0 < self.rate < math.inf:
            raise ValueError(
                f"ArrivalSpec.rate: must be > 0 requests/s and finite (got {self.rate})"
            )
        if not 0 < self.burstiness < math.inf:
            raise ValueError(
                f"ArrivalSpec.burstiness: must be > 0 and finite (got {self.burstiness})"
            )
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            raise ValueError(
                f"ArrivalSpec.concurrency: must be an integer >= 1 (got {self.concurrency!r})"
            )
        if not TIME_SCALE_RANGE[0] <= self.time_scale <= TIME_SCALE_RANGE[1]:
            raise ValueError(
                f"ArrivalSpec.time_scale: must be in [{TIME_SCALE_RANGE[0]:g}, "
                f"{TIME_SCALE_RANGE[1]:g}] (got {self.time_scale})"
            )
        if self.timestamps and self.rate is not None:
            raise ValueError("ArrivalSpec: give either timestamps=True or a rate, not both")
        if self.constant and self.rate is None and not self.stages:
            raise ValueError("ArrivalSpec.constant: needs a rate")
        if self.burstiness != 1.0 and self.rate is None and not self.stages:
            raise ValueError("ArrivalSpec.burstiness: needs a rate (the mean gap is 1/rate)")

    def _check_stages(self) -> None:
        if not all(isinstance(s, Stage) for s in self.stages):
            raise ValueError("ArrivalSpec.stages: expected Stage(rate, duration_s) items")
        if self.rate is not None or self.timestamps:
            raise ValueError("ArrivalSpec.stages: give stages, a rate or timestamps, not two")
        if self.num_sessions == 0:
            raise ValueError("ArrivalSpec.stages: the stages send no request (rate x duration)")

    def describe(self, requests_per_session: float = 1.0) -> str:
        """The load in words. A rate counts sessions (each starts with its first request;
        later turns follow the turn before them): with sessions of several requests
        (``Trace.requests_per_session``) it says so, with the requests per second that
        sends while sessions keep arriving."""

        def per_s(rate: float) -> str:
            if requests_per_session <= 1:
                return f"{rate:g} req/s"
            return f"{rate:g} sessions/s (~{rate * requests_per_session:.3g} req/s)"

        parts = []
        kind = (
            "constant"
            if self.constant
            else ("Poisson" if self.burstiness == 1 else f"gamma(burstiness={self.burstiness:g})")
        )
        if self.timestamps:
            parts.append(
                "trace timestamps" + (f" x{self.time_scale:g}" if self.time_scale != 1 else "")
            )
        elif self.stages:
            steps = ", ".join(f"{per_s(s.rate)} for {s.duration_s:g} s" for s in self.stages)
            parts.append(f"{kind} stages: {steps}")
        elif self.rate is not None:
            parts.append(f"{kind} at {per_s(self.rate)}")
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
    if spec.stages:
        return _staged_times(spec, n, seed)
    if spec.rate is None:
        return [0.0] * n
    if spec.constant:
        gaps = np.full(n - 1, 1.0 / spec.rate)
    else:
        rng = np.random.default_rng(seed)
        theta = 1.0 / (spec.rate * spec.burstiness)
        gaps = rng.gamma(shape=spec.burstiness, scale=theta, size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def _staged_times(spec: ArrivalSpec, n: int, seed: int) -> list[float]:
    if n != spec.num_sessions:
        raise ValueError(
            f"ArrivalSpec.stages send {spec.num_sessions} sessions, the trace has {n}; "
            f"size it with trace.repeat_to({spec.num_sessions})"
        )
    rng = np.random.default_rng(seed)
    times: list[float] = []
    start = 0.0
    for stage in spec.stages:
        k = stage.num_sessions
        if spec.constant:
            offsets = np.arange(k) / stage.rate
        else:
            cumulative = np.cumsum(rng.gamma(shape=spec.burstiness, size=k + 1))
            offsets = stage.duration_s * cumulative[:-1] / cumulative[-1]
        times.extend((start + offsets).tolist())
        start += stage.duration_s
    return times
