"""The error of a profile against the reference kernel times, by op and size range."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slotune.calibration.readers import (
    ELEMENTWISE_COLUMNS,
    FIT_SOURCES,
    LINEAR_OPS,
    attention_frame,
    gemm_dims,
    median_seconds,
    mlp_shapes,
    read_reference,
)
from slotune.engine.sim.cost_model import (
    decode_attention_seconds,
    elementwise_bytes,
    elementwise_seconds,
    gemm_seconds,
    prefill_attention_seconds,
)
from slotune.engine.sim.profile import GpuProfile

TOKEN_RANGES = ((1, 64), (65, 512), (513, 4096), (4097, 32768))
BATCH_RANGES = ((1, 16), (17, 64), (65, 128))
CHUNK_RANGES = ((64, 512), (513, 1024), (1025, 4096))
LAYER = "layer (all ops above but emb)"


@dataclass(frozen=True)
class ErrorRow:
    """|predicted / measured − 1| of one op over one size range of one file, in %."""

    file: str
    op: str
    range_name: str
    count: int
    median_pct: float
    p90_pct: float


def _summarise(file: str, op: str, rows: list[tuple[str, float]]) -> list[ErrorRow]:
    import numpy as np

    out = []
    rows = sorted(rows, key=lambda row: int(row[0].split("–")[0]))
    for name in dict.fromkeys(name for name, _ in rows):
        errs = np.array([e for n, e in rows if n == name]) * 100
        median, p90 = float(np.median(errs)), float(np.percentile(errs, 90))
        out.append(ErrorRow(file, op, name, len(errs), round(median, 1), round(p90, 1)))
    return out


def _range_name(value: int, ranges: tuple[tuple[int, int], ...], unit: str) -> str | None:
    for lo, hi in ranges:
        if lo <= value <= hi:
            return f"{lo}–{hi} {unit}"
    return None


def mlp_errors(profile: GpuProfile, path: Path) -> list[ErrorRow]:
    """Each linear and memory-bound op of an ``*_mlp.csv``, and their sum per row."""
    df = read_reference(path)
    s = mlp_shapes(df)
    bw, peak = profile.gpu.hbm_bytes_per_s, profile.gpu.flops_per_s
    out: list[ErrorRow] = []
    layer_pred = [0.0] * len(df)
    layer_meas = [0.0] * len(df)
    for column, op in {**LINEAR_OPS, **ELEMENTWISE_COLUMNS}.items():
        meas = median_seconds(df, column)
        rows: list[tuple[str, float]] = []
        for i in range(len(df)):
            m = int(s["m"][i])
            if meas[i] <= 0:
                continue
            if column in LINEAR_OPS:
                k, n = (int(v[i]) for v in gemm_dims(s, op))
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
        out += _summarise(path.name, column, rows)
    layer = [
        (name, abs(p / q - 1))
        for i, (p, q) in enumerate(zip(layer_pred, layer_meas, strict=True))
        if q > 0 and (name := _range_name(int(s["m"][i]), TOKEN_RANGES, "tokens"))
    ]
    return out + _summarise(path.name, LAYER, layer)


def attention_errors(profile: GpuProfile, path: Path) -> list[ErrorRow]:
    """Prefill attention by chunk size and decode attention by batch size."""
    df = read_reference(path)
    a = attention_frame(df)
    att, bw, peak = profile.attention, profile.gpu.hbm_bytes_per_s, profile.gpu.flops_per_s
    pre_meas = median_seconds(df, "attn_prefill")
    dec_meas = median_seconds(df, "attn_decode")
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
    return _summarise(path.name, "attn_prefill", pre_rows) + _summarise(
        path.name, "attn_decode", dec_rows
    )


def profile_errors(profile: GpuProfile, reference: Path) -> list[ErrorRow]:
    """The errors against every reference file the profile of that GPU is fitted to."""
    sources = FIT_SOURCES[profile.gpu.name]
    rows: list[ErrorRow] = []
    for f in sources["mlp"]:
        rows += mlp_errors(profile, reference / f)
    for f in sources["attention"]:
        rows += attention_errors(profile, reference / f)
    return rows
