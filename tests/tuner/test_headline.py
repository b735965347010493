"""The recommendation's headline: keep the defaults within noise; name the driver and the
cost; reconcile the importance chart with the recommendation."""

from __future__ import annotations

import pytest

from slotune.reports.sections import importance_note
from slotune.tuner.headline import drivers, headline
from slotune.tuner.noise import Verdict


def verdict(best: tuple, base: tuple, higher: bool = True) -> Verdict:
    return Verdict("goodput_rps" if higher else "score", higher, best, base, (0, 1, 2))


def test_noise_verdict() -> None:
    assert verdict((60, 61, 62), (50, 52, 55)).significant
    assert not verdict((57, 60, 66), (52, 55, 63)).significant  # issue 24's +10 % case
    assert verdict((0.3, 0.31, 0.32), (0.4, 0.41, 0.5), higher=False).significant
    v = verdict((60, 61, 62), (50, 52, 55))
    assert v.gain == pytest.approx(61 / 52 - 1) and v.band == pytest.approx(5 / 52)


STEADY = {"steady_state": {"steady": True}}


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ({"slo_attainment": 0.9, **STEADY}, ["slo"]),
        ({"slo_attainment": 0.5, "steady_state": {"steady": False}}, ["slo"]),
        ({"slo_attainment": 1.0, "num_preemptions": 40, **STEADY}, ["capacity"]),
        ({"slo_attainment": 1.0, "steady_state": {"steady": False}}, ["steadiness"]),
        ({"slo_attainment": 1.0, **STEADY}, ["latency"]),
    ],
)
def test_drivers(base: dict, expected: list) -> None:
    best = {"slo_attainment": 1.0, "num_preemptions": 0, **STEADY}
    assert drivers(best, base, 0.99) == expected


def test_within_noise_the_defaults_are_kept() -> None:
    text, found = headline(
        target_label="vLLM 0.34",
        changed={"kv_cache_dtype": "fp8"},
        verdict=verdict((57.4, 60.2, 66.4), (52.0, 54.6, 63.3)),
        best_metrics={},
        base_metrics={},
        attainment_target=0.99,
        rate=57.4,
    )
    assert text.startswith("Keep vLLM 0.34's defaults") and "run-to-run noise" in text
    assert found == []


def test_a_real_gain_names_its_driver_and_cost() -> None:
    text, found = headline(
        target_label="vLLM 0.34",
        changed={"kv_cache_dtype": "fp8"},
        verdict=verdict((60, 61, 62), (50, 52, 55)),
        best_metrics={"slo_attainment": 1.0, **STEADY},
        base_metrics={"slo_attainment": 1.0, "steady_state": {"steady": False}},
        attainment_target=0.99,
        rate=60,
    )
    assert found == ["steadiness"] and "Why: only steadiness" in text and "not a steady" in text
    assert "Cost: an fp8 (e4m3) KV cache" in text and "+17.3%" in text
    assert "not by capacity" in text  # no preemptions in the defaults' run


def test_importance_is_reconciled_with_the_recommendation() -> None:
    best = {
        "config": {"max_num_seqs": 1024, "kv_cache_dtype": "fp8"},
        "baseline": {"config": {"max_num_seqs": 1024, "kv_cache_dtype": "auto"}},
    }
    text = importance_note({"max_num_seqs": 0.6, "kv_cache_dtype": 0.1}, best)
    assert "max_num_seqs ranks first" in text and "keeps it at the default" in text
    assert "changes kv_cache_dtype" in text
    assert "the recommendation changes it" in importance_note({"kv_cache_dtype": 1.0}, best)
