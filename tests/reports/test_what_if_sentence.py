"""The what-if sentence names a policy only when it raises the SLO attainment."""

from slotune.reports.what_if import what_if_sentence


def _data(after: float) -> dict:
    return {
        "target": "vllm==0.34",
        "base": {"slo_attainment": 0.75, "tpot_p99_ms": 40.0},
        "policies": [
            {"name": "hybrid preemption", "scores": {"slo_attainment": 0.75, "tpot_p99_ms": 40.0}},
            {"name": "adaptive chunking", "scores": {"slo_attainment": after, "tpot_p99_ms": 30.0}},
        ],
    }


def test_a_gaining_policy_is_named_with_its_numbers() -> None:
    sentence = what_if_sentence(_data(1.0))
    assert "With adaptive chunking" in sentence
    assert "+25.0 points" in sentence


def test_no_gain_says_none_would_raise_attainment() -> None:
    sentence = what_if_sentence(_data(0.75))
    assert "None of them would raise" in sentence
    assert "With " not in sentence and "instead of" not in sentence
