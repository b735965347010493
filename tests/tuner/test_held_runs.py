"""A weighted tune runs nothing twice: the finish writes the best trial's and the
baseline's runs as measured (held by the evaluator), and the noise check of a load that
draws no arrival times reruns nothing; what it writes is what a fresh run writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import slotune
from slotune.engine.config import EngineConfig
from tests.tuner.studies import evaluator_for, record_runs

OPTIONS = {
    "gpu": "h100",
    "slo": "ttft=300ms,tpot=40ms",
    "num_requests": 30,
    "objective": "weighted",
    "concurrency": 6,
    "trials": 5,
}


def test_a_weighted_tune_runs_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_runs(monkeypatch)
    result = slotune.tune(out=str(tmp_path / "out"), **OPTIONS)
    monkeypatch.undo()
    assert len(seen) == len(set(seen)), "a configuration ran twice at one rate and seed"
    best = json.loads(result.best_json.read_text())
    assert best["noise"] is None or best["noise"]["same_runs"] is True
    # the written runs against fresh ones (nothing held): byte for byte
    fresh = evaluator_for(**OPTIONS)
    for label, config in (("best", best["config"]), ("baseline", best["baseline"]["config"])):
        again = tmp_path / "again" / label
        fresh.run(EngineConfig.from_dict(config)).save(again)
        for name in ("requests.csv", "steps.csv"):
            written = (result.out_dir / "runs" / label / name).read_bytes()
            assert written == (again / name).read_bytes(), (label, name)
