"""Distributed tuning on a real PostgreSQL: workers that start together, die, disagree, and
lose their database, on one study.

``.ci/run`` starts PostgreSQL and sets ``SLOTUNE_TEST_POSTGRES_URL``. In CI (``CI=true``)
a missing database fails these tests instead of skipping them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.tuner.storage import open_storage, with_driver
from tests.tuner.studies import SLO, new_study

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from slotune.cli.app import main; main()"]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
pytestmark = pytest.mark.slow  # separate processes on a real database


def _needed(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} (CI=true: .ci/run must provide it)")
    pytest.skip(what)


@pytest.fixture
def url() -> str:
    found = os.environ.get("SLOTUNE_TEST_POSTGRES_URL")
    if not found:
        _needed("SLOTUNE_TEST_POSTGRES_URL is not set (no PostgreSQL server to test against)")
    assert found is not None
    return found


@pytest.fixture
def name(url: str) -> Iterator[str]:
    study = f"pg-{uuid.uuid4().hex[:10]}"
    yield study
    with contextlib.suppress(KeyError):
        optuna.delete_study(study_name=study, storage=open_storage(url))


@pytest.fixture
def fresh_url(url: str) -> Iterator[str]:
    """A new, empty database on the test server (no tables yet)."""
    import sqlalchemy

    db = f"slotune_t_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(with_driver(url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f'CREATE DATABASE "{db}"'))
    fresh = url.rsplit("/", 1)[0] + "/" + db
    yield fresh
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f'DROP DATABASE "{db}" WITH (FORCE)'))
    admin.dispose()


def start(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def worker(url: str, name: str) -> subprocess.Popen[str]:
    return start("worker", "--storage", url, "--study-name", name)


def finish(proc: subprocess.Popen[str], timeout: float = 90) -> str:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output
    assert "Traceback" not in output, output
    return output


def trials_of(url: str, name: str) -> list[Any]:
    return optuna.load_study(study_name=name, storage=open_storage(url)).trials


def completed(url: str, name: str) -> dict[int, Any]:
    return {t.number: t for t in trials_of(url, name) if t.state == TrialState.COMPLETE}


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_three_workers_started_together_on_a_fresh_database_share_one_study(
    fresh_url: str, tmp_path: Path
) -> None:
    args = ["tune", "--gpu", "h100", "--slo", SLO, "--num-requests", "20"]
    args += ["--objective", "weighted", "--rate", "4", "--trials", "9", "--heartbeat", "2"]
    args += ["--storage", fresh_url, "--study-name", "bar"]
    procs = [start(*args, "--out", str(tmp_path / f"w{i}")) for i in range(3)]
    outputs = [finish(p) for p in procs]
    assert sum("Joining study bar" in out for out in outputs) == 2, outputs
    trials = trials_of(fresh_url, "bar")
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 9 and len(trials) == 9
    assert len({t.number for t in trials}) == len(trials)
    assert [t.number for t in trials if t.user_attrs.get("baseline")] == [0]
    feasible = [t for t in done if t.user_attrs["feasible"]] or done
    best_value = min(t.value for t in feasible)
    for i in range(3):
        best = json.loads((tmp_path / f"w{i}" / "best.json").read_text())
        assert best["num_trials"] == 9
        assert best["objective_value"] == pytest.approx(best_value)


def test_a_killed_worker_s_trial_is_failed_and_retried_by_another(
    url: str, name: str, tmp_path: Path
) -> None:
    new_study(url, name, trials=8, heartbeat=1)
    victim, survivor = worker(url, name), worker(url, name)
    try:
        killed, before = _kill_mid_trial(victim, url, name)
        finish(survivor)
    finally:
        for proc in (victim, survivor):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    trials = {t.number: t for t in trials_of(url, name)}
    assert trials[killed].state == TrialState.FAIL
    retries = [t for t in trials.values() if t.system_attrs.get("failed_trial") == killed]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].params == trials[killed].params
    assert retries[0].user_attrs["pid"] == survivor.pid
    done = completed(url, name)
    assert len(done) == 8 and set(before) <= set(done)
    status = CliRunner().invoke(app, ["status", "--storage", url, "--study-name", name])
    assert status.exit_code == 0, status.output
    assert "8 of 8 trials" in status.output and "1 lost by their worker" in status.output
    report = ["report", str(tmp_path), "--storage", url, "--study-name", name]
    written = CliRunner().invoke(app, report)
    assert written.exit_code == 0, written.output
    assert json.loads((tmp_path / "best.json").read_text())["num_trials"] == 8


def _kill_mid_trial(proc: subprocess.Popen[str], url: str, name: str) -> tuple[int, set[int]]:
    """SIGKILL ``proc`` while it measures a trial: once it seems to, freeze it, check that
    it still does, kill it (else let it go on and look again). Returns that trial and the
    completed ones."""

    def measuring(trials: list[Any]) -> list[Any]:
        return [
            t
            for t in trials
            if t.state == TrialState.RUNNING
            and t.user_attrs.get("pid") == proc.pid
            and "config" in t.user_attrs
        ]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if not measuring(trials_of(url, name)):
            time.sleep(0.01)
            continue
        os.kill(proc.pid, signal.SIGSTOP)
        trials = trials_of(url, name)
        if measuring(trials):
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()
            done = {t.number for t in trials if t.state == TrialState.COMPLETE}
            return measuring(trials)[0].number, done
        os.kill(proc.pid, signal.SIGCONT)
    pytest.fail("the worker never ran a trial")


def test_a_worker_with_another_slo_or_trace_is_refused_naming_it(
    url: str, name: str, tmp_path: Path
) -> None:
    from slotune.workloads import load_trace

    trace = tmp_path / "trace.jsonl"
    load_trace("sharegpt-like", num_requests=20).to_jsonl(trace)
    new_study(url, name, trials=2, heartbeat=1, trace=str(trace))
    tune = ["tune", "--gpu", "h100", "--num-requests", "20", "--objective", "weighted"]
    tune += ["--rate", "4", "--storage", url, "--study-name", name, "--out", str(tmp_path / "o")]
    runner = CliRunner()
    other_slo = runner.invoke(app, [*tune, "--trace", str(trace), "--slo", "ttft=200ms,tpot=50ms"])
    assert other_slo.exit_code == 2, other_slo.output
    assert "slo (study: ttft=300ms,tpot=50ms; here: ttft=200ms,tpot=50ms)" in other_slo.output
    other_trace = runner.invoke(app, [*tune, "--trace", "agent", "--slo", SLO])
    assert other_trace.exit_code == 2, other_trace.output
    assert "other settings: trace (study:" in other_trace.output
    lines = trace.read_text().splitlines()
    last = json.loads(lines[-1])
    last["output_len"] += 1  # this machine's copy of the trace is another version
    trace.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    joined = runner.invoke(app, ["worker", "--storage", url, "--study-name", name])
    assert joined.exit_code == 2, joined.output
    assert "trace:" in joined.output and "is not the study's trace" in joined.output
    assert not completed(url, name)


def _cluster() -> list[str]:
    try:
        out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        _needed("pg_lsclusters is not available to stop and start the PostgreSQL cluster")
    return out.stdout.split()[:2]


def test_workers_ride_out_a_database_restart_without_losing_trials(url: str, name: str) -> None:
    cluster = _cluster()
    new_study(url, name, trials=14, heartbeat=2, num_requests=60)
    procs = [worker(url, name), worker(url, name)]
    try:
        wait_for(lambda: len(completed(url, name)) >= 2, 60, "two finished trials")
        before = completed(url, name)
        subprocess.run(["pg_ctlcluster", *cluster, "stop"], check=True)
        time.sleep(2)
        subprocess.run(["pg_ctlcluster", *cluster, "start"], check=True)
        outputs = [finish(p, timeout=120) for p in procs]
    finally:
        subprocess.run(["pg_ctlcluster", *cluster, "start"], check=False, capture_output=True)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert any("storage unreachable" in out for out in outputs), outputs
    done = completed(url, name)
    assert len(done) == 14
    for number, trial in before.items():
        assert done[number].values == trial.values
