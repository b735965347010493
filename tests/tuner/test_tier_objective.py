"""The tier objective: floors as Optuna constraints, weighted tiers maximized; a study's
best respects the floor (the evaluator's real scoring on hand-made summaries)."""

from __future__ import annotations

from dataclasses import replace

import optuna
import pytest

from slotune.tuner.evaluate import Evaluator
from slotune.tuner.objectives import parse_tier_objective
from slotune.tuner.results import finished, select_best
from slotune.tuner.study import make_sampler
from slotune.tuner.trial import TrialObjective
from slotune.workloads.trace import Trace, TraceRequest
from tests.tuner.test_study import SPACE, setup

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_parse_floors_and_weights() -> None:
    objective = parse_tier_objective("pro>=0.99, free=3, tier2=1")
    assert objective.floors == ((0, 0.99),)
    assert objective.weights == ((1, 0.75), (2, 0.25))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gold>=0.9", "unknown tier 'gold'"),
        ("pro>=1.5", "a floor is a share in (0, 1]"),
        ("pro", "is not TIER>=SHARE or TIER=WEIGHT"),
        ("free=x", "'x' is not a number"),
        ("free=0", "must sum to a positive number"),
        ("pro>=0.9,pro>=0.8", "given twice"),
    ],
)
def test_bad_tier_objectives_say_what(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_tier_objective(text)
    assert fragment in str(err.value)


class TierEvaluator(Evaluator):
    """Summaries made from the config: pro meets its SLO only from 100 sequences on, free
    does better the fewer sequences (so free's best is below pro's floor)."""

    def measure(self, config, rate=None):  # type: ignore[no-untyped-def]
        seqs = config.max_num_seqs
        pro = 1.0 if seqs >= 100 else 0.9
        free = 1.0 - seqs / 1000
        summary = {
            "slo_attainment": (pro + free) / 2,
            "tiers": {"0": {"slo_attainment": pro}, "1": {"slo_attainment": free}},
        }
        return self.measurement(summary, rate)


def test_a_config_below_the_floor_is_infeasible_and_the_best_respects_it() -> None:
    trace = Trace(
        "t", [TraceRequest("a", 10, 2, 0.0, tier=0), TraceRequest("b", 10, 2, 0.0, tier=1)]
    )
    tiered = replace(setup(), slo="pro:ttft=300ms;free:ttft=2s", tier_objective="pro>=0.99,free=1")
    evaluator = TierEvaluator(tiered, trace)
    study = optuna.create_study(
        direction="minimize", sampler=make_sampler("random", 1, n_trials=30)
    )
    study.optimize(TrialObjective(tiered, evaluator, SPACE), n_trials=30)  # type: ignore[arg-type]
    trials = finished(study)
    below = [t for t in trials if t.user_attrs["config"]["max_num_seqs"] < 100]
    above = [t for t in trials if t.user_attrs["config"]["max_num_seqs"] >= 100]
    assert below and above
    for t in below:
        assert t.constraints == {"tier_pro": pytest.approx(0.09)}
        assert t.user_attrs["feasible"] is False
    for t in above:
        assert t.constraints["tier_pro"] <= 0 and t.user_attrs["feasible"] is True
    # the score is free's share of misses: the fewest sequences win among the feasible
    best = select_best(trials, "weighted", tiered.attainment)
    seqs = best.user_attrs["config"]["max_num_seqs"]
    assert seqs == min(t.user_attrs["config"]["max_num_seqs"] for t in above)
    assert best.value == pytest.approx(seqs / 1000)
    assert best.value > min(t.value for t in below)  # the unconstrained best is infeasible
    assert study.best_trial.number == best.number


def test_defaults_below_a_floor_are_not_kept_as_noise() -> None:
    """The noise check compares scores; defaults that miss a tier floor the best meets
    are not a tie to keep (it would otherwise run the seeds and may keep them)."""
    from types import SimpleNamespace

    from slotune.tuner.results import _verdict

    tiered = replace(setup(), tier_objective="pro>=0.99,free=1")
    best = SimpleNamespace(user_attrs={"config": {"max_num_seqs": 100}, "feasible": True})
    baseline = {"config": {"max_num_seqs": 256}, "feasible": False}
    assert _verdict(tiered, best, baseline, evaluator=None) is None
