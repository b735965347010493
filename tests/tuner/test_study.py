"""Trials, constraints and selection with a fake evaluator (no simulation), and storage."""

from __future__ import annotations

import optuna
import pytest

from slotune.tuner.evaluate import GoodputResult, Measurement
from slotune.tuner.objectives import RateLadder
from slotune.tuner.results import finished, pareto_front, select_best
from slotune.tuner.setup import LoadSpec, TuneSetup
from slotune.tuner.space import build_space
from slotune.tuner.study import make_sampler
from slotune.tuner.trial import TrialObjective

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = build_space(
    max_model_len=1024,
    overrides={
        "max_num_batched_tokens": 2048,
        "long_prefill_token_threshold": "off",
        "block_size": 16,
        "preemption_mode": "recompute",
        "prefix_caching": "hash",
        "policy": "chunked",
        "max_num_seqs": {"low": 8, "high": 512},
    },
)


class FakeEvaluator:
    """Score falls with max_num_seqs, but below 100 sequences the SLO is missed:
    the best score is infeasible, the best feasible one sits at 100."""

    def __init__(self) -> None:
        self.runs = 0
        self.ladder = RateLadder(base=1.0)

    def measure(self, config, rate=None) -> Measurement:
        self.runs += 1
        att = 1.0 if config.max_num_seqs >= 100 else 0.5
        return Measurement(
            rate, {"slo_attainment": att}, config.max_num_seqs / 100, att, att >= 0.99
        )


def setup(objective: str = "weighted") -> TuneSetup:
    return TuneSetup(
        gpu="h100",
        model="llama-3-8b",
        slo="ttft=300ms,tpot=50ms",
        objective=objective,
        weights={"ttft": 0.5, "tpot": 0.5},
        percentile=99,
        attainment=0.99,
        space=SPACE.to_dict(),
        load=LoadSpec(rate=1.0),
    )


def run_study(sampler: str, n: int = 30) -> tuple[optuna.Study, FakeEvaluator]:
    evaluator = FakeEvaluator()
    study = optuna.create_study(direction="minimize", sampler=make_sampler(sampler, 1, n_trials=n))
    study.optimize(TrialObjective(setup(), evaluator, SPACE), n_trials=n)  # type: ignore[arg-type]
    return study, evaluator


@pytest.mark.parametrize("sampler", ["tpe", "nsga2", "random"])
def test_constraints_mark_trials_that_miss_attainment_infeasible(sampler: str) -> None:
    study, _ = run_study(sampler)
    trials = finished(study)
    infeasible = [t for t in trials if t.user_attrs["config"]["max_num_seqs"] < 100]
    feasible = [t for t in trials if t.user_attrs["config"]["max_num_seqs"] >= 100]
    assert infeasible and feasible
    for t in infeasible:
        assert t.constraints["attainment"] == pytest.approx(0.49)
        assert t.user_attrs["feasible"] is False
    for t in feasible:
        assert t.constraints["attainment"] <= 0 and t.user_attrs["feasible"] is True
    best = select_best(trials, "weighted", 0.99)
    assert best.user_attrs["feasible"]
    assert best.value == min(t.value for t in feasible)
    assert best.value > min(t.value for t in infeasible)
    assert study.best_trial.number == best.number


def test_a_configuration_already_measured_is_not_run_again() -> None:
    study, evaluator = run_study("random", 40)
    trials = finished(study)
    distinct = {t.user_attrs["config"]["max_num_seqs"] for t in trials}
    assert evaluator.runs == len(distinct) < len(trials)
    reused = [t for t in trials if "reused_from" in t.user_attrs]
    for t in reused:
        source = study.trials[t.user_attrs["reused_from"]]
        assert t.value == source.value and t.constraints == source.constraints


class FakeGoodputEvaluator(FakeEvaluator):
    def goodput(self, config, start_rung, exact=False) -> GoodputResult:
        self.runs += 1
        rate = float(config.max_num_seqs)
        at = Measurement(rate, {"slo_attainment": 1.0}, 1.0, 1.0, True)
        return GoodputResult(rate, self.ladder.rung(rate), at, {rate: 1.0})


def test_goodput_trials_reuse_measured_configurations() -> None:
    space = build_space(
        max_model_len=1024,
        overrides={
            "max_num_batched_tokens": 2048,
            "long_prefill_token_threshold": "off",
            "block_size": 16,
            "preemption_mode": "recompute",
            "prefix_caching": "hash",
            "policy": "chunked",
            "max_num_seqs": {"low": 8, "high": 16},
        },
    )
    evaluator = FakeGoodputEvaluator()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(TrialObjective(setup("goodput"), evaluator, space), n_trials=25)  # type: ignore[arg-type]
    trials = finished(study)
    assert evaluator.runs == len({t.user_attrs["config"]["max_num_seqs"] for t in trials}) < 25
    for t in trials:
        assert t.value == t.user_attrs["goodput_value"] == t.user_attrs["config"]["max_num_seqs"]


def test_goodput_selection_breaks_ties_by_score() -> None:
    study = optuna.create_study(direction="maximize")
    for goodput, score in ((5.0, 0.9), (7.0, 0.8), (7.0, 0.6), (3.0, 0.1)):
        study.add_trial(
            optuna.trial.create_trial(
                value=goodput,
                user_attrs={
                    "config": {},
                    "goodput_value": goodput,
                    "goodput_rps": goodput,
                    "score": score,
                },
            )
        )
    best = select_best(finished(study), "goodput", 0.99)
    assert (best.user_attrs["goodput_rps"], best.user_attrs["score"]) == (7.0, 0.6)
    simpler = optuna.create_study(direction="maximize")
    for cache in ("radix", "hash"):
        simpler.add_trial(
            optuna.trial.create_trial(
                value=7.0,
                user_attrs={
                    "config": {"prefix_caching": cache},
                    "goodput_value": 7.0,
                    "score": 0.5,
                },
            )
        )
    chosen = select_best(finished(simpler), "goodput", 0.99, {"prefix_caching": "hash"})
    assert chosen.user_attrs["config"]["prefix_caching"] == "hash"
    front = pareto_front(finished(study))
    assert [(t.user_attrs["goodput_rps"], t.user_attrs["score"]) for t in front] == [
        (7.0, 0.6),
        (3.0, 0.1),
    ]


def test_setup_round_trips_through_json() -> None:
    import json

    s = setup("goodput")
    assert TuneSetup.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert s.differences(TuneSetup.from_dict(s.to_dict())) == []


def test_first_ctrl_c_is_noted_and_a_second_raises() -> None:
    import signal

    from slotune.tuner.study import _noting_interrupts

    before = signal.getsignal(signal.SIGINT)
    interrupted = [False]
    with _noting_interrupts(interrupted):
        signal.raise_signal(signal.SIGINT)  # noted only: the running trial goes on
        assert interrupted == [True]
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
