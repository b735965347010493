"""Distributed tuning: two worker processes on one PostgreSQL-stored study.

Needs a PostgreSQL server; ``.ci/run`` starts one and sets ``SLOTUNE_TEST_POSTGRES_URL``.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.tuner.study import open_storage

URL = os.environ.get("SLOTUNE_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(
    not URL,
    reason="SLOTUNE_TEST_POSTGRES_URL is not set (no PostgreSQL server to test against; "
    ".ci/run starts one)",
)


def test_two_worker_processes_share_a_postgres_study(tmp_path: Path) -> None:
    assert URL is not None
    name = f"pg-{uuid.uuid4().hex[:10]}"
    args = [
        "tune",
        "--gpu",
        "h100",
        "--slo",
        "ttft=300ms,tpot=50ms",
        "--num-requests",
        "30",
        "--objective",
        "weighted",
        "--rate",
        "4",
        "--storage",
        URL,
        "--study-name",
        name,
        "--out",
        str(tmp_path / "out"),
    ]
    try:
        result = CliRunner().invoke(app, [*args, "--trials", "6", "--n-jobs", "2"])
        assert result.exit_code == 0, result.output
        study = optuna.load_study(study_name=name, storage=open_storage(URL))
        done = [t for t in study.trials if t.state.name == "COMPLETE"]
        assert len(done) == 6
        workers = [t.user_attrs["worker"] for t in done]
        assert sorted(set(workers)) == [0, 1], workers
        assert workers.count(0) == 3 and workers.count(1) == 3
        best = json.loads((tmp_path / "out" / "best.json").read_text())
        assert best["storage"] == URL and best["num_trials"] == 6
        assert not (tmp_path / "out" / "study.db").exists()
        resumed = CliRunner().invoke(app, [*args, "--trials", "8", "--n-jobs", "2", "--resume"])
        assert resumed.exit_code == 0, resumed.output
        study = optuna.load_study(study_name=name, storage=open_storage(URL))
        assert sum(t.state.name == "COMPLETE" for t in study.trials) == 8
    finally:
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=name, storage=open_storage(URL))
