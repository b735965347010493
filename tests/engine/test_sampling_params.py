"""The sampling of replayed trace requests: exact lengths, one shared frozen instance each."""

from __future__ import annotations

import dataclasses

import pytest

from slotune.engine.sampling_params import SamplingParams, exact_length


def test_a_replayed_length_is_one_shared_frozen_sampling() -> None:
    params = exact_length(7)
    assert params is exact_length(7) and params is not exact_length(8)
    assert params == SamplingParams(max_tokens=7, ignore_eos=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.max_tokens = 9  # type: ignore[misc]


def test_a_bad_length_is_refused_every_time() -> None:
    for _ in range(2):  # an error is not cached as a result
        with pytest.raises(ValueError, match=r"SamplingParams\.max_tokens"):
            exact_length(0)
