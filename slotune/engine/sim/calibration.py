"""Fit GPU profiles to measured per-op kernel times, and measure the fitted model's error.

The reference files are per-layer CUDA kernel times (Vidur's profiling format, see
``shared/reference/gpu-profiles/README.md``). Linear ops share one roofline fit per GPU
(Nelder-Mead on squared log error, the GEMM tile chosen from a grid) so that the profile
carries over to other model shapes; each memory-bound op and both attention kernels get a
weighted least-squares fit of relative error. Only the fitted constants are shipped.

    python -m slotune.engine.sim.calibration fit      # rewrite the shipped profiles
    python -m slotune.engine.sim.calibration report   # error table (Markdown)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotune.engine.sim.cost_model import (
    decode_attention_seconds,
    elementwise_bytes,
    elementwise_seconds,
    gemm_seconds,
    prefill_attention_seconds,
)
from slotune.engine.sim.hardware import GpuSpec, get_gpu
from slotune.engine.sim.profile import (
    PROFILE_DIR,
    AttentionProfile,
    ElementwiseProfile,
    GpuProfile,
    LinearProfile,
    SystemProfile,
    load_profile,
    profile_from_dict,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

DEFAULT_REFERENCE = (
    Path(__file__).resolve().parents[3] / ".." / "shared" / "reference" / ("gpu-profiles")
)

# Which reference files feed which shipped profile.
FIT_SOURCES: dict[str, dict[str, list[str]]] = {
    "h100": {"mlp": ["h100_llama-2-7b_mlp.csv"], "attention": []},
    "a100-80g": {
        "mlp": ["a100_llama-2-7b_mlp.csv", "a100_llama-3-8b_mlp.csv"],
        "attention": ["a100_llama-2-70b-tp2_attention.csv"],
    },
}
# Profiles without measurements: the base profile's efficiencies on the new datasheet.
DERIVED_FROM = {
    "h100-pcie": "h100",
    "h200": "h100",
    "b200": "h100",
    "a100-40g": "a100-80g",
    "l40s": "a100-80g",
    "a10g": "a100-80g",
    "l4": "a100-80g",
    "mi300x": "a100-80g",
    "rtx4090": "a100-80g",
}

LINEAR_OPS = {
    "attn_pre_proj": "qkv_proj",
    "attn_post_proj": "o_proj",
    "mlp_up_proj": "mlp_up",
    "mlp_down_proj": "mlp_down",
}
ELEMENTWISE_COLUMNS = {
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "attn_rope": "rope",
    "mlp_act": "act",
    "add": "add",
    "emb": "embed",
}
# GEMM M-tiles tried. A smooth curve (tile 1) fits the reference slightly better, since
# cuBLAS picks smaller tiles for small M, but real kernels do pad M to their tile.
LINEAR_TILES = (64, 128)
TOKEN_RANGES = ((1, 64), (65, 512), (513, 4096), (4097, 32768))
BATCH_RANGES = ((1, 16), (17, 64), (65, 128))
CHUNK_RANGES = ((64, 512), (513, 1024), (1025, 4096))


@dataclass(frozen=True)
class ErrorRow:
    file: str
    op: str
    range_name: str
    count: int
    median_pct: float
    p90_pct: float


# -- reference data ------------------------------------------------------------------------
def _read(path: Path) -> pd.DataFrame:
    import pandas as pd

    return pd.read_csv(path)


def _mlp_shapes(df: pd.DataFrame) -> dict[str, np.ndarray]:
    import numpy as np

    tp = df["num_tensor_parallel_workers"].to_numpy()
    heads = df["n_head"].to_numpy()
    hidden = df["n_embd"].to_numpy()
    hd = hidden // heads
    q = heads // tp
    kv = np.maximum(1, df["n_kv_head"].to_numpy() // tp)
    return {
        "m": df["num_tokens"].to_numpy(),
        "hidden": hidden,
        "qkv_out": (q + 2 * kv) * hd,
        "attn_dim": q * hd,
        "qk_dim": (q + kv) * hd,
        "ffn": df["n_expanded_embd"].to_numpy() // tp,
    }


def _gemm_dims(shapes: dict[str, np.ndarray], op: str) -> tuple[np.ndarray, np.ndarray]:
    h = shapes["hidden"]
    if op == "qkv_proj":
        return h, shapes["qkv_out"]
    if op == "o_proj":
        return shapes["attn_dim"], h
    if op == "mlp_up":
        return h, 2 * shapes["ffn"]
    return shapes["ffn"], h


def _median_ms(df: pd.DataFrame, column: str) -> np.ndarray:
    return df[f"time_stats.{column}.median"].to_numpy(dtype=float)


# -- fitting -------------------------------------------------------------------------------
def nelder_mead(
    f: Callable[[list[float]], float], x0: list[float], step: float = 0.5, iters: int = 3000
) -> list[float]:
    """A plain Nelder-Mead minimiser (no SciPy in the dependency set)."""
    n = len(x0)
    simplex = [list(x0)] + [
        [x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)
    ]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < 1e-12:
            break
        centroid = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]

        def toward(t: float, worst: list[float] = worst, c: list[float] = centroid) -> list[float]:
            return [c[j] + t * (worst[j] - c[j]) for j in range(n)]

        refl = toward(-1.0)
        fr = f(refl)
        if fr < values[0]:
            exp = toward(-2.0)
            fe = f(exp)
            simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = refl, fr
        else:
            con = toward(0.5)
            fc = f(con)
            if fc < values[-1]:
                simplex[-1], values[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [
                    [best[j] + 0.5 * (x[j] - best[j]) for j in range(n)] for x in simplex[1:]
                ]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[min(range(n + 1), key=values.__getitem__)]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def fit_linear(gpu: GpuSpec, frames: list[pd.DataFrame]) -> LinearProfile:
    import numpy as np

    ms, ks, ns, ts = [], [], [], []
    for df in frames:
        shapes = _mlp_shapes(df)
        for column, op in LINEAR_OPS.items():
            k, n = _gemm_dims(shapes, op)
            ms.append(shapes["m"])
            ks.append(k)
            ns.append(n)
            ts.append(_median_ms(df, column) * 1e-3)
    m, k, n, t = (np.concatenate(a).astype(float) for a in (ms, ks, ns, ts))
    keep = t > 0
    m, k, n, t = m[keep], k[keep], n[keep], t[keep]
    log_t = np.log(t)
    bw, peak = gpu.hbm_bytes_per_s, gpu.flops_per_s
    nbytes = 2.0 * (k * n + m * k + m * n)
    best: tuple[float, LinearProfile] | None = None
    for tile in LINEAR_TILES:
        m_pad = np.ceil(m / tile) * tile
        flops = 2.0 * m_pad * k * n

        def loss(x: list[float], flops: np.ndarray = flops, m_pad: np.ndarray = m_pad) -> float:
            ovh, half = math.exp(x[0]) * 1e-6, math.exp(x[3])
            me, ce = _sigmoid(x[1]), _sigmoid(x[2])
            t_cmp = flops * (m_pad + half) / (m_pad * peak * ce)
            pred = ovh + np.maximum(nbytes / (bw * me), t_cmp)
            return float(np.mean((np.log(pred) - log_t) ** 2))

        x = nelder_mead(loss, [math.log(5.0), _logit(0.8), _logit(0.7), math.log(32.0)])
        x = nelder_mead(loss, x, step=0.2)
        x = nelder_mead(loss, x, step=0.1)
        value = loss(x)
        prof = LinearProfile(
            overhead_us=round(math.exp(x[0]), 4),
            mem_eff=round(_sigmoid(x[1]), 4),
            compute_eff=round(_sigmoid(x[2]), 4),
            half_tokens=round(math.exp(x[3]), 3),
            tile_tokens=tile,
        )
        if best is None or value < best[0]:
            best = (value, prof)
    assert best is not None
    return best[1]


def _weighted_nonneg_lstsq(features: list[np.ndarray], t: np.ndarray) -> list[float]:
    """Minimise the squared relative error of ``Σ c_i f_i`` against ``t`` with ``c_i ≥ 0``
    (active-set: drop a feature whose coefficient comes out negative, refit)."""
    import numpy as np

    active = list(range(len(features)))
    while True:
        a = np.stack([features[i] / t for i in active], axis=1)
        coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        if (coef >= 0).all() or not active:
            out = [0.0] * len(features)
            for i, c in zip(active, coef, strict=True):
                out[i] = float(c)
            return out
        active.pop(int(np.argmin(coef)))


def fit_elementwise(gpu: GpuSpec, frames: list[pd.DataFrame]) -> dict[str, ElementwiseProfile]:
    import numpy as np

    bw = gpu.hbm_bytes_per_s
    out: dict[str, ElementwiseProfile] = {}
    for op in sorted(set(ELEMENTWISE_COLUMNS.values())):
        bs, ts = [], []
        for df in frames:
            s = _mlp_shapes(df)
            for column, col_op in ELEMENTWISE_COLUMNS.items():
                if col_op != op:
                    continue
                bs.append(elementwise_bytes(op, s["m"], s["hidden"], s["qk_dim"], s["ffn"]))
                ts.append(_median_ms(df, column) * 1e-3)
        b, t = np.concatenate(bs).astype(float), np.concatenate(ts)
        keep = t > 0
        b, t = b[keep], t[keep]
        ovh, per_byte = _weighted_nonneg_lstsq([np.ones_like(t), b], t)
        if per_byte < 1.0 / bw:  # faster than the datasheet: pin to the floor, refit overhead
            per_byte = 1.0 / bw
            ovh = max(0.0, float(np.sum((t - b * per_byte) / t**2) / np.sum(1.0 / t**2)))
        out[op] = ElementwiseProfile(
            overhead_us=round(ovh * 1e6, 4), eff=round(min(1.0, 1.0 / (per_byte * bw)), 4)
        )
    return out


def _attention_frame(df: pd.DataFrame) -> dict[str, np.ndarray]:
    import numpy as np

    tp = df["num_tensor_parallel_workers"].to_numpy()
    q = df["n_q_head"].to_numpy() // tp
    kv = np.maximum(1, df["n_kv_head"].to_numpy() // tp)
    hd = df["n_embd"].to_numpy() // df["n_q_head"].to_numpy()
    return {
        "q_heads": q,
        "head_dim": hd,
        "kv_bytes": 2 * kv * hd * 2,
        "batch": df["batch_size"].to_numpy(),
        "chunk": df["prefill_chunk_size"].to_numpy(),
        "prior": df["kv_cache_size"].to_numpy(),
        "block_size": df["block_size"].to_numpy(),
        "prefill": df["is_prefill"].to_numpy(dtype=bool),
    }


def fit_attention(gpu: GpuSpec, frames: list[pd.DataFrame]) -> AttentionProfile:
    import numpy as np

    bw, peak = gpu.hbm_bytes_per_s, gpu.flops_per_s
    indirection = 2.0
    best: tuple[float, AttentionProfile] | None = None
    for q_tile in (16, 32, 64, 128):
        pre_t, pre_fp, pre_fc, dec_t, dec_b, dec_bytes = [], [], [], [], [], []
        for df in frames:
            a = _attention_frame(df)
            pre = a["prefill"]
            per_pair = 4.0 * a["q_heads"] * a["head_dim"]
            q_pad = np.ceil(a["chunk"] / q_tile) * q_tile
            pre_t.append(_median_ms(df, "attn_prefill")[pre] * 1e-3)
            pre_fp.append((per_pair * q_pad * a["prior"] / peak)[pre])
            pre_fc.append((0.5 * per_pair * q_pad * a["chunk"] / peak)[pre])
            dec = ~pre
            dec_t.append(_median_ms(df, "attn_decode")[dec] * 1e-3)
            dec_b.append(a["batch"][dec].astype(float))
            ctx = a["batch"] * (a["prior"] + 1.0)
            dec_bytes.append((ctx * a["kv_bytes"] * (1 + indirection / a["block_size"]) / bw)[dec])
        t, fp, fc = (np.concatenate(x) for x in (pre_t, pre_fp, pre_fc))
        c0, cp, cc = _weighted_nonneg_lstsq([np.ones_like(t), fp, fc], t)
        cp, cc = max(cp, 1.0), max(cc, 1.0)  # efficiency at most 1
        pred = c0 + cp * fp + cc * fc
        err = float(np.mean(np.log(pred / t) ** 2))
        td, b, byt = (np.concatenate(x) for x in (dec_t, dec_b, dec_bytes))
        d0, d1, d2 = _weighted_nonneg_lstsq([np.ones_like(td), b, byt], td)
        prof = AttentionProfile(
            prefill_overhead_us=round(c0 * 1e6, 4),
            prefill_prefix_eff=round(1.0 / cp, 4),
            prefill_causal_eff=round(1.0 / cc, 4),
            q_tile=q_tile,
            decode_overhead_us=round(d0 * 1e6, 4),
            decode_per_seq_us=round(d1 * 1e6, 5),
            decode_eff=round(min(1.0, 1.0 / max(d2, 1e-9)), 4),
            block_indirection_tokens=indirection,
        )
        if best is None or err < best[0]:
            best = (err, prof)
    assert best is not None
    return best[1]


def fit_profile(
    gpu_name: str, reference: Path, attention_from: GpuProfile | None = None
) -> GpuProfile:
    gpu = get_gpu(gpu_name)
    sources = FIT_SOURCES[gpu.name]
    mlp = [_read(reference / f) for f in sources["mlp"]]
    att_files = sources["attention"]
    if att_files:
        attention = fit_attention(gpu, [_read(reference / f) for f in att_files])
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
    gpu = get_gpu(gpu_name)
    note = (
        f"Not measured: the {base.gpu.name} profile's efficiencies and overheads applied "
        f"to the {gpu.name} datasheet figures (bandwidth, peak FLOP/s, links), i.e. scaled "
        "by datasheet ratios."
    )
    return replace(base, gpu=gpu, note=note)


# -- errors --------------------------------------------------------------------------------
def _summarise(file: str, op: str, rows: list[tuple[str, float]]) -> list[ErrorRow]:
    import numpy as np

    out = []
    names = list(dict.fromkeys(name for name, _ in rows))
    for name in names:
        errs = np.array([e for n, e in rows if n == name]) * 100
        out.append(
            ErrorRow(
                file,
                op,
                name,
                len(errs),
                round(float(np.median(errs)), 1),
                round(float(np.percentile(errs, 90)), 1),
            )
        )
    return out


def _range_name(value: int, ranges: tuple[tuple[int, int], ...], unit: str) -> str | None:
    for lo, hi in ranges:
        if lo <= value <= hi:
            return f"{lo}–{hi} {unit}"
    return None


def mlp_errors(profile: GpuProfile, path: Path) -> list[ErrorRow]:
    df = _read(path)
    s = _mlp_shapes(df)
    bw, peak = profile.gpu.hbm_bytes_per_s, profile.gpu.flops_per_s
    out: list[ErrorRow] = []
    columns = {**{c: op for c, op in LINEAR_OPS.items()}, **ELEMENTWISE_COLUMNS}
    layer_pred = [0.0] * len(df)
    layer_meas = [0.0] * len(df)
    for column, op in columns.items():
        meas = _median_ms(df, column) * 1e-3
        rows: list[tuple[str, float]] = []
        for i in range(len(df)):
            m = int(s["m"][i])
            if meas[i] <= 0:
                continue
            if column in LINEAR_OPS:
                k, n = (int(v[i]) for v in _gemm_dims(s, op))
                pred = gemm_seconds(profile.linear, bw, peak, m, k, n)
            else:
                nbytes = elementwise_bytes(
                    op, m, int(s["hidden"][i]), int(s["qk_dim"][i]), int(s["ffn"][i])
                )
                pred = elementwise_seconds(profile.elementwise[op], bw, nbytes)
            if op != "embed":
                layer_pred[i] += pred
                layer_meas[i] += meas[i]
            name = _range_name(m, TOKEN_RANGES, "tokens")
            if name:
                rows.append((name, abs(pred / meas[i] - 1)))
        out += _summarise(path.name, column, sorted(rows, key=_range_start))
    layer = [
        (name, abs(p / q - 1))
        for i, (p, q) in enumerate(zip(layer_pred, layer_meas, strict=True))
        if q > 0 and (name := _range_name(int(s["m"][i]), TOKEN_RANGES, "tokens"))
    ]
    return out + _summarise(
        path.name, "layer (all ops above but emb)", sorted(layer, key=_range_start)
    )


def _range_start(row: tuple[str, float]) -> int:
    return int(row[0].split("–")[0])


def attention_errors(profile: GpuProfile, path: Path) -> list[ErrorRow]:
    df = _read(path)
    a = _attention_frame(df)
    att, bw, peak = profile.attention, profile.gpu.hbm_bytes_per_s, profile.gpu.flops_per_s
    pre_meas = _median_ms(df, "attn_prefill") * 1e-3
    dec_meas = _median_ms(df, "attn_decode") * 1e-3
    pre_rows: list[tuple[str, float]] = []
    dec_rows: list[tuple[str, float]] = []
    for i in range(len(df)):
        q, hd, kvb = int(a["q_heads"][i]), int(a["head_dim"][i]), int(a["kv_bytes"][i])
        if a["prefill"][i]:
            chunk, prior = int(a["chunk"][i]), int(a["prior"][i])
            pred = att.prefill_overhead_us * 1e-6 + prefill_attention_seconds(
                att, bw, peak, chunk, prior, q, hd, kvb
            )
            name = _range_name(chunk, CHUNK_RANGES, "chunk tokens")
            if name:
                pre_rows.append((name, abs(pred / pre_meas[i] - 1)))
        else:
            batch = int(a["batch"][i])
            pred = decode_attention_seconds(
                att, bw, batch, batch * (int(a["prior"][i]) + 1), kvb, int(a["block_size"][i])
            )
            name = _range_name(batch, BATCH_RANGES, "sequences")
            if name:
                dec_rows.append((name, abs(pred / dec_meas[i] - 1)))

    return _summarise(path.name, "attn_prefill", sorted(pre_rows, key=_range_start)) + _summarise(
        path.name, "attn_decode", sorted(dec_rows, key=_range_start)
    )


def profile_errors(profile: GpuProfile, reference: Path) -> list[ErrorRow]:
    sources = FIT_SOURCES[profile.gpu.name]
    rows: list[ErrorRow] = []
    for f in sources["mlp"]:
        rows += mlp_errors(profile, reference / f)
    for f in sources["attention"]:
        rows += attention_errors(profile, reference / f)
    return rows


def errors_markdown(rows: list[ErrorRow]) -> str:
    """One table per reference file: ops down, ranges across, ``median / p90`` abs. error."""
    out = []
    for file in dict.fromkeys(r.file for r in rows):
        mine = [r for r in rows if r.file == file]
        ranges = list(dict.fromkeys(r.range_name for r in mine))
        cells = {(r.op, r.range_name): f"{r.median_pct:.1f} / {r.p90_pct:.1f}" for r in mine}
        out.append(f"`{file}` (median / p90 absolute error, %):\n")
        out.append("| op | " + " | ".join(ranges) + " |")
        out.append("|---|" + "---:|" * len(ranges))
        for op in dict.fromkeys(r.op for r in mine):
            out.append(f"| {op} | " + " | ".join(cells.get((op, x), "") for x in ranges) + " |")
        out.append("")
    return "\n".join(out)


# -- command line --------------------------------------------------------------------------
def _write(profile: GpuProfile, out_dir: Path, extra: dict[str, Any]) -> Path:
    data = {**profile.to_dict(), **extra}
    profile_from_dict(data, "fitted profile")  # validates the constants before shipping
    path = out_dir / f"{profile.gpu.name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def fit_all(reference: Path, out_dir: Path) -> list[Path]:
    a100 = fit_profile("a100-80g", reference)
    h100 = fit_profile("h100", reference, attention_from=a100)
    fitted = {"a100-80g": a100, "h100": h100}
    written = []
    for name, prof in fitted.items():
        errors = profile_errors(prof, reference)
        summary = {f"{r.file}:{r.op}:{r.range_name}": r.p90_pct for r in errors}
        written.append(
            _write(
                prof, out_dir, {"fitted_from": FIT_SOURCES[name], "fit_p90_abs_error_pct": summary}
            )
        )
    for name, base in DERIVED_FROM.items():
        written.append(_write(derive_profile(fitted[base], name), out_dir, {"derived_from": base}))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slotune.engine.sim.calibration")
    parser.add_argument("command", choices=["fit", "report"])
    parser.add_argument(
        "--reference",
        type=Path,
        default=DEFAULT_REFERENCE,
        help="folder with the reference *_mlp.csv and *_attention.csv files",
    )
    parser.add_argument("--out", type=Path, default=PROFILE_DIR, help="where fit writes profiles")
    args = parser.parse_args(argv)
    if not args.reference.is_dir():
        print(f"reference folder {args.reference} not found; pass --reference", file=sys.stderr)
        return 2
    if args.command == "fit":
        for path in fit_all(args.reference, args.out):
            print(f"wrote {path}")
        return 0
    for name in FIT_SOURCES:
        print(f"\n### {name}\n")
        print(errors_markdown(profile_errors(load_profile(name), args.reference)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
