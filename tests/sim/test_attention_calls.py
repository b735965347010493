"""Attention that makes one call per group of decodes of similar context, and one per
prefill chunk (the torch reference backend), costs per call; the expected decode calls are
the context ranges a batch occupies."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pandas as pd
import pytest

from slotune.engine import EngineConfig
from slotune.engine.sim import CostModel, get_model, load_profile
from slotune.engine.sim.profile import decode_calls, profile_from_dict
from slotune.workloads import ArrivalSpec, run_simulated, sharegpt_like


@pytest.mark.parametrize("ranges", [1.0, 2.0, 3.5, 12.0])
def test_expected_calls_match_counting_occupied_ranges(ranges: float) -> None:
    """Brute force: draw each decode's range, count the distinct ones, average."""
    rng = random.Random(0)
    whole, frac = int(ranges), ranges - int(ranges)
    for n in (1, 2, 5, 8, 30):
        draws = 20_000
        total = 0
        for _ in range(draws):  # ``ranges`` bins: whole ones of weight 1, one of ``frac``
            bins = set()
            for _ in range(n):
                x = rng.random() * ranges
                bins.add(int(x) if x < whole else whole)
            total += len(bins)
        if frac == 0:
            assert decode_calls(n, ranges) == pytest.approx(total / draws, rel=0.02)
        assert 1.0 <= decode_calls(n, ranges) <= min(n, ranges) + 1e-9


def _grouping(gpu: str, per_call_us: float, ranges: float, per_chunk_us: float = 0.0):  # type: ignore[no-untyped-def]
    profile = load_profile(gpu)
    attention = dataclasses.replace(
        profile.attention,
        decode_per_call_us=per_call_us,
        decode_call_ranges=ranges,
        prefill_per_chunk_us=per_chunk_us,
    )
    return dataclasses.replace(profile, attention=attention)


def test_calls_add_their_cost_to_decode_steps_only() -> None:
    model = get_model("llama-2-7b")
    plain = CostModel(load_profile("a100-80g"), model)
    grouped = CostModel(_grouping("a100-80g", 50.0, 4.0), model)
    per_call = model.num_layers * 50e-6
    for n in (1, 3, 8, 40):
        extra = grouped.step_seconds(n, n, n, n, 700 * n) - plain.step_seconds(n, n, n, n, 700 * n)
        assert extra == pytest.approx(per_call * decode_calls(n, 4.0), rel=1e-9)
    chunk = [(512, 0)]
    assert grouped.step_seconds(512, 1, 1, 0, 0, chunk) == plain.step_seconds(
        512, 1, 1, 0, 0, chunk
    )


def test_each_prefill_chunk_pays_its_call() -> None:
    model = get_model("llama-2-7b")
    plain = CostModel(load_profile("a100-80g"), model)
    chunked = CostModel(_grouping("a100-80g", 0.0, 1.0, per_chunk_us=30.0), model)
    per_chunk = model.num_layers * 30e-6
    for chunks in ([(512, 0)], [(100, 0)] * 5, [(64, 900), (200, 0), (8, 40)]):
        tokens = sum(c for c, _ in chunks)
        args = (tokens, len(chunks), len(chunks), 0, 0, chunks)
        extra = chunked.step_seconds(*args) - plain.step_seconds(*args)
        assert extra == pytest.approx(per_chunk * len(chunks), rel=1e-9)
    assert chunked.step_seconds(8, 8, 8, 8, 5600) == plain.step_seconds(8, 8, 8, 8, 5600)


def test_a_grouping_profile_round_trips_and_shipped_ones_do_not_mention_it(
    tmp_path: Path,
) -> None:
    shipped = load_profile("h100").to_dict()
    assert "decode_per_call_us" not in shipped["attention"]
    assert "prefill_per_chunk_us" not in shipped["attention"]
    grouped = _grouping("h100", 30.0, 5.0, per_chunk_us=12.0)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(grouped.to_dict()))
    assert load_profile(str(path)).attention == grouped.attention
    bad = grouped.to_dict()
    bad["attention"]["decode_call_ranges"] = 0.5
    with pytest.raises(ValueError, match="decode_call_ranges"):
        profile_from_dict(bad, "bad")


def test_stretches_price_calls_as_single_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTUNE_CHECK_STRETCHES", "1")
    path = tmp_path / "grouped.json"
    path.write_text(json.dumps(_grouping("a100-80g", 80.0, 3.0, per_chunk_us=60.0).to_dict()))
    config = EngineConfig(num_gpu_blocks=800)
    trace, arrivals = sharegpt_like(150, seed=4), ArrivalSpec(rate=6.0)
    kw = {"arrivals": arrivals, "model": "llama-2-7b", "gpu": str(path)}
    on = run_simulated(config, trace, **kw)  # type: ignore[arg-type]
    off = run_simulated(config, trace, stretches=False, **kw)  # type: ignore[arg-type]
    pd.testing.assert_frame_equal(on.steps, off.steps, check_exact=True)
    assert on.engine_stats["stretch_steps"] > len(on.steps) // 4
    plain = run_simulated(config, trace, arrivals=arrivals, model="llama-2-7b", gpu="a100-80g")
    assert on.duration_s > plain.duration_s  # the calls reached the step prices
