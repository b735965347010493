"""Run one configuration on the study's trace and load, and score it.

The evaluator owns the trace (loaded once per process) and a cache of summaries keyed by
configuration and rate: a simulation is deterministic, so nothing is ever run twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from slotune.engine.config import EngineConfig
from slotune.tuner.objectives import (
    RateLadder,
    RateSearch,
    TierObjective,
    attainment,
    parse_tier_objective,
    sustained_share,
    weighted_score,
)
from slotune.tuner.setup import TuneSetup

if TYPE_CHECKING:
    from slotune.workloads.backends import Backend

_BASE_PERCENTILES = (50, 90, 95, 99)


def config_key(config: EngineConfig) -> str:
    return json.dumps(config.to_dict(), sort_keys=True)


@dataclass(frozen=True)
class Measurement:
    """One run's summary with the study's score and attainment of it; ``sustained``: the
    share of the rate a timed run kept up with (1 when it settled; burst runs are not held
    to it)."""

    rate: float | None
    summary: dict[str, Any]
    score: float
    attainment: float
    feasible: bool
    sustained: float = 1.0
    tier_attainment: dict[str, float] | None = None  # under a tier objective, by tier


@dataclass(frozen=True)
class GoodputResult:
    """The goodput search of one config.

    ``rate``: the highest ladder rate meeting the attainment target, when the config met it
    at the search's start (None otherwise); ``at``: the measurement there, or at the start
    when it missed; ``probes``: every rate run, with its attainment.
    """

    rate: float | None
    rung: int | None
    at: Measurement
    probes: dict[float, float]

    @property
    def value(self) -> float:
        """The objective: the rate found, or else the goodput (req/s meeting the SLO) at the
        start rate, ``rate x attainment`` (x the share of the rate a timed run kept up
        with), which is below any rate found there."""
        if self.rate is not None:
            return self.rate
        return (self.at.rate or 0.0) * self.at.attainment * self.at.sustained


class Evaluator:
    def __init__(self, setup: TuneSetup, trace: Any | None = None) -> None:
        from slotune.workloads import parse_slo

        self.setup = setup
        self.slo = parse_slo(setup.slo)
        self.targets_ms = {t.metric: t.threshold_ms for t in self.slo.targets}
        self.own_percentiles = {
            t.metric: t.percentile for t in self.slo.targets if t.percentile is not None
        }
        self.trace = trace if trace is not None else load_setup_trace(setup)
        self.ladder = RateLadder.from_dict(setup.ladder) if setup.ladder else None
        self.horizons = True  # cut simulated runs at ``run_horizon_s``
        self.tier_objective: TierObjective | None = (
            parse_tier_objective(setup.tier_objective) if setup.tier_objective else None
        )
        self._cache: dict[tuple[str, float | None], Measurement] = {}
        self._repeats: dict[int, Any] = {}
        self.runs = 0
        self._rank: Callable[[Measurement], tuple[float, ...]] | None = None
        self._pinned: set[str] = set()
        self._held: dict[tuple[str, float | None], Any] = {}
        self._best_held: tuple[tuple[float, ...], tuple[str, float | None]] | None = None
        # a what-if rerun the last trial started on its spare core (``ahead.NextTrialAhead``),
        # for the finish's ``what_if`` to take
        self.rerun_ahead: Any = None

    @property
    def percentiles(self) -> tuple[float, ...]:
        return tuple(
            sorted({*_BASE_PERCENTILES, self.setup.percentile, *self.own_percentiles.values()})
        )

    def backend(self) -> Backend:
        """Where the study's trials run: the simulator, or the embedded engine."""
        from slotune.workloads.backends import EngineBackend, SimBackend

        setup = self.setup
        if setup.backend == "engine":
            return EngineBackend(setup.model)
        return SimBackend(
            setup.gpu, setup.model, setup.tp, setup.ep, setup.quantization, setup.stack
        )

    def run(
        self, config: EngineConfig, rate: float | None = None, backend: Backend | None = None
    ) -> Any:
        """One full run (``RunResult``) at the study's load, or at ``rate``, on the study's
        backend or on ``backend`` (``tune --verify`` measures a real server with it)."""
        from slotune.workloads.backends import SimBackend, run

        backend = backend or self.backend()
        arrivals = self.setup.load.arrivals(rate)
        trace = self.trace if arrivals.num_sessions is None else self._repeated(arrivals)
        self.runs += 1
        simulated = isinstance(backend, SimBackend)
        horizon = run_horizon_s(self.slo, trace, arrivals) if simulated and self.horizons else None
        return run(
            backend,
            trace,
            arrivals,
            config,
            seed=self.setup.seed,
            timeout_s=self.setup.request_timeout_s,
            horizon_s=horizon,
        )

    @property
    def seed_free(self) -> bool:
        """Whether a run at any other seed is this evaluator's run, for every configuration
        and rate: a simulated run reads its seed only where it draws arrival times, and
        this load draws none (the trace's timestamps, all at once or a closed loop). A real
        engine's runs differ by themselves."""
        return self.setup.backend == "sim" and not self.setup.load.arrivals().drawn

    def _repeated(self, arrivals: Any) -> Any:
        """The trace repeated to the sessions of a timed run, kept for the next run at that
        rate (trials meet at the best rate so far; the prompts' tokens are made once)."""
        n = arrivals.num_sessions
        if self._repeats.get(n) is None:
            self._repeats = {n: self.trace.repeat_to(n)}
        return self._repeats[n]

    def summarize(self, result: Any, rate: float | None = None) -> dict[str, Any]:
        """The run's summary; ``rate``: the open-loop rate it offered (caps goodput)."""
        from slotune.workloads import summarize

        setup = self.setup
        offered = None if setup.load.timestamps or setup.load.concurrency else rate
        return _plain(
            summarize(
                result,
                self.slo,
                percentiles=self.percentiles,
                warmup_s=setup.warmup_s,
                cooldown_s=setup.cooldown_s,
                offered_rate=offered,
            )
        )

    def measure(self, config: EngineConfig, rate: float | None = None) -> Measurement:
        key = self._key(config, rate)
        rate = key[1]
        if key not in self._cache:
            result = self.run(config, rate)
            measured = self._cache[key] = self.measurement(self.summarize(result, rate), rate)
            if self._holds(key, measured):
                self._held[key] = _packed(result)
        return self._cache[key]

    def measure_ahead(self, configs: list[EngineConfig], workers: int) -> None:
        """What ``measure`` returns for each of ``configs`` at the study's load, measured
        now, ``workers`` runs at once in forked processes (``tuner.forked``; one after
        another in this process where it does not fork). The runs are held as ``measure``
        holds them, in the order of ``configs``."""
        from slotune.tuner.forked import map_forked

        todo: dict[tuple[str, float | None], EngineConfig] = {}
        for config in configs:
            if not self.measured(config):
                todo.setdefault(self._key(config, None), config)
        for config, (measurement, packed) in zip(
            todo.values(),
            map_forked(partial(self.apart, best=self.best_rank), list(todo.values()), workers),
            strict=True,
        ):
            self.take(config, measurement, packed)

    def measured(self, config: EngineConfig) -> bool:
        """Whether ``measure(config)`` at the study's load returns at once."""
        return self._key(config, None) in self._cache

    def measured_keys(self) -> frozenset[str]:
        """The ``config_key`` of every configuration measured at the study's load."""
        rate = self.setup.load.rate
        return frozenset(key for key, at in self._cache if at == rate)

    @property
    def best_rank(self) -> tuple[float, ...] | None:
        """The rank of the best run held so far (None: none yet)."""
        return None if self._best_held is None else self._best_held[0]

    def apart(
        self, config: EngineConfig, best: tuple[float, ...] | None
    ) -> tuple[Measurement, Any]:
        """``config`` measured at the study's load apart from this evaluator (in a forked
        child), with its run packed for ``take`` where it could be held: pinned, or ranking
        before ``best`` (the ``best_rank`` when it was asked for; None otherwise)."""
        rate = self.setup.load.rate
        result = self.run(config, rate)
        measurement = self.measurement(self.summarize(result, rate), rate)
        kept = self._rank is not None and (
            best is None or config_key(config) in self._pinned or self._rank(measurement) < best
        )
        return measurement, _packed(result) if kept else None

    def take(self, config: EngineConfig, measurement: Measurement, packed: Any) -> None:
        """Store what ``apart`` measured, as ``measure`` stores what it measures."""
        key = self._key(config, None)
        if key in self._cache:
            return
        self.runs += 1  # (a child's count stays in the child)
        self._cache[key] = measurement
        if self._holds(key, measurement):
            if packed is None:
                raise RuntimeError(f"the run of {key[0]} was not kept but ranks first now")
            self._held[key] = packed

    def hold_runs(self, rank: Callable[[Measurement], tuple[float, ...]]) -> None:
        """Keep the whole run of the best measurement so far by ``rank`` (lowest first) and
        of every ``pin``ned configuration, for ``held_run``. Simulated runs only: they are
        deterministic, so the tune's finish writes them instead of running them again."""
        if self.setup.backend == "sim":
            self._rank = rank

    def pin(self, config: EngineConfig) -> None:
        """Hold the runs of ``config`` measured from now on (the baseline)."""
        self._pinned.add(config_key(config))

    def held_run(self, config: EngineConfig, rate: float | None = None) -> Any | None:
        """The run ``run(config, rate)`` would give, when held (a copy: None otherwise)."""
        held = self._held.get(self._key(config, rate))
        return None if held is None else _unpacked(held)

    def _key(self, config: EngineConfig, rate: float | None) -> tuple[str, float | None]:
        """A run's key: the configuration and the rate (None: the study's load)."""
        return config_key(config), self.setup.load.rate if rate is None else rate

    def _holds(self, key: tuple[str, float | None], measured: Measurement) -> bool:
        """Whether the run just measured under ``key`` is to be held: the best so far by
        rank (whose predecessor's run is dropped then, unless pinned) or a pinned one."""
        if self._rank is None:
            return False
        rank = self._rank(measured)
        best = self._best_held
        if best is None or rank < best[0]:
            self._best_held = (rank, key)
            if best is not None and best[1][0] not in self._pinned:
                self._held.pop(best[1], None)
            return True
        return key[0] in self._pinned

    def measurement(self, summary: dict[str, Any], rate: float | None) -> Measurement:
        att = attainment(summary)
        score = weighted_score(
            summary,
            self.targets_ms,
            self.setup.weights,
            self.setup.percentile,
            self.own_percentiles,
        )
        # a timed run that never settled measured a burst, not a rate the server holds
        timed = self.setup.load.duration_s is not None
        sustained = sustained_share(summary, rate) if timed else 1.0
        settled = not timed or (summary.get("steady_state") or {}).get("steady") is not False
        feasible = att >= self.setup.attainment and settled
        tiers = self.tier_objective
        if tiers is None:
            return Measurement(rate, summary, score, att, feasible, sustained)
        # a tier objective: its floors are constraints, its weighted attainment what counts;
        # the weighted objective's score becomes the weighted share of misses
        floors_met = all(v <= 0 for v in tiers.violations(summary).values())
        att = tiers.attainment(summary)
        if self.setup.objective == "weighted":
            score, feasible = 1.0 - att, floors_met and settled
        else:
            feasible = floors_met and att >= self.setup.attainment and settled
        by_tier = {str(t): a for t, a in tiers.tier_attainment(summary).items()}
        return Measurement(rate, summary, score, att, feasible, sustained, by_tier)

    def goodput(
        self, config: EngineConfig, start_rung: int, *, exact: bool = False
    ) -> GoodputResult:
        """The rate search of the goodput objective, starting at ``start_rung``."""
        if self.ladder is None:
            raise ValueError("this study has no rate ladder: goodput needs an open-loop load")
        ladder = self.ladder

        def feasible(k: int) -> bool:
            return self.measure(config, ladder.rate(k)).feasible

        search = RateSearch(feasible, ladder, exact=exact)
        rung = search.run(start_rung)
        probes = {
            ladder.rate(k): self.measure(config, ladder.rate(k)).attainment
            for k in sorted(search.probes)
        }
        at_rung = rung if rung is not None else min(search.probes)
        at = self.measure(config, ladder.rate(at_rung))
        rate = ladder.rate(rung) if rung is not None else None
        return GoodputResult(rate, rung, at, probes)


def run_horizon_s(slo: Any, trace: Any, arrivals: Any) -> float | None:
    """When a simulated run may stop: ``slo.longest_meeting_s`` (for the trace's longest
    output) after its last request is sent, where that time is known before the run. A
    request still in flight then can no longer meet the SLO, so stopping there leaves every
    request's SLO verdict as it is and spares the drain of an overloaded run's queue.

    The last send is known for a timed run (its stages end at their ``duration_s``) and
    for a replay of the trace's timestamps (its last one, scaled); not where a send waits
    for a finish: under a concurrency cap, or for a session's later turns."""
    if not len(trace) or arrivals.concurrency is not None or trace.requests_per_session > 1:
        return None
    if arrivals.stages:
        last_send = arrivals.duration_s
    elif arrivals.timestamps:
        from slotune.workloads.arrivals import arrival_times

        times = [r.arrival_time for r in trace.requests]
        last_send = max(arrival_times(arrivals, len(times), trace_times=times))
    else:
        return None
    longest = slo.longest_meeting_s(max(r.output_len for r in trace.requests))
    return None if longest is None else last_send + longest


def load_setup_trace(setup: TuneSetup) -> Any:
    from slotune.workloads import load_trace

    return load_trace(
        setup.trace,
        format=setup.trace_format,
        num_requests=setup.num_requests,
        seed=setup.seed,
        model=setup.model,
    )


def _packed(result: Any) -> Any:
    """A run held for later: each request's token times as one float array (a quarter of
    the memory of a list of Python floats)."""
    import numpy as np

    requests = result.requests.copy()
    requests["token_times"] = [np.array(t, dtype=float) for t in requests["token_times"]]
    return replace(result, requests=requests)


def _unpacked(held: Any) -> Any:
    """The run as ``run`` returned it: token times as lists of the same floats."""
    requests = held.requests.copy()
    requests["token_times"] = [t.tolist() for t in requests["token_times"]]
    return replace(held, requests=requests)


def _plain(value: Any) -> Any:
    """JSON-safe copy for Optuna user attributes: numpy scalars to Python numbers, NaN and
    infinities to None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, str)):
        return value
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None
