from __future__ import annotations

import pytest

from slotune.workloads import SLO, parse_slo


def test_parses_metrics_units_and_percentiles() -> None:
    slo = parse_slo("ttft=300ms, tpot=0.05s,itl:p90=80ms,e2e:p99.5=10s")
    assert isinstance(slo, SLO)
    assert slo.threshold_s("ttft") == pytest.approx(0.3)
    assert slo.threshold_s("tpot") == pytest.approx(0.05)
    assert slo.get("itl").percentile == 90
    assert slo.get("e2e").percentile == 99.5
    assert slo.get("ttft").percentile is None
    assert slo.metrics == ("ttft", "tpot", "itl", "e2e")
    assert parse_slo(str(slo)) == slo


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("ttft=fast", "not a number with a unit"),
        ("ttft=300", "not a number with a unit"),
        ("latency=300ms", "unknown metric 'latency'"),
        ("ttft", "is not metric=value"),
        ("", "SLO is empty"),
        ("ttft=300ms,ttft=200ms", "given twice"),
        ("ttft:p0=300ms", "percentile must be in (0, 100]"),
        ("ttft:p101=300ms", "percentile must be in (0, 100]"),
        ("ttft=0ms", "must be positive"),
        ("ttft=300us", "not a number with a unit"),
    ],
)
def test_malformed_slo_says_what_and_what_is_expected(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_slo(text)
    message = str(err.value)
    assert fragment in message
    assert "expected e.g. ttft=300ms,tpot=50ms" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "tokens", "longest"),
    [
        ("ttft=300ms,tpot=50ms", 101, 0.3 + 100 * 0.05),
        ("ttft=300ms,tpot=50ms,itl=20ms", 11, 0.3 + 10 * 0.02),
        ("ttft=1s,tpot=50ms,e2e=2s", 101, 2.0),
        ("ttft=300ms", 1, 0.3),
        ("ttft=300ms", 100, None),  # the tokens after the first have no bound
        ("tpot=50ms", 100, None),
    ],
)
def test_longest_time_a_request_meeting_the_slo_takes(
    text: str, tokens: int, longest: float | None
) -> None:
    assert parse_slo(text).longest_meeting_s(tokens) == (
        None if longest is None else pytest.approx(longest)
    )
