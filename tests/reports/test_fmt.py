from __future__ import annotations

import numpy as np
import pytest

from slotune.reports import fmt


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4096, "4,096"),
        (np.int64(4096), "4,096"),
        (2.5, "2.50"),
        (None, "n/a"),
        (float("nan"), "n/a"),
        (True, "n/a"),
        ("x", "n/a"),
    ],
)
def test_num_formats_numbers_and_says_na_otherwise(value: object, expected: str) -> None:
    assert fmt.num(value) == expected


def test_percentages_and_latencies() -> None:
    assert fmt.pct(0.987) == "98.7%"
    assert fmt.signed_pct(0.25) == "+25.0%" and fmt.signed_pct(-0.1) == "-10.0%"
    assert fmt.ms(12.34) == "12.3 ms" and fmt.ms(None) == "n/a"
    assert fmt.text("") == "n/a" and fmt.text(0.1234567) == "0.123"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (25630.0, "25,630"),
        (25634.7, "25,635"),
        (57.3712, "57.37"),
        (0.0123456, "0.01235"),
        (1.0, "1"),
        (0.5, "0.5"),
        (-1234.7, "-1,235"),
        (1.2e12, "1,200,000,000,000"),
        (0.0, "0"),
        (None, "n/a"),
    ],
)
def test_sig_never_writes_an_exponent(value: object, expected: str) -> None:
    assert fmt.sig(value) == expected
    assert "e" not in fmt.sig(value)
