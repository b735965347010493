"""``traces fit`` round trip: a trace synthesized from a spec has the fitted statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.workloads import Trace, TraceRequest, load_trace
from slotune.workloads.fit import QUANTILES, fit_trace
from slotune.workloads.synthesize import synthesize

runner = CliRunner()
PERIOD_S = 3600.0


def _diurnal_shared_prefix_trace(n: int = 1500, seed: int = 1) -> Trace:
    """Poisson arrivals whose rate swings by ±80 % over the hour; 70 % of prompts start
    with one of 6 system prompts (Zipf-like popularity), the rest are unique; outputs
    grow with prompts."""
    rng = np.random.default_rng(seed)
    times: list[float] = []
    t, peak = 0.0, n / PERIOD_S * 1.8
    while len(times) < n:  # thinning
        t += rng.exponential(1 / peak)
        if rng.random() < (1 + 0.8 * np.sin(2 * np.pi * t / PERIOD_S)) / 1.8:
            times.append(t)
    weights = 1 / np.arange(1, 7)
    reqs = []
    for i, at in enumerate(times):
        own = int(rng.lognormal(5, 0.6)) + 1
        out = max(1, int(own * 0.5 + rng.lognormal(4, 0.5)))
        if rng.random() < 0.7:
            g = int(rng.choice(6, p=weights / weights.sum()))
            segs = ((g, 256 * (g + 1)), (100 + i, own))
        else:
            segs = ((100 + i, own),)
        reqs.append(
            TraceRequest(
                request_id=f"r{i}",
                prompt_len=sum(s for _, s in segs),
                output_len=out,
                arrival_time=round(at, 6),
                prompt_segments=segs,
            )
        )
    return Trace(name="diurnal", requests=tuple(reqs), seed=seed)


def _close(a: list[float], b: list[float], rel: float, at=(0.1, 0.5, 0.9)) -> None:
    for q in at:
        k = int(np.argmin(np.abs(QUANTILES - q)))
        assert b[k] == pytest.approx(a[k], rel=rel), (q, a[k], b[k])


def test_round_trip_of_lengths_arrivals_and_prefix_sharing() -> None:
    original = _diurnal_shared_prefix_trace()
    spec = fit_trace(original)
    assert spec["arrivals"]["burstiness"] == pytest.approx(1.0, rel=0.15)  # Poisson, shape out
    assert spec["prefix"]["share"] == pytest.approx(0.7, abs=0.04)
    assert len(spec["prefix"]["weights"]) == 6

    many = synthesize(spec, 6000, seed=3)  # four times the sample, same statistics
    refit = fit_trace(many)
    for key in ("prompt", "output"):
        _close(spec["lengths"][key], refit["lengths"][key], rel=0.1)
    assert refit["lengths"]["prompt_output_spearman"] == pytest.approx(
        spec["lengths"]["prompt_output_spearman"], abs=0.06
    )
    assert refit["arrivals"]["rate"] == pytest.approx(spec["arrivals"]["rate"], rel=0.05)
    assert refit["prefix"]["share"] == pytest.approx(spec["prefix"]["share"], abs=0.03)
    assert np.allclose(refit["prefix"]["weights"], spec["prefix"]["weights"], atol=0.03)
    _close(spec["prefix"]["shared_len"], refit["prefix"]["shared_len"], rel=0.05, at=(0.25, 0.75))
    ratio = original.stats()["prefix_sharing_ratio"]
    assert many.stats()["prefix_sharing_ratio"] == pytest.approx(ratio, abs=0.05)

    one_period = fit_trace(synthesize(spec, len(original), seed=4))
    shape, reshape = spec["arrivals"]["profile"], one_period["arrivals"]["profile"]
    assert np.corrcoef(shape, reshape)[0, 1] > 0.9  # the rate's swing over the hour
    assert one_period["arrivals"]["period_s"] == pytest.approx(PERIOD_S, rel=0.05)
    assert one_period["arrivals"]["burstiness"] == pytest.approx(
        spec["arrivals"]["burstiness"], rel=0.25
    )


def test_round_trip_of_sessions() -> None:
    original = load_trace("agent")
    spec = fit_trace(original)
    synth = synthesize(spec, 3000, seed=5)
    refit = fit_trace(synth)
    for turns, share in spec["sessions"]["turns"].items():
        assert refit["sessions"]["turns"].get(turns, 0) == pytest.approx(share, abs=0.05)
    _close(spec["sessions"]["think_time_s"], refit["sessions"]["think_time_s"], rel=0.15)
    _close(spec["lengths"]["followup_prompt"], refit["lengths"]["followup_prompt"], rel=0.1)
    a, b = original.stats(), synth.stats()
    assert b["prefix_sharing_ratio"] == pytest.approx(a["prefix_sharing_ratio"], abs=0.03)
    assert b["prompt_len"]["mean"] == pytest.approx(a["prompt_len"]["mean"], rel=0.1)
    assert b["turns_per_session"] == pytest.approx(a["turns_per_session"], rel=0.1)
    assert spec["arrivals"] is None and not synth.has_timestamps


def test_cli_fit_then_synthesize_from_the_spec(tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    res = runner.invoke(app, ["traces", "fit", "shared-prefix", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "prefix sharing: 100% of first turns, 8 groups" in res.output
    res = runner.invoke(app, ["traces", "show", str(out), "--num-requests", "1200", "--json"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert stats["requests"] == 1200 and stats["prefix_sharing_ratio"] > 0.8
    bench = runner.invoke(
        app, ["bench", "--trace", str(out), "--num-requests", "50", "--rate", "5", "--json"]
    )
    assert bench.exit_code == 0, bench.output


def test_a_bad_spec_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text('{"slotune_spec": 1, "name": "x", "lengths": {}, "sessions": {}}')
    res = runner.invoke(app, ["traces", "show", str(path)])
    assert res.exit_code == 2 and "bad workload spec" in res.output
