"""Workers without a database server: failing trials, outages, the journal file storage,
and the settings a joining worker must share."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc
from optuna.trial import TrialState
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.tuner import storage as storages
from slotune.tuner.setup import TuneSetup
from slotune.tuner.study import (
    StudyError,
    count_finished,
    load,
    run_settings,
    run_worker,
    set_budget,
)
from slotune.tuner.trial import TrialObjective
from tests.tuner.studies import SLO, new_study

runner = CliRunner()


def _states(url: str, name: str) -> list[TrialState]:
    return [t.state for t in load(url, name)[0].trials]


def test_a_trial_that_raises_is_recorded_failed_and_the_worker_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    new_study(url, "s", trials=4, heartbeat=1)
    measure = TrialObjective.measure
    calls = []

    def second_one_raises(self: TrialObjective, config: object, start_rung: int) -> dict:
        calls.append(config)
        if len(calls) == 2:
            raise RuntimeError("simulated crash")
        return measure(self, config, start_rung)

    monkeypatch.setattr(TrialObjective, "measure", second_one_raises)
    run_worker(url, "s", 4, 0)
    trials = load(url, "s")[0].trials
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 4
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 1 and failed[0].number == 1
    assert failed[0].user_attrs["error"] == "RuntimeError: simulated crash"


def test_a_worker_whose_every_trial_fails_stops_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    new_study(url, "s", trials=20, heartbeat=1)

    def broken(*_args: object) -> dict:
        raise KeyError("metrics")

    monkeypatch.setattr(TrialObjective, "measure", broken)
    with pytest.raises(StudyError, match="5 trials in a row failed, the last with KeyError"):
        run_worker(url, "s", 20, 0)
    assert _states(url, "s") == [TrialState.FAIL] * 5


def _outage() -> Exception:
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, ConnectionRefusedError("refused"))


def test_retrying_waits_out_an_outage_and_gives_up_after_its_patience(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(storages.time, "sleep", sleeps.append)
    said: list[str] = []
    attempts = iter([_outage(), _outage(), _outage(), 7])

    def call() -> int:
        result = next(attempts)
        if isinstance(result, Exception):
            raise result
        return result

    assert storages.retrying(call, "testing", say=said.append) == 7
    assert sleeps == [0.5, 1.0, 2.0]
    assert len(said) == 3 and said[0].startswith("storage unreachable while testing (refused)")

    def refused() -> None:
        raise _outage()

    with pytest.raises(storages.StorageUnreachable, match="unreachable for 0 s while testing"):
        storages.retrying(refused, "testing", patience=0, say=said.append)

    def bad_query() -> None:
        raise ValueError("not an outage")

    with pytest.raises(ValueError, match="not an outage"):
        storages.retrying(bad_query, "testing", say=said.append)
    assert len(said) == 3


def test_counting_finished_trials_waits_out_a_connection_lost_mid_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database restart while a worker counts the finished trials (as it joins): the
    query loses its connection, the session's next use says it needs a rollback, and
    Optuna wraps that in a generic storage error. The count waits and is taken again."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    new_study(url, "s", trials=1, heartbeat=1)
    study, _, _ = load(url, "s")
    monkeypatch.setattr(storages.time, "sleep", lambda s: None)
    real = study.get_trials
    failures = [1]

    def get_trials(**kwargs: object) -> list:
        if failures.pop() if failures else 0:
            try:
                raise _outage()
            except sqlalchemy.exc.OperationalError:
                try:
                    raise sqlalchemy.exc.PendingRollbackError("Can't reconnect until rolled back")
                except sqlalchemy.exc.PendingRollbackError as e:
                    raise optuna.exceptions.StorageInternalError("commit failed") from e
        return real(**kwargs)

    monkeypatch.setattr(study, "get_trials", get_trials)
    assert count_finished(study) == 0
    assert not failures  # it failed once and was retried


def test_a_joining_worker_reads_and_stores_the_budget_through_an_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other queries a worker makes as it joins (the study's attributes, the stored
    budget) wait out a database that went away, as counting the trials does."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    new_study(url, "s", trials=1, heartbeat=1)
    study, _, _ = load(url, "s")
    monkeypatch.setattr(storages.time, "sleep", lambda s: None)
    storage = study._storage
    outages = {"get_study_user_attrs": 1, "set_study_user_attr": 1}
    for method in outages:
        real = getattr(storage, method)

        def flaky(*args: object, _name: str = method, _real: object = real) -> object:
            if outages[_name]:
                outages[_name] -= 1
                raise _outage()
            return _real(*args)  # type: ignore[operator]

        monkeypatch.setattr(storage, method, flaky)
    assert run_settings(study)[0] == 1
    set_budget(study, 3)
    assert run_settings(study)[0] == 3
    assert outages == {"get_study_user_attrs": 0, "set_study_user_attr": 0}


def test_loading_a_study_waits_out_a_database_that_went_down_after_it_was_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker opens the storage, then the database goes away before its first query
    (``load_study``): it waits and loads the study once the database answers."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    new_study(url, "s", trials=1, heartbeat=1)
    monkeypatch.setattr(storages.time, "sleep", lambda _s: None)
    real = optuna.load_study
    outages = [_outage(), optuna.exceptions.StorageInternalError("commit")]
    outages[1].__cause__ = _outage()

    def flaky(**kwargs: object) -> optuna.Study:
        if outages:
            raise outages.pop(0)
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(optuna, "load_study", flaky)
    study, setup, _ = load(url, "s")
    assert not outages and study.study_name == "s" and setup.slo


def test_journal_file_storage_runs_joins_and_reports(tmp_path: Path) -> None:
    journal = f"journal:{tmp_path / 'shared' / 'study.log'}"
    out = tmp_path / "out"
    args = ["tune", "--gpu", "h100", "--slo", SLO, "--num-requests", "20"]
    args += ["--objective", "weighted", "--rate", "4", "--trials", "3"]
    args += ["--storage", journal, "--study-name", "j", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    best = json.loads((out / "best.json").read_text())
    assert best["storage"] == journal and best["num_trials"] == 3
    assert (out / "report.html").is_file() and not (out / "study.db").exists()
    study_args = ["--storage", journal, "--study-name", "j"]
    more = runner.invoke(app, ["worker", *study_args, "--trials", "5"])
    assert more.exit_code == 0, more.output
    assert _states(journal, "j") == [TrialState.COMPLETE] * 5
    status = runner.invoke(app, ["status", "--storage", journal, "--study-name", "j"])
    assert status.exit_code == 0, status.output
    assert "5 of 5 trials" in status.output  # the creator asked for 3, the last worker for 5
    rebuilt = runner.invoke(app, ["report", str(out)])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "could not be read as an Optuna study" not in (out / "report.html").read_text()
    fresh = tmp_path / "from-storage"
    written = runner.invoke(app, ["report", str(fresh), *study_args])
    assert written.exit_code == 0, written.output
    assert json.loads((fresh / "best.json").read_text())["num_trials"] == 5
    assert (fresh / "report.html").is_file() and (fresh / "runs" / "best").is_dir()
    alone = runner.invoke(app, ["report", str(fresh), "--storage", journal])
    assert alone.exit_code == 2 and "--storage and --study-name go together" in alone.output


def test_status_of_a_missing_study_is_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    new_study(url, "s", trials=1, heartbeat=1)
    missing = runner.invoke(app, ["status", "--storage", url, "--study-name", "nope"])
    assert missing.exit_code == 2 and "no study named 'nope'" in missing.output
    joined = runner.invoke(app, ["worker", "--storage", url, "--study-name", "nope"])
    assert joined.exit_code == 2 and "no study named 'nope'" in joined.output


def _setup(**changes: object) -> TuneSetup:
    from slotune.tuner.setup import LoadSpec

    base = TuneSetup(
        gpu="h100",
        model="llama-3-8b",
        slo=SLO,
        objective="weighted",
        weights={"ttft": 0.5, "tpot": 0.5},
        percentile=99.0,
        attainment=0.99,
        space={"block_size": [16, 32]},
        load=LoadSpec(rate=4.0),
        trace="/data/a/trace.jsonl",
        num_requests=20,
        trace_digest="ab" * 32,
    )
    return replace(base, **changes)


def test_setup_differences_name_each_field_and_ignore_where_the_trace_lives() -> None:
    study = _setup()
    assert study.explain_differences(_setup(trace="/mnt/b/trace.jsonl")) == ""
    assert study.explain_differences(_setup(gpu="a100", slo="ttft=200ms")) == (
        "gpu (study: h100; here: a100), slo (study: ttft=300ms,tpot=50ms; here: ttft=200ms)"
    )
    other_trace = study.explain_differences(_setup(trace_digest="cd" * 32, num_requests=21))
    assert other_trace.startswith("trace (study: /data/a/trace.jsonl (20 requests digest abab")
    assert "num_requests" not in other_trace
    assert "search space" in study.explain_differences(_setup(space={"block_size": [16]}))
    assert "objective" in study.explain_differences(_setup(objective="goodput"))
    assert TuneSetup.from_dict(study.to_dict()) == study


def test_journal_heartbeat_less_worker_does_not_wait_for_others(tmp_path: Path) -> None:
    """Without heartbeats (journal files) a running trial of a lost worker is never
    failed: a worker with nothing left to claim ends instead of waiting for it."""
    journal = f"journal:{tmp_path / 'study.log'}"
    joined = new_study(journal, "j", trials=2, heartbeat=1)
    joined.study.ask()  # a trial whose worker is gone
    run_worker(journal, "j", 2, 0)
    assert sorted(s.name for s in _states(journal, "j")) == ["COMPLETE", "RUNNING"]


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_status_counts_running_trials_per_host_and_estimates_the_time_left(
    tmp_path: Path,
) -> None:
    from datetime import timedelta

    from slotune.tuner.status import study_status

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = new_study(url, "s", trials=6, heartbeat=1).study
    run_worker(url, "s", 2, 0)
    for host, pid in (("gpu-a", 1), ("gpu-a", 2), ("gpu-b", 3)):
        trial = study.ask()
        trial.set_user_attr("host", host)
        trial.set_user_attr("pid", pid)
    failed = study.ask()
    failed.set_user_attr("error", "RuntimeError: out of memory")
    study.tell(failed, state=TrialState.FAIL)
    s = study_status(url, "s")
    assert (s.budget, s.done, s.failed, s.retried) == (6, 2, 1, 0)
    assert s.running == {"gpu-a": 2, "gpu-b": 1}
    assert s.errors == [f"trial {failed.number}: RuntimeError: out of memory"]
    durations = [t.duration for t in study.trials if t.state == TrialState.COMPLETE]
    mean = sum(durations, timedelta()).total_seconds() / 2
    assert s.mean_trial_s == pytest.approx(mean)
    assert s.eta_s == pytest.approx(4 * mean / 3)  # 4 trials left, 3 workers running
    assert s.best is not None and s.best.startswith("trial ")
