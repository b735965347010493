"""Reading stored results: token-time lists, runs with missing parts, the study, the CSV."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution

from slotune.reports import runs
from slotune.reports.best import slo_targets_ms, slo_text
from slotune.reports.columns import REQUEST_COLUMNS, STEP_COLUMNS
from slotune.reports.runs import (
    flat_json_token_times,
    load_run,
    parse_token_times,
    percentile,
    read_ahead,
)
from slotune.reports.trials import load_csv_trials, load_study_trials
from slotune.workloads.result import token_times_json


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("[0.1, 0.2, 0.35]", [0.1, 0.2, 0.35]),
        ("(0.1,0.2)", [0.1, 0.2]),
        ("0.1 0.2;0.3", [0.1, 0.2, 0.3]),
        ("[]", []),
        ("", []),
        (float("nan"), []),
        (None, []),
        ([1, 2], [1.0, 2.0]),
        (1.5, [1.5]),
    ],
)
def test_token_times_parse_from_any_serialization(cell: object, expected: list[float]) -> None:
    assert parse_token_times(cell) == pytest.approx(expected)


@given(
    st.lists(
        st.one_of(
            st.none(),
            st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=6),
            st.lists(st.integers(-1000, 10**6), max_size=4),
        ),
        max_size=8,
    ),
    st.booleans(),
)
def test_token_times_parsed_in_one_pass_as_cell_by_cell(
    cells: list[list[float] | None], runner_format: bool
) -> None:
    """The one-pass parse of a stored column reads what ``parse_token_times`` reads cell
    by cell, in the runner's format (%.6f) and in plain JSON."""
    texts = [
        float("nan") if c is None else token_times_json(c) if runner_format else json.dumps(c)
        for c in cells
    ]
    column = pd.Series(texts, dtype=object)
    parsed = flat_json_token_times(column)
    assert parsed is not None
    flat, counts = parsed
    expected = [parse_token_times(t) for t in texts]
    assert counts.tolist() == [len(x) for x in expected]
    assert flat.tolist() == [x for times in expected for x in times]


@pytest.mark.parametrize(
    "cell", ["(0.1,0.2)", "0.1 0.2", "[0.1, oops]", "[[0.1]]", "[0.1,,0.2]", 0.5]
)
def test_token_times_in_another_form_are_left_to_the_cell_by_cell_parse(cell: object) -> None:
    assert flat_json_token_times(pd.Series(["[0.1]", cell], dtype=object)) is None


def _write_requests(run_dir: Path, rows: list[dict[str, object]]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows).rename(columns=REQUEST_COLUMNS)
    frame.to_csv(run_dir / "requests.csv", index=False)


def test_run_latencies_follow_bench_serve_definitions(tmp_path: Path) -> None:
    _write_requests(
        tmp_path,
        [
            {
                "arrival": 1.0,
                "first_token": 1.2,
                "finish": 1.5,
                "output_tokens": 4,
                "token_times": json.dumps([1.2, 1.3, 1.4, 1.5]),
                "error": None,
            },
            {
                "arrival": 2.0,
                "first_token": 2.1,
                "finish": 2.1,
                "output_tokens": 1,
                "token_times": "[2.1]",
                "error": None,
            },
            {
                "arrival": 3.0,
                "first_token": 3.5,
                "finish": 9.0,
                "output_tokens": 3,
                "token_times": "[3.5, 4, 9]",
                "error": "timeout",
            },
        ],
    )
    run = load_run(tmp_path, "r")
    assert run.requests["ttft_ms"].tolist()[:2] == pytest.approx([200.0, 100.0])
    assert run.requests["tpot_ms"].iloc[0] == pytest.approx(100.0)
    assert np.isnan(run.requests["tpot_ms"].iloc[1])
    assert np.isnan(run.requests["ttft_ms"].iloc[2]), "failed requests have no latency"
    assert sorted(run.itl_ms.round(6)) == pytest.approx([100.0, 100.0, 100.0])
    assert percentile(run, "ttft_ms", "p50") == pytest.approx(150.0)


def _one_request(run_dir: Path, first_token: float) -> None:
    row = {"arrival": 1.0, "first_token": first_token, "finish": 2.0, "output_tokens": 2}
    _write_requests(run_dir, [{**row, "token_times": f"[{first_token}, 2.0]", "error": None}])


def test_a_run_read_ahead_is_taken_once_and_only_while_its_files_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _one_request(tmp_path / "a", 1.25)
    _one_request(tmp_path / "b", 1.25)
    fresh = load_run(tmp_path / "a", "r")
    read_ahead(tmp_path / "a")
    read_ahead(tmp_path / "b")
    _one_request(tmp_path / "b", 1.5)  # written again after it was read ahead
    real = runs._tables
    read: list[Path] = []
    monkeypatch.setattr(runs, "_tables", lambda d: read.append(d) or real(d))
    ahead = load_run(tmp_path / "a", "r")
    pd.testing.assert_frame_equal(ahead.requests, fresh.requests)
    assert ahead.itl_ms.tolist() == fresh.itl_ms.tolist() and ahead.summary == fresh.summary
    assert read == []  # taken from the read-ahead
    assert load_run(tmp_path / "b", "r").requests["ttft_ms"].tolist() == pytest.approx([500.0])
    assert read == [tmp_path / "b"]  # its files changed: read again
    load_run(tmp_path / "a", "r")
    assert read == [tmp_path / "b", tmp_path / "a"] and not runs._AHEAD  # taken once, freed


def test_run_prefers_stored_summary_percentiles(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "summary.json").write_text(json.dumps({"ttft_ms": {"p99": 123.0}}))
    run = load_run(tmp_path, "r")
    assert percentile(run, "ttft_ms", "p99") == 123.0
    assert percentile(run, "tpot_ms", "p99") is None


def test_missing_run_files_give_empty_tables(tmp_path: Path) -> None:
    run = load_run(tmp_path / "absent", "r")
    assert run.summary == {}
    assert run.requests.empty and run.steps.empty
    assert set(STEP_COLUMNS) <= set(run.steps.columns)


def test_steps_time_is_relative_and_kv_percent_becomes_share(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    pd.DataFrame(
        {STEP_COLUMNS["time"]: [10.0, 10.5], STEP_COLUMNS["kv_usage"]: [50.0, 90.0]}
    ).to_csv(tmp_path / "steps.csv", index=False)
    run = load_run(tmp_path, "r")
    assert run.steps["time"].tolist() == [0.0, 0.5]
    assert run.steps["kv_usage"].tolist() == pytest.approx([0.5, 0.9])


def test_slo_targets_from_text_and_parsed_forms() -> None:
    assert slo_targets_ms({"slo": "ttft=300ms,tpot=0.05s"}) == {"ttft": 300.0, "tpot": 50.0}
    parsed = {"slo": {"ttft": {"threshold_ms": 250.0, "percentile": None}}}
    assert slo_targets_ms(parsed) == {"ttft": 250.0}
    assert slo_text(parsed) == "ttft=250ms"
    assert slo_targets_ms({"slo": "nonsense"}) == {}
    assert slo_targets_ms({}) == {}


def test_study_trials_carry_feasibility_metrics_and_importances(tune_dir: Path) -> None:
    trials = load_study_trials(tune_dir / "study.db", "slotune-test", "goodput")
    frame = trials.frame
    assert len(frame) == 40
    assert set(frame["state"]) == {"COMPLETE", "FAIL", "PRUNED"}
    assert frame["feasible"].any() and not frame["feasible"].all()
    assert "ttft_ms_p99" in frame and "goodput" in frame
    assert trials.objective_names == ("goodput",)
    assert trials.directions == ("maximize",)
    assert "max_num_batched_tokens" in trials.param_names
    assert trials.importances and sum(trials.importances.values()) == pytest.approx(1.0)
    assert trials.importance_note is None


def _tiny_study(path: Path, values: list[float], params: list[dict[str, object]]) -> None:
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{path}", direction="maximize")
    dists = {"x": FloatDistribution(0, 10), "mode": CategoricalDistribution(["a", "b"])}
    study.add_trials(
        [
            optuna.trial.create_trial(value=v, params=p, distributions=dists)
            for v, p in zip(values, params, strict=True)
        ]
    )


def test_importances_with_one_trial_explain_why_missing(tmp_path: Path) -> None:
    _tiny_study(tmp_path / "s.db", [1.0], [{"x": 1.0, "mode": "a"}])
    trials = load_study_trials(tmp_path / "s.db", "s", "goodput")
    assert trials.importances == {}
    assert "at least 2 completed trials" in (trials.importance_note or "")


def test_importances_with_single_valued_params_do_not_crash(tmp_path: Path) -> None:
    params = [{"x": 2.0, "mode": "a"}] * 5
    _tiny_study(tmp_path / "s.db", [1.0, 2.0, 3.0, 4.0, 5.0], params)
    trials = load_study_trials(tmp_path / "s.db", "s", None)
    assert trials.objective_names == ("objective",)
    assert trials.importances == {} or set(trials.importances) <= {"x", "mode"}


def test_csv_fallback_reads_optuna_trials_dataframe(tune_dir: Path) -> None:
    trials = load_csv_trials(tune_dir / "trials.csv", "goodput", ("maximize",))
    assert len(trials.frame) == 40
    assert "value_0" in trials.frame and "ttft_ms_p99" in trials.frame
    assert trials.frame["feasible"].dtype == bool
    assert trials.importances == {} and "no study.db" in (trials.importance_note or "")


def test_the_tunes_read_ahead_never_fails_it_and_is_dropped_with_a_failed_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slotune.reports import TuneReport

    _one_request(tmp_path / "runs" / "best", 1.25)
    report = TuneReport()
    real = runs._tables

    def broken(run_dir: Path) -> object:
        raise MemoryError(run_dir)

    monkeypatch.setattr(runs, "_tables", broken)
    report.read_ahead(tmp_path)  # says nothing: the report reads for itself
    assert not runs._AHEAD
    monkeypatch.setattr(runs, "_tables", real)
    report.read_ahead(tmp_path)
    assert len(runs._AHEAD) == 2
    with pytest.raises(FileNotFoundError, match=r"best\.json"):
        report(tmp_path)  # not a tune folder: the build fails before reading the runs
    assert not runs._AHEAD
