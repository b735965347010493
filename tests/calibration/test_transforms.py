import math

import pytest

from slotune.calibration.transforms import Param, from_unit, to_unit


def test_linear_param_maps_its_bounds_to_the_unit_interval() -> None:
    p = Param("x", 2.0, 10.0)
    assert p.to_unit(2.0) == 0.0 and p.to_unit(10.0) == 1.0 and p.to_unit(6.0) == 0.5
    assert p.from_unit(0.25) == 4.0


def test_log_param_moves_by_ratios() -> None:
    p = Param("overhead_us", 1e-3, 1e3, log=True)
    assert p.to_unit(1.0) == pytest.approx(0.5)  # geometric middle
    assert p.from_unit(0.5) == pytest.approx(1.0)
    assert math.isclose(p.from_unit(p.to_unit(37.5)), 37.5, rel_tol=1e-12)


def test_values_outside_the_bounds_are_clipped() -> None:
    p = Param("eff", 0.1, 1.0)
    assert p.to_unit(5.0) == 1.0 and p.to_unit(-1.0) == 0.0
    assert p.from_unit(1.5) == 1.0


def test_named_round_trip() -> None:
    params = (Param("a", 0.0, 4.0), Param("b", 1.0, 100.0, log=True))
    z = to_unit(params, {"a": 1.0, "b": 10.0})
    assert list(z) == pytest.approx([0.25, 0.5])
    assert from_unit(params, z) == pytest.approx({"a": 1.0, "b": 10.0})


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="below"):
        Param("x", 1.0, 1.0)
    with pytest.raises(ValueError, match="log"):
        Param("x", 0.0, 1.0, log=True)
