"""GPU lookup for the baseline (each target's defaults: tests/targets)."""

from __future__ import annotations

import pytest

from slotune.tuner.baseline import gpu_spec


def test_unknown_gpu() -> None:
    with pytest.raises(ValueError, match="unknown GPU"):
        gpu_spec("tpu-v5")
