"""Objective math on hand-made summaries, and the rate search on a known threshold."""

from __future__ import annotations

import pytest

from slotune.tuner.objectives import (
    PENALTY_SCORE,
    RateLadder,
    RateSearch,
    attainment_violation,
    parse_weights,
    resolve_weights,
    weighted_score,
)


def summary(ttft_p99: float | None, tpot_p99: float | None, att: float = 1.0) -> dict:
    return {
        "ttft_ms": {"p50": 10.0, "p99": ttft_p99},
        "tpot_ms": {"p50": 5.0, "p99": tpot_p99},
        "slo_attainment": att,
    }


def test_weighted_score_is_the_weighted_ratio_to_the_targets() -> None:
    targets = {"ttft": 300.0, "tpot": 50.0}
    weights = {"ttft": 0.5, "tpot": 0.5}
    assert weighted_score(summary(300.0, 50.0), targets, weights, 99) == pytest.approx(1.0)
    assert weighted_score(summary(150.0, 100.0), targets, weights, 99) == pytest.approx(1.25)
    assert weighted_score(summary(150.0, 100.0), targets, {"ttft": 1.0}, 99) == pytest.approx(0.5)
    assert weighted_score(summary(150.0, 100.0), targets, weights, 50) == pytest.approx(
        0.5 * 10 / 300 + 0.5 * 5 / 50
    )


def test_a_metric_with_its_own_slo_percentile_is_scored_at_it() -> None:
    targets = {"ttft": 300.0, "tpot": 50.0}
    weights = {"ttft": 0.5, "tpot": 0.5}
    score = weighted_score(summary(150.0, 100.0), targets, weights, 99, {"ttft": 50})
    assert score == pytest.approx(0.5 * 10 / 300 + 0.5 * 100 / 50)


def test_an_undefined_percentile_scores_the_penalty() -> None:
    targets = {"ttft": 300.0, "tpot": 50.0}
    assert weighted_score(summary(None, 20.0), targets, {"ttft": 0.5, "tpot": 0.5}, 99) == (
        PENALTY_SCORE
    )


def test_attainment_constraint_is_feasible_at_or_above_target() -> None:
    assert attainment_violation(summary(1, 1, att=0.995), 0.99) < 0
    assert attainment_violation(summary(1, 1, att=0.99), 0.99) == 0
    assert attainment_violation(summary(1, 1, att=0.5), 0.99) == pytest.approx(0.49)
    assert attainment_violation({"slo_attainment": None}, 0.99) == pytest.approx(0.99)


def test_weights_parse_and_normalize() -> None:
    assert parse_weights("ttft=0.7, tpot=0.3") == {"ttft": 0.7, "tpot": 0.3}
    assert resolve_weights({"ttft": 3, "tpot": 1}, ["ttft", "tpot"]) == {"ttft": 0.75, "tpot": 0.25}
    assert resolve_weights(None, ["ttft", "tpot"]) == {"ttft": 0.5, "tpot": 0.5}
    assert resolve_weights(None, ["ttft"]) == {"ttft": 1.0}
    assert resolve_weights(None, ["ttft", "itl", "tpot"]) == pytest.approx(
        {"ttft": 1 / 3, "itl": 1 / 3, "tpot": 1 / 3}
    )
    assert resolve_weights(None, ["e2e", "itl"]) == {"e2e": 0.5, "itl": 0.5}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttft=fast", "not a number"),
        ("ttft", "METRIC=WEIGHT"),
        ("speed=1", "unknown metric"),
        ("ttft=-1", ">= 0"),
        ("", "no weight"),
    ],
)
def test_bad_weights_are_rejected(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_weights(text)


def test_weights_must_sum_positive_and_name_slo_metrics() -> None:
    with pytest.raises(ValueError, match="positive"):
        resolve_weights({"ttft": 0.0, "tpot": 0.0}, ["ttft", "tpot"])
    with pytest.raises(ValueError, match="e2e has no SLO target"):
        resolve_weights({"e2e": 1.0}, ["ttft", "tpot"])


def threshold_search(
    best_rung: int, start: int, exact: bool = False, max_gallop: int = 800
) -> tuple[int | None, int]:
    ladder = RateLadder(base=1.0, max_gallop=max_gallop)
    calls = []

    def feasible(k: int) -> bool:
        calls.append(k)
        return k <= best_rung

    search = RateSearch(feasible, ladder, exact=exact)
    found = search.run(start)
    assert len(calls) == len(set(calls)), "a rung was simulated twice"
    assert all(k <= max(best_rung, start) + max_gallop for k in calls), "ran far above"
    return found, len(calls)


@pytest.mark.parametrize("best", [0, 1, 7, 50, 333])
def test_search_from_below_finds_the_exact_rung(best: int) -> None:
    found, _ = threshold_search(best, start=0)
    assert found == best


def test_a_tie_with_the_incumbent_costs_two_runs() -> None:
    assert threshold_search(40, start=40) == (40, 2)


def test_a_config_missing_at_the_start_costs_one_run() -> None:
    assert threshold_search(10, start=100) == (None, 1)


def test_exact_search_finds_the_rung_both_ways() -> None:
    for best in (-90, -3, 0, 12, 200):
        found, _ = threshold_search(best, start=0, exact=True)
        assert found == best
    assert threshold_search(-1000, start=0, exact=True)[0] is None


def test_a_capped_gallop_never_runs_far_above_the_answer() -> None:
    for best in (-90, -3, 0, 12, 31, 200):
        found, runs = threshold_search(best, start=0, exact=True, max_gallop=8)
        assert found == best
        assert runs <= abs(best) // 8 + 5  # one run per 8 rungs, then a bisection of 8


def test_ladder_rates() -> None:
    ladder = RateLadder(base=2.0, ratio=1.02)
    assert ladder.rate(0) == 2.0
    assert ladder.rung(ladder.rate(37)) == 37
