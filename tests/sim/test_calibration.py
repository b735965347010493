import json
import math
from pathlib import Path

import pytest

from slotune.engine.sim import load_profile
from slotune.engine.sim.calibration import (
    FIT_SOURCES,
    fit_linear,
    mlp_errors,
    nelder_mead,
    profile_errors,
)
from slotune.engine.sim.profile import PROFILE_DIR

REFERENCE = Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / "gpu-profiles"
needs_reference = pytest.mark.skipif(
    not (REFERENCE / "h100_llama-2-7b_mlp.csv").is_file(),
    reason=f"reference kernel times not found at {REFERENCE} (shared/ beside the checkout)",
)


def test_nelder_mead_finds_a_known_minimum() -> None:
    x = nelder_mead(lambda v: (v[0] - 3) ** 2 + 10 * (v[1] + 1) ** 2 + 1, [0.0, 0.0])
    assert x[0] == pytest.approx(3, abs=1e-3) and x[1] == pytest.approx(-1, abs=1e-3)


@needs_reference
@pytest.mark.parametrize("gpu", sorted(FIT_SOURCES))
def test_fitted_profile_reproduces_the_reference_within_the_reported_error(gpu: str) -> None:
    profile = load_profile(gpu)
    reported = json.loads((PROFILE_DIR / f"{gpu}.json").read_text())["fit_p90_abs_error_pct"]
    rows = profile_errors(profile, REFERENCE)
    assert len(rows) == len(reported)
    for r in rows:
        assert r.p90_pct <= reported[f"{r.file}:{r.op}:{r.range_name}"] + 0.05, r
        if r.range_name.startswith(("513", "4097")):  # large batches: the ones that dominate
            assert r.median_pct < 16, r


@needs_reference
def test_h100_whole_layer_linear_time_is_close_at_serving_batch_sizes() -> None:
    profile = load_profile("h100")
    rows = [
        r
        for r in mlp_errors(profile, REFERENCE / "h100_llama-2-7b_mlp.csv")
        if r.op.endswith("proj") and not r.range_name.startswith("1–")
    ]
    assert rows and all(r.median_pct < 10 for r in rows)


@needs_reference
def test_refit_recovers_the_shipped_linear_constants() -> None:
    import pandas as pd

    profile = load_profile("h100")
    frames = [pd.read_csv(REFERENCE / f) for f in FIT_SOURCES["h100"]["mlp"]]
    refit = fit_linear(profile.gpu, frames)
    assert refit.tile_tokens == profile.linear.tile_tokens
    assert math.isclose(refit.compute_eff, profile.linear.compute_eff, rel_tol=0.02)
    assert math.isclose(refit.mem_eff, profile.linear.mem_eff, rel_tol=0.02)
