"""One rule for what the cost model reads of a batch, whoever prices the step."""

from __future__ import annotations

from slotune.calibration.measure import StepShape
from slotune.calibration.step_fit import _totals
from slotune.engine.sim.batch import batch_totals


def test_one_token_entries_are_decodes_reading_their_new_token() -> None:
    assert batch_totals([(1, 99), (64, 0), (1, 9), (32, 100)]) == (2, 110, [(64, 0), (32, 100)])
    assert batch_totals([]) == (0, 0, [])


def test_a_calibration_shape_is_priced_as_the_executor_prices_its_batch() -> None:
    shape = StepShape(prefills=((512, 0), (128, 1024)), decodes=(10, 2000, 0))
    assert _totals(shape) == (3, 10 + 2000 + 0 + 3, [(512, 0), (128, 1024)])
