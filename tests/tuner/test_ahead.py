"""A new study's first trials measured ahead: the shadow draws what the study draws, the
study then runs none of them itself, and its trials are those it has without this."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from slotune.api import tune
from slotune.engine.config import EngineConfig
from slotune.tuner import ahead
from slotune.tuner.evaluate import Evaluator, config_key
from slotune.tuner.forked import forks
from slotune.tuner.study import load, startup_trials
from tests.tuner.studies import record_runs

OPTIONS: dict[str, Any] = {
    "gpu": "h100",
    "slo": "ttft=300ms,tpot=50ms",
    "objective": "weighted",
    "num_requests": 24,
    "rate": 6.0,
    "report": False,
}


def _tune(out: Path, **options: Any) -> Any:
    return tune(**{**OPTIONS, **options}, out=str(out))


def _trial_configs(result: Any) -> list[str]:
    study, _, _ = load(result.storage, result.study_name)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    return [config_key(EngineConfig.from_dict(t.user_attrs["config"])) for t in trials]


@pytest.mark.parametrize(("sampler", "trials"), [("tpe", 16), ("random", 6)])
def test_the_shadow_draws_the_study_s_first_trials(
    tmp_path: Path, sampler: str, trials: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ahead, "can_measure_ahead", lambda *_: False)  # the study alone
    result = _tune(tmp_path / "study", sampler=sampler, trials=trials, seed=7)
    baseline = EngineConfig.from_dict(result.baseline["config"])
    drawn = ahead.first_configs(result.setup, baseline, trials)
    expected = trials if sampler == "random" else startup_trials(trials)
    assert len(drawn) == expected
    assert [config_key(c) for c in drawn] == _trial_configs(result)[:expected]
    assert config_key(drawn[0]) == config_key(baseline)  # the queued defaults come first
    other_seed = ahead.first_configs(replace(result.setup, seed=8), baseline, trials)
    assert [config_key(c) for c in other_seed] != [config_key(c) for c in drawn]


def test_measured_ahead_the_study_runs_none_of_its_first_trials_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trials = 16
    with monkeypatch.context() as m:
        m.setattr(ahead, "can_measure_ahead", lambda *_: False)
        alone = _tune(tmp_path / "alone", trials=trials)
    runs = record_runs(monkeypatch)  # a forked child's runs stay in its own copy
    measured = _tune(tmp_path / "ahead", trials=trials)
    first = _trial_configs(measured)[: startup_trials(trials)]
    # at the study's seed (the finish measures the best and the defaults at two more)
    run_here = [key for key, _, seed in runs if seed == measured.setup.seed]
    if forks():
        assert not set(first) & set(run_here)
    else:  # measured ahead in this process, each once
        assert run_here[: len(set(first))] == list(dict.fromkeys(first))
    assert set(_trial_configs(measured)[startup_trials(trials) :]) & set(run_here)
    before = pd.read_csv(alone.out_dir / "trials.csv").drop(columns="duration_s")
    after = pd.read_csv(measured.out_dir / "trials.csv").drop(columns="duration_s")
    pd.testing.assert_frame_equal(before, after)
    for name in ("requests.csv", "steps.csv"):
        for run in ("best", "baseline"):
            path = Path("runs") / run / name
            assert (alone.out_dir / path).read_bytes() == (measured.out_dir / path).read_bytes()


@pytest.mark.skipif(not forks(), reason="no spare core to guess on")
def test_the_next_trial_guessed_ahead_is_taken_and_the_study_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {"num_requests": 120, "rate": None, "concurrency": 12, "trials": 24}
    taken: list[str] = []
    take = Evaluator.take

    def recorded(self: Evaluator, config: EngineConfig, *measured: Any) -> None:
        taken.append(config_key(config))
        take(self, config, *measured)

    with monkeypatch.context() as m:
        m.setattr(Evaluator, "take", recorded)
        guessed = _tune(tmp_path / "guessed", **options)
    with monkeypatch.context() as m:
        m.setattr(ahead.NextTrialAhead, "applies", staticmethod(lambda *_: False))
        alone = _tune(tmp_path / "alone", **options)
    start = startup_trials(24)
    later = _trial_configs(guessed)[start:]
    hits = [key for key in taken[start:] if key in later]
    # a guess is right unless the trial measured meanwhile ranks among TPE's best tenth
    assert len(hits) >= len(later) // 4
    before = pd.read_csv(alone.out_dir / "trials.csv").drop(columns="duration_s")
    after = pd.read_csv(guessed.out_dir / "trials.csv").drop(columns="duration_s")
    pd.testing.assert_frame_equal(before, after)


def test_the_last_trial_s_spare_core_starts_a_what_if_rerun_the_finish_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last trial's child reruns the best trial's first what-if instead of guessing a
    trial no one asks for; the finish takes its scores, which are those it computes
    itself without it."""
    from slotune.tuner import what_if

    # 25: the study measures the last trial itself (the guessing child measured the one
    # before), as the hour tune's 50 do
    options = {"num_requests": 120, "rate": None, "concurrency": 12, "trials": 25}
    started: list[Any] = []
    take_ahead = what_if._take_ahead

    def recorded(evaluator: Evaluator, variants: list[EngineConfig], rate: Any) -> Any:
        found = take_ahead(evaluator, variants, rate)
        started.append(found)
        return found

    with monkeypatch.context() as m:
        m.setattr(what_if, "_take_ahead", recorded)
        ahead_run = _tune(tmp_path / "ahead", **options)
    with monkeypatch.context() as m:
        m.setattr(ahead.NextTrialAhead, "_last", lambda *_: False)
        plain = _tune(tmp_path / "plain", **options)
    assert len(started) == 1 and started[0] is not None and started[0][0] == 0
    assert ahead_run.best["what_if"] == plain.best["what_if"]
    assert ahead_run.best["what_if"]["policies"]  # there was something to rerun
