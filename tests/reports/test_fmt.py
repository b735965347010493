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
