"""Figure builders on small stored results."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from slotune.reports import behaviour, search
from slotune.reports.build import load_trials
from slotune.reports.runs import RunData, load_run
from slotune.reports.trials import TrialsData


@pytest.fixture(scope="module")
def runs(tune_dir: Path) -> list[RunData]:
    return [
        load_run(tune_dir / "runs" / "best", "recommended", {"max_num_batched_tokens": 2048}),
        load_run(tune_dir / "runs" / "baseline", "baseline", {"max_num_batched_tokens": 2048}),
    ]


@pytest.fixture(scope="module")
def trials(tune_dir: Path, best: dict) -> TrialsData:
    return load_trials(tune_dir, best)


def _empty_run() -> RunData:
    return load_run(Path("/nonexistent-run"), "empty")


def test_cdf_points_are_monotone_and_capped() -> None:
    values = np.random.default_rng(0).exponential(100, 10_000)
    x, y = behaviour.cdf_points(values, max_points=200)
    assert len(x) == 200
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)
    assert y[-1] == pytest.approx(1.0)
    x, y = behaviour.cdf_points(np.array([3.0, np.nan, 1.0]))
    assert x.tolist() == [1.0, 3.0] and y.tolist() == [0.5, 1.0]


def test_bin_steps_caps_points_and_keeps_means() -> None:
    steps = pd.DataFrame({"time": np.arange(10_000) * 0.01, "x": np.ones(10_000)})
    binned = behaviour.bin_steps(steps, ["x"], max_bins=100)
    assert len(binned) == 100
    assert binned["x"].tolist() == pytest.approx([1.0] * 100)
    assert behaviour.bin_steps(steps.head(5), ["x"]).shape == (5, 2)


def test_latency_cdfs_have_one_line_per_run_and_the_slo(runs: list[RunData]) -> None:
    fig = behaviour.latency_cdf_figure(runs, "ttft_ms", 300.0)
    assert fig is not None
    assert [t.name for t in fig.data] == ["recommended", "baseline"]
    assert any(s.x0 == 300.0 for s in fig.layout.shapes)
    assert max(len(t.x) for t in fig.data) <= behaviour.MAX_CDF_POINTS
    no_slo = behaviour.latency_cdf_figure(runs, "tpot_ms", None)
    assert no_slo is not None and not no_slo.layout.shapes


def test_itl_histogram_shares_sum_to_one(runs: list[RunData]) -> None:
    fig = behaviour.itl_figure(runs)
    assert fig is not None and len(fig.data) == 2
    for trace in fig.data:
        assert np.sum(trace.y) == pytest.approx(1.0)


def test_batch_composition_stacks_prefill_and_decode_under_the_budget(
    runs: list[RunData],
) -> None:
    fig = behaviour.batch_figure(runs)
    assert fig is not None
    names = [t.name for t in fig.data]
    assert names.count("prefill tokens") == 2 and names.count("decode tokens") == 2
    assert names.count("token budget") == 2
    budget = next(t for t in fig.data if t.name == "token budget")
    assert list(budget.y) == [2048, 2048]
    stacked = [t for t in fig.data if t.stackgroup]
    assert {t.stackgroup for t in stacked} == {"run0", "run1"}
    assert all(len(t.x) <= behaviour.MAX_TIME_BINS for t in stacked)


def test_kv_queue_and_preemption_figures(runs: list[RunData]) -> None:
    kv = behaviour.kv_figure(runs)
    assert kv is not None and len(kv.data) == 2
    assert any(s.y0 == 0.85 for s in kv.layout.shapes)
    queues = behaviour.queue_figure(runs)
    assert queues is not None
    assert [t.name for t in queues.data] == ["running", "waiting", "running", "waiting"]
    pc = behaviour.preemption_cache_figure(runs)
    assert pc is not None
    cumulative = [t for t in pc.data if t.type == "scatter"]
    assert all(np.all(np.diff(t.y) >= 0) for t in cumulative)
    bar = next(t for t in pc.data if t.type == "bar")
    expected = runs[0].summary["prefix_cache_hit_rate"]
    assert bar.y[0] == pytest.approx(expected)


def test_behaviour_builders_return_none_without_data() -> None:
    empty = [_empty_run()]
    assert behaviour.latency_cdf_figure(empty, "ttft_ms", 300.0) is None
    assert behaviour.itl_figure(empty) is None
    assert behaviour.batch_figure(empty) is None
    assert behaviour.kv_figure(empty) is None
    assert behaviour.queue_figure(empty) is None
    assert behaviour.preemption_cache_figure(empty) is None


def test_history_best_so_far_tracks_feasible_trials_only(trials: TrialsData) -> None:
    fig = search.history_figure(trials)
    assert fig is not None
    line = next(t for t in fig.data if t.name == "best feasible so far")
    y = np.array([v for v in line.y if v is not None], dtype=float)
    y = y[np.isfinite(y)]
    assert np.all(np.diff(y) >= 0)
    done = trials.completed
    assert y[-1] == pytest.approx(done.loc[done["feasible"], "value_0"].max())
    names = {t.name for t in fig.data}
    assert {"feasible", "infeasible"} <= names


def test_recommended_trial_is_starred_in_history(trials: TrialsData) -> None:
    chosen = int(trials.completed["number"].iloc[0])
    fig = search.history_figure(replace(trials, recommended=chosen))
    assert fig is not None
    star = next(t for t in fig.data if t.name == f"recommended (trial {chosen})")
    assert list(star.x) == [chosen] and star.marker.symbol == "star"
    unmarked = search.history_figure(trials)
    assert unmarked is not None
    assert not any(t.name and t.name.startswith("recommended") for t in unmarked.data)


def test_importances_slices_and_contour_use_the_top_two(trials: TrialsData) -> None:
    top = search.top_params(trials)
    assert len(top) == 2
    assert top[0] == max(trials.importances, key=trials.importances.get)
    imp = search.importance_figure(trials)
    assert imp is not None and set(imp.data[0].y) == set(trials.importances)
    slices = search.slice_figure(trials, top)
    assert slices is not None
    assert {slices.layout.xaxis.title.text, slices.layout.xaxis2.title.text} == set(top)
    contour = search.contour_figure(trials, top)
    assert contour is not None and contour.data[0].type == "contour"
    z = np.asarray(contour.data[0].z)
    values = trials.completed["value_0"]
    assert values.min() - 1e-9 <= z.min() and z.max() <= values.max() + 1e-9


def test_contour_handles_categorical_parameters(trials: TrialsData) -> None:
    fig = search.contour_figure(trials, ["prefix_caching", "preemption_mode"])
    assert fig is not None
    assert list(fig.layout.xaxis.ticktext) == ["hash", "none", "radix"]


def test_conditional_parameters_leave_out_trials_that_never_sampled_them(
    trials: TrialsData,
) -> None:
    frame = trials.frame.copy()
    column = "params_max_num_seqs"
    frame.loc[frame.index[::2], column] = np.nan
    sparse = replace(trials, frame=frame)
    fig = search.slice_figure(sparse, ["max_num_seqs"])
    assert fig is not None
    shown = sum(len(t.x) for t in fig.data)
    assert shown == sparse.completed[column].notna().sum()
    assert all(x is not None for t in fig.data for x in t.x)
    contour = search.contour_figure(sparse, ["max_num_seqs", "max_num_batched_tokens"])
    assert contour is not None
    assert sum(len(t.x) for t in contour.data[1:]) == shown


def test_pareto_front_mask_respects_directions() -> None:
    points = np.array([[1.0, 10.0], [2.0, 20.0], [2.0, 5.0], [0.5, 30.0]])
    assert search.pareto_front(points, ("maximize", "minimize")).tolist() == [
        False,
        False,
        True,
        False,
    ]
    assert search.pareto_front(points, ("maximize", "maximize")).tolist() == [
        False,
        True,
        False,
        True,
    ]


def test_pareto_figure_only_for_multi_objective(trials: TrialsData, pareto_dir: Path) -> None:
    assert search.pareto_figure(trials) is None
    import json

    best = json.loads((pareto_dir / "best.json").read_text())
    multi = load_trials(pareto_dir, best)
    assert multi.objective_names == ("goodput", "ttft_p99_ms")
    fig = search.pareto_figure(multi)
    assert fig is not None
    front = next(t for t in fig.data if t.name == "Pareto front (feasible)")
    feasible = multi.completed[multi.completed["feasible"]]
    assert max(front.x) == pytest.approx(feasible["value_0"].max())
    history = search.history_figure(multi)
    assert history is not None and history.layout.yaxis2.title.text.startswith("ttft_p99_ms")


def test_search_builders_return_none_without_completed_trials() -> None:
    frame = pd.DataFrame({"number": [0], "state": ["FAIL"], "feasible": [True], "value_0": [None]})
    trials = TrialsData(frame, ("goodput",), ("maximize",), ())
    assert search.history_figure(trials) is None
    assert search.importance_figure(trials) is None
    assert search.slice_figure(trials, ["x"]) is None
    assert search.contour_figure(trials, ["x", "y"]) is None
    assert search.pareto_figure(trials) is None


def test_log_axes_label_every_tick_in_full(trials: TrialsData) -> None:
    assert search.log_ticks(11, 1024) == [10, 20, 50, 100, 200, 500, 1000]
    assert search.log_ticks(806, 17435) == [1000, 2000, 5000, 10000, 20000]
    assert search.log_ticks(1, 1e6) == [1, 10, 100, 1000, 10000, 100000, 1000000]
    params = [p for p in trials.param_names if f"params_{p}" in trials.completed]
    for param in params:
        axis = search._axis_kind(trials, param)
        if axis.get("type") == "log":
            labels = axis["ticktext"]
            assert len(labels) >= 2 and all(len(label.replace(",", "")) > 0 for label in labels)
            values = [float(label.replace(",", "")) for label in labels]
            assert values == sorted(values) and values == axis["tickvals"]


def test_objective_axes_carry_their_unit(trials: TrialsData) -> None:
    assert search.objective_label("goodput", "maximize") == "goodput (req/s, maximize)"
    assert search.objective_label("weighted_score") == "weighted_score"
    history = search.history_figure(trials)
    assert history is not None
    titles = " | ".join(str(axis.title.text) for axis in history.select_yaxes())
    assert trials.objective_names == ("goodput",)
    assert titles == "goodput (req/s, maximize)"


def test_quiet_preemption_and_prefix_cache_is_a_line_of_text(runs: list[RunData]) -> None:
    assert behaviour.preemption_cache_note(runs) is None  # the synthetic runs preempt
    quiet = [
        replace(
            r,
            steps=r.steps.assign(preempted=0),
            summary={**r.summary, "prefix_cache_hit_rate": 0.0},
        )
        for r in runs
    ]
    text = behaviour.preemption_cache_note(quiet)
    assert text is not None and text.endswith("in either run.")
    hit = [quiet[0], replace(quiet[1], summary={**quiet[1].summary, "prefix_cache_hit_rate": 0.2})]
    assert behaviour.preemption_cache_note(hit) is None
