"""``slotune.tune(...)``: the tune workflow as a Python call, without the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

import slotune
from slotune.engine.config import EngineConfig
from slotune.tuner import workflow

SMALL = {"gpu": "h100", "slo": "ttft=300ms,tpot=50ms", "num_requests": 30, "rate": 4.0}


def test_tune_returns_the_recommendation_and_reports_progress(tmp_path: Path) -> None:
    events: list[slotune.TuneEvent] = []
    result = slotune.tune(
        **SMALL, objective="weighted", trials=3, out=str(tmp_path / "out"), on_event=events.append
    )
    assert isinstance(result, slotune.TuneResult)
    best = json.loads(result.best_json.read_text())
    assert result.best == best
    assert result.config == EngineConfig.from_dict(best["config"])
    assert result.study_name == best["study_name"] and result.created
    assert result.finished_trials == result.budget == 3
    assert result.setup.objective == "weighted" and result.setup.num_requests == 30
    assert result.trials_csv.is_file() and (result.best_run / "summary.json").is_file()
    assert result.database is not None and result.database.is_file()
    assert result.report is not None and result.report.is_file()
    stored = optuna.load_study(study_name=result.study_name, storage=result.storage)
    assert len(stored.trials) == 3 and stored.trials[0].user_attrs.get("baseline") is True

    kinds = [type(e).__name__ for e in events]
    stages = [(type(e).__name__, e.stage) for e in events if hasattr(e, "stage")]
    assert stages == [
        ("StageStarted", workflow.Stage.BASELINE),
        ("StageDone", workflow.Stage.BASELINE),
        ("StageStarted", workflow.Stage.TRIALS),
        ("StageDone", workflow.Stage.TRIALS),
        ("StageStarted", workflow.Stage.FINISH),
        ("StageDone", workflow.Stage.FINISH),
    ]
    assert kinds.index("StudyReady") < kinds.index("TrialsProgress")
    progress = [e for e in events if isinstance(e, workflow.TrialsProgress)]
    assert progress[-1].finished == 3 and progress[-1].budget == 3
    assert progress[-1].best is not None and progress[-1].best.number in range(3)


def test_a_second_call_joins_the_study_and_runs_only_the_missing_trials(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    first = slotune.tune(**SMALL, objective="weighted", trials=2, out=out, study_name="s")
    again = slotune.tune(
        slotune.TuneOptions(
            **SMALL, objective="weighted", trials=3, out=out, study_name="s", resume=True
        )
    )
    assert first.created and not again.created
    assert again.finished_trials == 3 and again.baseline == first.baseline


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"tp": 0}, "tp", "tp must be at least 1"),
        ({"gpu": "h900"}, "gpu", "gpu: unknown GPU 'h900'"),
        ({"slo": "ttft=fast"}, "slo", "slo: "),
        ({"duration": 10.0, "warmup": 8.0, "cooldown": 2.0}, "warmup", "shorter than duration"),
        ({"weights": "ttft=0,tpot=0"}, "weights", "weights: "),
    ],
)
def test_bad_input_raises_naming_the_field(
    fields: dict[str, object], field: str, words: str, tmp_path: Path
) -> None:
    options = {**SMALL, "out": str(tmp_path / "out"), **fields}
    with pytest.raises(slotune.TuneInputError) as caught:
        slotune.tune(**options)
    assert caught.value.field == field
    assert words in str(caught.value) and "--" not in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="gpus"):
        slotune.tune(gpus="h100", slo="ttft=300ms")
