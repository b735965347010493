"""Per-run and overall error tables of replays against measured runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from slotune.validate.replay import METRICS, STATS, Replay


def run_row(rp: Replay, window: tuple[float, float] | None = None) -> dict[str, Any]:
    """One run's predicted, measured and error (``predicted / measured − 1``) of every
    metric and statistic, plus output throughput and whether the replay saturated."""
    st = rp.stats(window)
    row: dict[str, Any] = {"run": rp.run.name, "stack": rp.stack, "profile": rp.profile}
    for m in METRICS:
        for s in STATS:
            for kind in ("pred", "meas", "err"):
                row[f"{m}_{s}_{kind}"] = st[m][f"{kind}_{s}"]
    row["throughput_pred"], row["throughput_meas"] = rp.throughputs(window)
    row["throughput_err"] = row["throughput_pred"] / row["throughput_meas"] - 1
    row["requests"] = int(st["requests"]["count"])
    row["saturated"] = bool(rp.saturated())
    return row


def overall(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean absolute error (%) per metric and statistic over the rows, and the median."""
    out: dict[str, float] = {}
    keys = [k for k in rows[0] if k.endswith("_err")] if rows else []
    for k in keys:
        vals = np.abs(np.array([r[k] for r in rows], dtype=float)) * 100
        out[f"{k[:-4]}_mae_pct"] = float(np.nanmean(vals))
        out[f"{k[:-4]}_median_ae_pct"] = float(np.nanmedian(vals))
    out["runs"] = float(len(rows))
    out["saturated_runs"] = float(sum(r["saturated"] for r in rows))
    return out


def markdown_table(rows: Sequence[dict[str, Any]], blis: dict[str, dict[str, float]]) -> str:
    """The per-run table of ``docs/BENCHMARKS.md``: mean TTFT, ITL, E2E errors (%) with
    BLIS's published error on the same run where there is one."""
    head = (
        "| run | TTFT meas / pred ms | TTFT err | ITL meas / pred ms | ITL err | "
        "E2E meas / pred s | E2E err | BLIS E2E / TTFT / ITL err |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        b = blis.get(r["run"])
        btxt = (
            f"{b['e2e_mean_err_pct']:+.1f} / {b['ttft_mean_err_pct']:+.1f} / "
            f"{b['itl_mean_err_pct']:+.1f}"
            if b
            else ""
        )
        lines.append(
            f"| {r['run']} | {r['ttft_mean_meas'] * 1e3:.1f} / {r['ttft_mean_pred'] * 1e3:.1f} | "
            f"{r['ttft_mean_err'] * 100:+.1f} % | "
            f"{r['itl_mean_meas'] * 1e3:.2f} / {r['itl_mean_pred'] * 1e3:.2f} | "
            f"{r['itl_mean_err'] * 100:+.1f} % | "
            f"{r['e2e_mean_meas']:.3f} / {r['e2e_mean_pred']:.3f} | "
            f"{r['e2e_mean_err'] * 100:+.1f} % | {btxt} |"
        )
    return head + "\n".join(lines) + "\n"
