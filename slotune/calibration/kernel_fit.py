"""Fit the shipped GPU profiles to the reference kernel times (see ``readers``).

Linear ops share one roofline fit per GPU (bounded least squares on log error, the GEMM
M-tile chosen from a grid; dogbox, as trf stops on a bound short of the optimum here) so
that the profile carries over to other model shapes; each memory-bound op and both
attention kernels get a bounded linear least-squares fit of relative error. Only the
fitted constants are shipped.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotune.calibration.errors import profile_errors
from slotune.calibration.readers import (
    DERIVED_FROM,
    ELEMENTWISE_COLUMNS,
    FIT_SOURCES,
    LINEAR_OPS,
    attention_frame,
    gemm_dims,
    median_seconds,
    mlp_shapes,
    read_reference,
)
from slotune.calibration.transforms import Param, from_unit, to_unit
from slotune.engine.sim.cost_model import elementwise_bytes
from slotune.engine.sim.hardware import GpuSpec, get_gpu
from slotune.engine.sim.profile import (
    AttentionProfile,
    ElementwiseProfile,
    GpuProfile,
    LinearProfile,
    SystemProfile,
    profile_from_dict,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# GEMM M-tiles tried. A smooth curve (tile 1) fits the reference slightly better, since
# cuBLAS picks smaller tiles for small M, but real kernels do pad M to their tile.
LINEAR_TILES = (64, 128)
RAMP_WIDTH = 10_000.0
"""The output width at which a fitted ``half_tokens`` holds (``LinearProfile.ramp``)."""
LINEAR_PARAMS = (
    Param("overhead_us", 1e-2, 1e3, log=True),
    Param("mem_eff", 0.01, 1.0),
    Param("compute_eff", 0.01, 1.0),
    Param("half_tokens", 1e-2, 1e5, log=True),
)
LINEAR_START = {"overhead_us": 5.0, "mem_eff": 0.8, "compute_eff": 0.7, "half_tokens": 32.0}
ATTENTION_Q_TILES = (16, 32, 64, 128)
BLOCK_INDIRECTION_TOKENS = 2.0  # not in the reference data: an estimate


def fit_linear(gpu: GpuSpec, frames: list[pd.DataFrame]) -> LinearProfile:
    """The roofline of all four projections, least squares on log time, per M-tile."""
    import numpy as np
    from scipy.optimize import least_squares

    ms, ks, ns, ts = [], [], [], []
    for df in frames:
        shapes = mlp_shapes(df)
        for column, op in LINEAR_OPS.items():
            k, n = gemm_dims(shapes, op)
            ms.append(shapes["m"])
            ks.append(k)
            ns.append(n)
            ts.append(median_seconds(df, column))
    m, k, n, t = (np.concatenate(a).astype(float) for a in (ms, ks, ns, ts))
    keep = t > 0
    m, k, n, t = m[keep], k[keep], n[keep], t[keep]
    log_t = np.log(t)
    bw, peak = gpu.hbm_bytes_per_s, gpu.flops_per_s
    nbytes = 2.0 * (k * n + m * k + m * n)
    best: tuple[float, LinearProfile] | None = None
    for tile in LINEAR_TILES:
        m_pad = np.ceil(m / tile) * tile

        def residuals(z: np.ndarray, m_pad: np.ndarray = m_pad) -> np.ndarray:
            v = from_unit(LINEAR_PARAMS, z)
            ramp = v["half_tokens"] * RAMP_WIDTH / n
            t_cmp = 2.0 * (m_pad + ramp) * k * n / (peak * v["compute_eff"])
            pred = v["overhead_us"] * 1e-6 + np.maximum(nbytes / (bw * v["mem_eff"]), t_cmp)
            return np.log(pred) - log_t

        z0 = to_unit(LINEAR_PARAMS, LINEAR_START)
        sol = least_squares(residuals, z0, bounds=(0.0, 1.0), method="dogbox")
        value = float(np.mean(sol.fun**2))
        v = from_unit(LINEAR_PARAMS, sol.x)
        prof = LinearProfile(
            overhead_us=round(v["overhead_us"], 4),
            mem_eff=round(v["mem_eff"], 4),
            compute_eff=round(v["compute_eff"], 4),
            half_tokens=round(v["half_tokens"], 3),
            tile_tokens=tile,
            fitted_on=gpu.name,
            ramp_width=RAMP_WIDTH,
        )
        if best is None or value < best[0]:
            best = (value, prof)
    assert best is not None
    return best[1]


def relative_lstsq(features: list[np.ndarray], t: np.ndarray, lower: list[float]) -> list[float]:
    """The coefficients ``c_i ≥ lower_i`` minimising the squared relative error of
    ``Σ c_i f_i`` against ``t``."""
    import numpy as np
    from scipy.optimize import lsq_linear

    a = np.stack([f / t for f in features], axis=1)
    sol = lsq_linear(a, np.ones_like(t), bounds=(lower, np.inf), method="bvls")
    return [float(c) for c in sol.x]


def fit_elementwise(gpu: GpuSpec, frames: list[pd.DataFrame]) -> dict[str, ElementwiseProfile]:
    """Overhead plus bytes at an efficiency of at most 1, per memory-bound op."""
    import numpy as np

    bw = gpu.hbm_bytes_per_s
    out: dict[str, ElementwiseProfile] = {}
    for op in sorted(set(ELEMENTWISE_COLUMNS.values())):
        bs, ts = [], []
        for df in frames:
            s = mlp_shapes(df)
            for column, col_op in ELEMENTWISE_COLUMNS.items():
                if col_op == op:
                    dims = zip(s["m"], s["hidden"], s["qk_dim"], s["ffn"], strict=True)
                    bs.append(np.array([elementwise_bytes(op, *map(int, d)) for d in dims]))
                    ts.append(median_seconds(df, column))
        b, t = np.concatenate(bs).astype(float), np.concatenate(ts)
        keep = t > 0
        b, t = b[keep], t[keep]
        ovh, per_byte = relative_lstsq([np.ones_like(t), b], t, [0.0, 1.0 / bw])
        out[op] = ElementwiseProfile(
            overhead_us=round(ovh * 1e6, 4), eff=round(min(1.0, 1.0 / (per_byte * bw)), 4)
        )
    return out


def fit_attention(gpu: GpuSpec, frames: list[pd.DataFrame]) -> AttentionProfile:
    """Prefill (overhead, prefix and causal FLOPs) and decode (overhead, per sequence, KV
    bytes) attention, efficiencies at most 1, the query tile chosen from a grid."""
    import numpy as np

    bw, peak = gpu.hbm_bytes_per_s, gpu.flops_per_s
    indirection = BLOCK_INDIRECTION_TOKENS
    best: tuple[float, AttentionProfile] | None = None
    for q_tile in ATTENTION_Q_TILES:
        pre_t, pre_fp, pre_fc, dec_t, dec_b, dec_bytes = [], [], [], [], [], []
        for df in frames:
            a = attention_frame(df)
            pre = a["prefill"]
            per_pair = 4.0 * a["q_heads"] * a["head_dim"]
            q_pad = np.ceil(a["chunk"] / q_tile) * q_tile
            pre_t.append(median_seconds(df, "attn_prefill")[pre])
            pre_fp.append((per_pair * q_pad * a["prior"] / peak)[pre])
            pre_fc.append((0.5 * per_pair * q_pad * a["chunk"] / peak)[pre])
            dec = ~pre
            dec_t.append(median_seconds(df, "attn_decode")[dec])
            dec_b.append(a["batch"][dec].astype(float))
            ctx = a["batch"] * (a["prior"] + 1.0)
            dec_bytes.append((ctx * a["kv_bytes"] * (1 + indirection / a["block_size"]) / bw)[dec])
        t, fp, fc = (np.concatenate(x) for x in (pre_t, pre_fp, pre_fc))
        c0, cp, cc = relative_lstsq([np.ones_like(t), fp, fc], t, [0.0, 1.0, 1.0])
        err = float(np.mean(np.log((c0 + cp * fp + cc * fc) / t) ** 2))
        td, b, byt = (np.concatenate(x) for x in (dec_t, dec_b, dec_bytes))
        d0, d1, d2 = relative_lstsq([np.ones_like(td), b, byt], td, [0.0, 0.0, 1.0])
        prof = AttentionProfile(
            prefill_overhead_us=round(c0 * 1e6, 4),
            prefill_prefix_eff=round(1.0 / cp, 4),
            prefill_causal_eff=round(1.0 / cc, 4),
            q_tile=q_tile,
            decode_overhead_us=round(d0 * 1e6, 4),
            decode_per_seq_us=round(d1 * 1e6, 5),
            decode_eff=round(1.0 / d2, 4),
            block_indirection_tokens=indirection,
        )
        if best is None or err < best[0]:
            best = (err, prof)
    assert best is not None
    return best[1]


def fit_profile(
    gpu_name: str, reference: Path, attention_from: GpuProfile | None = None
) -> GpuProfile:
    """The profile of a GPU in ``FIT_SOURCES`` fitted to its reference files (attention
    from ``attention_from`` where the GPU has no attention measurements)."""
    gpu = get_gpu(gpu_name)
    sources = FIT_SOURCES[gpu.name]
    mlp = [read_reference(reference / f) for f in sources["mlp"]]
    att_files = sources["attention"]
    if att_files:
        attention = fit_attention(gpu, [read_reference(reference / f) for f in att_files])
        att_note = f"attention fitted to {', '.join(att_files)}"
    elif attention_from is not None:
        attention = attention_from.attention
        att_note = (
            f"attention efficiencies taken from the {attention_from.gpu.name} fit "
            "(no attention measurements for this GPU)"
        )
    else:
        raise ValueError(f"{gpu.name}: no attention data and no profile to take it from")
    note = (
        f"Fitted to {', '.join(sources['mlp'])} (linear and memory-bound ops); {att_note}. "
        "Block indirection, links, copies and CPU overheads are estimates, not fitted."
    )
    return GpuProfile(
        gpu, fit_linear(gpu, mlp), fit_elementwise(gpu, mlp), attention, SystemProfile(), note=note
    )


def derive_profile(base: GpuProfile, gpu_name: str) -> GpuProfile:
    """``base``'s efficiencies and overheads on the datasheet of ``gpu_name``."""
    gpu = get_gpu(gpu_name)
    note = (
        f"Not measured: the {base.gpu.name} profile's efficiencies and overheads applied "
        f"to the {gpu.name} datasheet figures (bandwidth, peak FLOP/s, links), i.e. scaled "
        "by datasheet ratios."
    )
    return replace(base, gpu=gpu, note=note)


def fit_all(reference: Path) -> dict[str, GpuProfile]:
    """Every profile of ``FIT_SOURCES`` fitted, and those of ``DERIVED_FROM`` derived."""
    a100 = fit_profile("a100-80g", reference)
    fitted = {"a100-80g": a100, "h100": fit_profile("h100", reference, attention_from=a100)}
    derived = {name: derive_profile(fitted[base], name) for name, base in DERIVED_FROM.items()}
    return {**fitted, **derived}


def write_profiles(profiles: dict[str, GpuProfile], reference: Path, out_dir: Path) -> list[Path]:
    """Write ``profiles`` as shippable JSON: a fitted one with its sources and the p90
    errors against them (which the tests hold it to), a derived one with its base."""
    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, prof in profiles.items():
        extra: dict[str, Any]
        if name in FIT_SOURCES:
            errors = profile_errors(prof, reference)
            summary = {f"{r.file}:{r.op}:{r.range_name}": r.p90_pct for r in errors}
            extra = {"fitted_from": FIT_SOURCES[name], "fit_p90_abs_error_pct": summary}
        else:
            extra = {"derived_from": DERIVED_FROM[name]}
        data = {**prof.to_dict(), **extra}
        profile_from_dict(data, "fitted profile")  # validates the constants before shipping
        path = out_dir / f"{prof.gpu.name}.json"
        path.write_text(json.dumps(data, indent=2) + "\n")
        written.append(path)
    return written
