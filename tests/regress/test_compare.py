"""Judging: medians, the noise band, directions, report-only metrics; tolerances
parse and print back."""

from __future__ import annotations

import pytest

from slotune.regress import BenchmarkResult, SuiteResult, Tolerance, compare, parse_tolerance
from slotune.regress.compare import Judgement


def result(samples: list[float | None], tolerance: str, gate: bool = True) -> BenchmarkResult:
    report_only = [] if gate else ["m"]
    return BenchmarkResult("b", "engine", False, report_only, {"m": tolerance}, {"m": samples})


def judged(base: list[float | None], cur: list[float | None], tol: str, **kw: bool) -> Judgement:
    baseline = SuiteResult("s", [result(base, tol)], "0", "d", "h")
    current = SuiteResult("s", [result(cur, tol, **kw)], "0", "d", "h")
    (j,) = compare(baseline, current).judgements
    return j


@pytest.mark.parametrize(
    ("base", "cur", "tol", "verdict"),
    [
        ([100.0], [110.0], "+10%", "ok"),  # exactly the allowance
        ([100.0], [110.1], "+10%", "regressed"),
        ([100.0], [80.0], "+10%", "improved"),
        ([100.0], [80.0], "±10%", "regressed"),  # either way counts
        ([100.0], [96.0], "-5%", "ok"),
        ([100.0], [94.0], "-5%", "regressed"),
        ([0.99], [0.985], "-0.01", "ok"),
        ([0.99], [0.97], "-0.01", "regressed"),
        ([3.0], [3.0], "0", "ok"),
        ([3.0], [3.000001], "0", "regressed"),  # deterministic: any change
        ([3.0], [2.999999], 0, "regressed"),
        ([1.0], [None], "+10%", "missing"),
        ([None], [1.0], "+10%", "no baseline"),
    ],
)
def test_single_runs_compare_exactly_within_tolerance(
    base: list[float | None], cur: list[float | None], tol: str, verdict: str
) -> None:
    j = judged(base, cur, tol)
    assert j.verdict == verdict
    assert j.noise == 0.0


def test_repeats_compare_medians_beyond_a_noise_band_from_their_ranges() -> None:
    # medians 110 -> 126: +14.5 % is over the +10 % allowed, but the baseline's repeats
    # span 20, so a change of 16 is noise; a change of 26 is not.
    noisy = judged([100.0, 110.0, 120.0], [125.0, 126.0, 127.0], "+10%")
    assert (noisy.baseline, noisy.current, noisy.noise) == (110.0, 126.0, 20.0)
    assert noisy.verdict == "noise" and not noisy.failed
    real = judged([100.0, 110.0, 120.0], [135.0, 136.0, 137.0], "+10%")
    assert real.verdict == "regressed" and real.failed
    assert real.reason == "m rose 23.6% (110 → 136) (allowed +10%)"
    # the current run's spread counts too
    assert judged([110.0, 110.0], [100.0, 136.0, 140.0], "+10%").verdict == "noise"


def test_a_report_only_metric_is_judged_but_never_fails() -> None:
    j = judged([1.0], [2.0], "+10%", gate=False)
    assert j.verdict == "regressed" and not j.failed
    baseline = SuiteResult("s", [result([1.0], "+10%")], "0", "d", "h")
    assert (
        compare(baseline, SuiteResult("s", [result([2.0], "+10%", False)], "0", "d", "h")).exit_code
        == 0
    )
    assert (
        compare(baseline, SuiteResult("s", [result([2.0], "+10%")], "0", "d", "h")).exit_code == 1
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("+10%", Tolerance("up", 0.1, True)),
        ("-5%", Tolerance("down", 0.05, True)),
        ("±2%", Tolerance("both", 0.02, True)),
        ("+-2.5%", Tolerance("both", 0.025, True)),
        ("-0.01", Tolerance("down", 0.01, False)),
        (-0.01, Tolerance("down", 0.01, False)),
        (0.5, Tolerance("up", 0.5, False)),  # YAML reads +0.5 as 0.5
        (0, Tolerance("both", 0.0, False)),
        ("0%", Tolerance("both", 0.0, True)),
    ],
)
def test_tolerances_parse_and_print_back(text: str | float, expected: Tolerance) -> None:
    tol = parse_tolerance(text)
    assert tol == expected
    assert parse_tolerance(str(tol)) == tol


@pytest.mark.parametrize(("text", "problem"), [("10%", "no direction"), ("+x", "not a tolerance")])
def test_bad_tolerances_say_what_would_be_right(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as info:
        parse_tolerance(text)
    assert "+10% (higher is worse)" in str(info.value) or "-5% (lower" in str(info.value)


def test_benchmarks_only_in_the_baseline_are_listed() -> None:
    from slotune.regress import markdown

    gone = BenchmarkResult("gone", "sim", True, [], {"m": "0"}, {"m": [1.0]})
    baseline = SuiteResult("s", [result([1.0], "0"), gone], "0", "d", "h")
    comparison = compare(baseline, SuiteResult("s", [result([1.0], "0")], "0", "d", "h"))
    assert comparison.not_run == ["gone"] and comparison.exit_code == 0
    assert "In the baseline but not run: gone" in markdown(comparison)
