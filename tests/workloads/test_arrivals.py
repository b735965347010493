from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slotune.workloads import ArrivalSpec, Stage, arrival_times


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_mean_and_coefficient_of_variation(burstiness: float) -> None:
    rate = 5.0
    times = arrival_times(ArrivalSpec(rate=rate, burstiness=burstiness), 40_001, seed=7)
    gaps = np.diff(times)
    assert times[0] == 0.0
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    # vLLM's gamma: shape = burstiness, scale = 1 / (rate * burstiness) -> CV = 1/sqrt(burstiness)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.04)


def test_poisson_is_reproducible_per_seed() -> None:
    spec = ArrivalSpec(rate=2.0)
    assert arrival_times(spec, 50, seed=1) == arrival_times(spec, 50, seed=1)
    assert arrival_times(spec, 50, seed=1) != arrival_times(spec, 50, seed=2)


def test_constant_all_at_once_and_timestamps() -> None:
    assert arrival_times(ArrivalSpec(rate=4.0, constant=True), 4) == [0.0, 0.25, 0.5, 0.75]
    assert arrival_times(ArrivalSpec(), 3) == [0.0, 0.0, 0.0]
    assert arrival_times(ArrivalSpec(concurrency=2), 3) == [0.0, 0.0, 0.0]
    spec = ArrivalSpec(timestamps=True, time_scale=2.0)
    assert arrival_times(spec, 3, trace_times=[5.0, 6.0, 8.5]) == [0.0, 2.0, 7.0]
    with pytest.raises(ValueError, match="no timestamps"):
        arrival_times(spec, 2, trace_times=[None, 1.0])


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"rate": 0}, "rate: must be > 0"),
        ({"rate": 1, "burstiness": 0}, "burstiness: must be > 0"),
        ({"burstiness": 2}, "burstiness: needs a rate"),
        ({"concurrency": 0}, "concurrency: must be an integer >= 1"),
        ({"constant": True}, "constant: needs a rate"),
        ({"timestamps": True, "rate": 3}, "either timestamps=True or a rate"),
        ({"timestamps": True, "time_scale": -1}, "time_scale: must be in [1e-06, 1e+06]"),
        ({"timestamps": True, "time_scale": 1e300}, "time_scale: must be in [1e-06, 1e+06]"),
        ({"timestamps": True, "time_scale": float("nan")}, "time_scale: must be in"),
        ({"rate": float("inf")}, "rate: must be > 0 requests/s and finite"),
        ({"rate": 1, "burstiness": float("inf")}, "burstiness: must be > 0 and finite"),
    ],
)
def test_invalid_specs(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        ArrivalSpec(**kwargs)


def test_describe() -> None:
    assert ArrivalSpec(rate=3, burstiness=0.5).describe() == "gamma(burstiness=0.5) at 3 req/s"
    assert ArrivalSpec(concurrency=8).describe() == "closed loop, concurrency 8"
    assert ArrivalSpec().describe() == "all at once"


@settings(max_examples=60, deadline=None)
@given(
    rate=st.one_of(st.none(), st.floats(0.5, 50)),
    burstiness=st.floats(0.2, 4),
    constant=st.booleans(),
    timestamps=st.booleans(),
    staged=st.booleans(),
    concurrency=st.one_of(st.none(), st.integers(1, 8)),
    seed=st.integers(1, 1000),
)
def test_drawn_says_whether_the_seed_changes_the_times(
    rate: float | None,
    burstiness: float,
    constant: bool,
    timestamps: bool,
    staged: bool,
    concurrency: int | None,
    seed: int,
) -> None:
    """``ArrivalSpec.drawn`` against the times themselves at two seeds (the tuner's noise
    check reruns nothing where it is False)."""
    stages = (Stage(rate, 4.0),) if staged and rate is not None and not timestamps else ()
    try:
        spec = ArrivalSpec(
            rate=None if stages else rate,
            burstiness=burstiness,
            constant=constant,
            timestamps=timestamps,
            stages=stages,
            concurrency=concurrency,
        )
    except ValueError:
        assume(False)  # a combination the spec refuses
    n = spec.num_sessions or 12
    trace_times = [float(i) * 0.3 for i in range(n)]
    first = arrival_times(spec, n, trace_times=trace_times, seed=0)
    other = arrival_times(spec, n, trace_times=trace_times, seed=seed)
    assert (first != other) == spec.drawn
