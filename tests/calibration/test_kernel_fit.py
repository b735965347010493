import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from slotune.calibration.errors import mlp_errors, profile_errors
from slotune.calibration.kernel_fit import fit_elementwise, fit_linear, relative_lstsq
from slotune.calibration.readers import DEFAULT_REFERENCE, FIT_SOURCES
from slotune.cli.app import app
from slotune.engine.sim import load_profile
from slotune.engine.sim.cost_model import elementwise_bytes, elementwise_seconds, gemm_seconds
from slotune.engine.sim.hardware import get_gpu
from slotune.engine.sim.profile import PROFILE_DIR, ElementwiseProfile, LinearProfile

REFERENCE = DEFAULT_REFERENCE
needs_reference = pytest.mark.skipif(
    not (REFERENCE / "h100_llama-2-7b_mlp.csv").is_file(),
    reason=f"reference kernel times not found at {REFERENCE} (shared/ beside the checkout)",
)


def _mlp_frame(rows: list[dict[str, float]]) -> pd.DataFrame:
    """A reference ``*_mlp.csv`` of Llama-2-7B shards, one row per (tokens, tp)."""
    base = {"n_head": 32, "n_kv_head": 32, "n_embd": 4096, "n_expanded_embd": 11008}
    return pd.DataFrame([{**base, **r} for r in rows])


def _synthetic_frame(linear: LinearProfile, norm: ElementwiseProfile) -> pd.DataFrame:
    """Kernel times the cost model gives for known constants (median columns, in ms)."""
    gpu = get_gpu("h100")
    bw, peak = gpu.hbm_bytes_per_s, gpu.flops_per_s
    rows = []
    for m in (1, 8, 32, 100, 256, 700, 2048, 4096):
        for tp in (1, 2, 4):
            h, ffn, attn = 4096, 11008 // tp, 4096 // tp
            dims = {
                "attn_pre_proj": (h, 3 * attn),
                "attn_post_proj": (attn, h),
                "mlp_up_proj": (h, 2 * ffn),
                "mlp_down_proj": (ffn, h),
            }
            row = {"num_tokens": m, "num_tensor_parallel_workers": tp}
            for column, (k, n) in dims.items():
                row[f"time_stats.{column}.median"] = 1e3 * gemm_seconds(linear, bw, peak, m, k, n)
            nbytes = elementwise_bytes("norm", m, h, 0, 0)
            row["time_stats.input_layernorm.median"] = 1e3 * elementwise_seconds(norm, bw, nbytes)
            rows.append(row)
    return _mlp_frame(rows)


def test_linear_fit_recovers_the_constants_that_made_the_times() -> None:
    from slotune.calibration.kernel_fit import RAMP_WIDTH

    truth = LinearProfile(
        overhead_us=7.0,
        mem_eff=0.85,
        compute_eff=0.65,
        half_tokens=90.0,
        tile_tokens=128,
        ramp_width=RAMP_WIDTH,
    )
    frame = _synthetic_frame(truth, ElementwiseProfile(2.0, 0.5))
    fitted = fit_linear(get_gpu("h100"), [frame])
    assert fitted.tile_tokens == 128
    for field in ("overhead_us", "mem_eff", "compute_eff", "half_tokens"):
        assert getattr(fitted, field) == pytest.approx(getattr(truth, field), rel=0.01), field


def test_relative_lstsq_holds_coefficients_at_their_lower_bounds() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0])
    t = 0.5 + 0.2 * x  # exact fit would have slope 0.2; the bound says at least 1
    intercept, slope = relative_lstsq([np.ones_like(x), x], t, [0.0, 1.0])
    assert slope == pytest.approx(1.0) and intercept == pytest.approx(0.0, abs=1e-9)
    # Unconstrained it is the exact fit.
    assert relative_lstsq([np.ones_like(x), x], t, [0.0, 0.0]) == pytest.approx([0.5, 0.2])


def test_elementwise_fit_never_beats_the_datasheet_bandwidth() -> None:
    gpu = get_gpu("h100")
    frame = _synthetic_frame(LinearProfile(5.0, 0.8, 0.7, 32.0, 64), ElementwiseProfile(2.0, 0.5))
    frame["time_stats.input_layernorm.median"] /= 3  # faster than the HBM allows
    for column in ("post_attention_layernorm", "attn_rope", "mlp_act", "add", "emb"):
        frame[f"time_stats.{column}.median"] = frame["time_stats.input_layernorm.median"]
    fitted = fit_elementwise(gpu, [frame])
    assert all(0 < p.eff <= 1.0 for p in fitted.values())
    assert fitted["norm"].eff == 1.0 and fitted["norm"].overhead_us >= 0


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
    profile = load_profile("h100")
    frames = [pd.read_csv(REFERENCE / f) for f in FIT_SOURCES["h100"]["mlp"]]
    refit = fit_linear(profile.gpu, frames)
    assert refit.tile_tokens == profile.linear.tile_tokens
    assert math.isclose(refit.compute_eff, profile.linear.compute_eff, rel_tol=0.02)
    assert math.isclose(refit.mem_eff, profile.linear.mem_eff, rel_tol=0.02)


@needs_reference
def test_calibrate_from_kernels_writes_loadable_profiles_and_reports(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", "--from-kernels", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = sorted(p.stem for p in tmp_path.glob("*.json"))
    assert "h100" in written and "a100-80g" in written and "h200" in written
    assert load_profile(str(tmp_path / "a100-80g.json")).gpu.name == "a100-80g"
    assert "| layer (all ops above but emb) |" in result.output

    report = CliRunner().invoke(app, ["calibrate", "--from-kernels", "--report"])
    assert report.exit_code == 0, report.output
    assert "### h100" in report.output and "`h100_llama-2-7b_mlp.csv`" in report.output


def test_calibrate_from_kernels_needs_a_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(app, ["calibrate", "--from-kernels", "--reference", str(missing)])
    assert result.exit_code == 2 and "not found" in result.output
