"""The Optuna objective: one trial = one configuration, measured and recorded.

Every trial stores what any later view needs as user attributes, so reports, exports and
comparisons read the study and never rerun it:

- ``config``: the full ``EngineConfig``; ``metrics``: the run summary the value comes from;
  ``rate``: the request rate of that run (None: the load's own arrivals);
- ``score`` (weighted score), ``attainment``, ``feasible``;
- ``worker``: the index of the worker process that ran it;
- goodput and pareto studies also ``goodput_value`` (the objective), ``goodput_rps`` and
  ``goodput_rung`` (the highest rate meeting the attainment target, found exactly for
  configs that meet it at the best rate so far; None for the others, whose value is their
  goodput at that rate) and ``probes`` (``[[rate, attainment], ...]``, every rate run).

A configuration already measured in the study is not run again: its record is copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from slotune.tuner.evaluate import Evaluator, GoodputResult, Measurement, config_key
from slotune.tuner.objectives import total_violation
from slotune.tuner.setup import TuneSetup
from slotune.tuner.space import SearchSpace

if TYPE_CHECKING:
    from slotune.tuner.ahead import NextTrialAhead

RECORD_KEYS = (
    "metrics",
    "rate",
    "score",
    "attainment",
    "feasible",
    "tier_attainment",
    "goodput_rps",
    "goodput_rung",
    "goodput_value",
    "probes",
)
METRIC_NAMES = {
    "weighted": ("weighted_score",),
    "goodput": ("goodput",),
    "pareto": ("goodput", "weighted_score"),
}
DIRECTIONS: dict[str, tuple[Literal["minimize", "maximize"], ...]] = {
    "weighted": ("minimize",),
    "goodput": ("maximize",),
    "pareto": ("maximize", "minimize"),
}


class TrialObjective:
    def __init__(
        self,
        setup: TuneSetup,
        evaluator: Evaluator,
        space: SearchSpace,
        baseline_rung: int | None = None,
        worker: int = 0,
        ahead: NextTrialAhead | None = None,
    ) -> None:
        self.setup = setup
        self.evaluator = evaluator
        self.space = space
        self.baseline_rung = baseline_rung
        self.worker = worker
        self.ahead = ahead

    def __call__(self, trial: Any) -> float | tuple[float, ...]:
        config = self.space.suggest(trial)
        trial.set_user_attr("config", config.to_dict())
        trial.set_user_attr("worker", self.worker)
        if self.ahead is not None:
            self.ahead.before_measure(trial, config)
        record = self._previous_record(trial, config_key(config))
        if record is None:
            record = self.measure(config, self._start_rung(trial))
        for key, value in record.items():
            trial.set_user_attr(key, value)
        if self.setup.objective == "weighted":
            for key, value in constraints(self.setup, record).items():
                trial.set_constraint(key, value)
        return values_of(self.setup.objective, record)

    def measure(self, config: Any, start_rung: int) -> dict[str, Any]:
        """The record of one configuration (no Optuna involved: the benchmark's grid uses it)."""
        objective = self.setup.objective
        if objective == "weighted":
            return _record(self.evaluator.measure(config))
        found = self.evaluator.goodput(config, start_rung)
        if objective == "goodput":
            return {**_record(found.at), **_goodput_fields(found)}
        at_load = self.evaluator.measure(config)
        return {**_record(at_load), **_goodput_fields(found)}

    def _start_rung(self, trial: Any) -> int:
        if self.setup.objective == "weighted":
            return 0
        rungs = [
            t.user_attrs["goodput_rung"]
            for t in _complete(trial.study)
            if t.user_attrs.get("goodput_rung") is not None
        ]
        if self.baseline_rung is not None:
            rungs.append(self.baseline_rung)
        return max(rungs, default=0)

    def _previous_record(self, trial: Any, key: str) -> dict[str, Any] | None:
        for t in _complete(trial.study):
            config = t.user_attrs.get("config")
            if config is not None and config_key_of(config) == key:
                record = {k: t.user_attrs[k] for k in RECORD_KEYS if k in t.user_attrs}
                return {**record, "reused_from": t.number}
        return None


def constraints(setup: TuneSetup, record: dict[str, Any]) -> dict[str, float]:
    """A weighted study's constraints (feasible when each is <= 0): the attainment target,
    or under a tier objective each tier floor (``tier_pro``: floor - the tier's attainment)."""
    if not setup.tier_objective:
        return {"attainment": setup.attainment - record["attainment"]}
    from slotune.tuner.objectives import parse_tier_objective
    from slotune.workloads.slo import tier_name

    by_tier = record.get("tier_attainment") or {}
    return {
        f"tier_{tier_name(t)}": floor - float(by_tier.get(str(t), 0.0))
        for t, floor in parse_tier_objective(setup.tier_objective).floors
    }


def weighted_rank(setup: TuneSetup) -> Callable[[Measurement], tuple[float, float]]:
    """A weighted study's order of measurements, as ``results.ranked`` orders its trials:
    the constraints' total violation, then the score (lowest first)."""

    def rank(m: Measurement) -> tuple[float, float]:
        return total_violation(constraints(setup, _record(m))), m.score

    return rank


def values_of(objective: str, record: dict[str, Any]) -> float | tuple[float, ...]:
    if objective == "weighted":
        return float(record["score"])
    if objective == "goodput":
        return float(record["goodput_value"])
    return float(record["goodput_value"]), float(record["score"])


def config_key_of(config: dict[str, Any]) -> str:
    from slotune.engine.config import EngineConfig

    return config_key(EngineConfig.from_dict(config))


def _record(m: Measurement) -> dict[str, Any]:
    return {
        "metrics": m.summary,
        "rate": m.rate,
        "score": m.score,
        "attainment": m.attainment,
        "feasible": m.feasible,
        "tier_attainment": m.tier_attainment,
    }


def _goodput_fields(found: GoodputResult) -> dict[str, Any]:
    return {
        "goodput_rps": found.rate,
        "goodput_rung": found.rung,
        "goodput_value": found.value,
        "probes": [[rate, att] for rate, att in sorted(found.probes.items())],
        "feasible": found.rate is not None,
    }


def _complete(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
