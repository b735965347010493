"""Figures of how runs behaved: latency CDFs, ITL, batch composition, KV cache, queues.

Each builder takes one or more ``RunData`` (recommended first, baseline second) and
returns a plotly figure or ``None`` when the runs hold no data for it. Long runs are
reduced before plotting (CDFs to quantiles, step series to time bins) so that a report
stays small whatever the number of requests and steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from slotune.reports.runs import RunData, prefix_cache_hit_rate
from slotune.reports.style import BUDGET, DECODE, PREFILL, SLO_LINE, finish, run_color

MAX_CDF_POINTS = 300
MAX_TIME_BINS = 300
ITL_BINS = 60


def cdf_points(
    values: np.ndarray, max_points: int = MAX_CDF_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """(x, cumulative share) of the finite ``values``, at most ``max_points`` quantiles."""
    values = np.sort(values[np.isfinite(values)])
    if values.size == 0:
        return values, values
    if values.size <= max_points:
        return values, np.arange(1, values.size + 1) / values.size
    shares = np.linspace(0.0, 1.0, max_points)
    return np.quantile(values, shares), shares


def bin_steps(
    steps: pd.DataFrame, columns: list[str], how: str = "mean", max_bins: int = MAX_TIME_BINS
) -> pd.DataFrame:
    """Step columns aggregated into at most ``max_bins`` equal time bins (``time`` = bin start)."""
    data = steps.dropna(subset=["time"])
    if len(data) <= max_bins:
        return data[["time", *columns]].reset_index(drop=True)
    edges = np.linspace(data["time"].min(), data["time"].max(), max_bins + 1)
    index = np.clip(np.searchsorted(edges, data["time"], side="right") - 1, 0, max_bins - 1)
    grouped = data[columns].groupby(index).agg(how)
    grouped.insert(0, "time", edges[grouped.index])
    return grouped.reset_index(drop=True)


def _has(runs: list[RunData], frame: str, column: str) -> bool:
    return any(getattr(r, frame)[column].notna().any() for r in runs)


def _slo_marker(fig: go.Figure, slo_ms: float | None, name: str) -> None:
    if slo_ms is None:
        return
    fig.add_vline(
        x=slo_ms,
        line={"color": SLO_LINE, "dash": "dash", "width": 2},
        annotation_text=f"SLO {name} {slo_ms:g} ms",
        annotation_position="top left",
    )


def latency_cdf_figure(runs: list[RunData], metric: str, slo_ms: float | None) -> go.Figure | None:
    """CDF of a per-request latency (``ttft_ms`` or ``tpot_ms``) with the SLO marked."""
    if not _has(runs, "requests", metric):
        return None
    name = metric.removesuffix("_ms").upper()
    fig = go.Figure()
    for i, run in enumerate(runs):
        x, y = cdf_points(run.requests[metric].to_numpy(dtype=float))
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                name=run.label,
                line={"color": run_color(i), "width": 2},
                hovertemplate=f"{run.label}: %{{y:.1%}} of requests ≤ %{{x:.1f}} ms<extra></extra>",
            )
        )
    _slo_marker(fig, slo_ms, name)
    fig.update_xaxes(title_text=f"{name} (ms)", rangemode="tozero")
    fig.update_yaxes(title_text="share of requests", tickformat=".0%", range=[0, 1.02])
    return finish(fig, f"{name} distribution (CDF)")


def itl_figure(
    runs: list[RunData], slo_ms: float | None = None, slo_name: str = "ITL"
) -> go.Figure | None:
    """Histogram of inter-token latencies, shared bins up to the largest p99.5; the SLO line
    is the ITL target, or the TPOT target (the mean pace a request must keep) without one."""
    samples = [r.itl_ms[np.isfinite(r.itl_ms)] for r in runs]
    if not any(s.size for s in samples):
        return None
    high = max(float(np.percentile(s, 99.5)) for s in samples if s.size)
    edges = np.linspace(0.0, high if high > 0 else 1.0, ITL_BINS + 1)
    fig = go.Figure()
    for i, (run, values) in enumerate(zip(runs, samples, strict=True)):
        counts, _ = np.histogram(np.clip(values, 0, edges[-1]), bins=edges)
        share = counts / max(values.size, 1)
        fig.add_trace(
            go.Bar(
                x=(edges[:-1] + edges[1:]) / 2,
                y=share,
                width=edges[1] - edges[0],
                name=run.label,
                marker={"color": run_color(i)},
                opacity=0.6,
                hovertemplate=f"{run.label}: %{{y:.1%}} of gaps near %{{x:.1f}} ms<extra></extra>",
            )
        )
    _slo_marker(fig, slo_ms, slo_name)
    fig.update_layout(barmode="overlay", bargap=0)
    fig.update_xaxes(title_text="inter-token latency (ms; last bin holds the tail)")
    fig.update_yaxes(title_text="share of token gaps", tickformat=".0%")
    return finish(fig, "Inter-token latency (ITL) distribution")


def _side_by_side(runs: list[RunData]) -> go.Figure:
    return make_subplots(
        rows=1,
        cols=len(runs),
        shared_yaxes=True,
        horizontal_spacing=0.05,
        subplot_titles=[r.label for r in runs],
    )


def batch_figure(runs: list[RunData]) -> go.Figure | None:
    """Prefill and decode tokens per step, stacked, against each run's token budget."""
    if not _has(runs, "steps", "scheduled") and not _has(runs, "steps", "prefill"):
        return None
    fig = _side_by_side(runs)
    for j, run in enumerate(runs):
        binned = bin_steps(run.steps, ["prefill", "decode"])
        for column, name, color in (("decode", "decode", DECODE), ("prefill", "prefill", PREFILL)):
            fig.add_trace(
                go.Scatter(
                    x=binned["time"],
                    y=binned[column].fillna(0),
                    name=f"{name} tokens",
                    mode="lines",
                    stackgroup=f"run{j}",
                    line={"width": 0.5, "color": color},
                    legendgroup=name,
                    showlegend=j == 0,
                    hovertemplate=f"{name}: %{{y:.0f}} tokens/step at %{{x:.1f}} s<extra></extra>",
                ),
                row=1,
                col=j + 1,
            )
        budget = run.config.get("max_num_batched_tokens")
        if isinstance(budget, (int, float)) and not run.steps.empty:
            end = float(run.steps["time"].max())
            fig.add_trace(
                go.Scatter(
                    x=[0.0, end],
                    y=[budget, budget],
                    mode="lines",
                    name="token budget",
                    line={"color": BUDGET, "dash": "dash"},
                    legendgroup="budget",
                    showlegend=j == 0,
                    hovertemplate=f"budget {budget}<extra></extra>",
                ),
                row=1,
                col=j + 1,
            )
        fig.update_xaxes(title_text="time (s)", row=1, col=j + 1)
    fig.update_yaxes(title_text="tokens per step (mean per bin)", row=1, col=1)
    return finish(fig, "Batch composition per step", height=380)


def kv_figure(runs: list[RunData], threshold: float = 0.85) -> go.Figure | None:
    if not _has(runs, "steps", "kv_usage"):
        return None
    fig = go.Figure()
    for i, run in enumerate(runs):
        binned = bin_steps(run.steps, ["kv_usage"])
        fig.add_trace(
            go.Scatter(
                x=binned["time"],
                y=binned["kv_usage"],
                mode="lines",
                name=run.label,
                line={"color": run_color(i)},
                hovertemplate=f"{run.label}: %{{y:.0%}} at %{{x:.1f}} s<extra></extra>",
            )
        )
    fig.add_hline(
        y=threshold,
        line={"color": SLO_LINE, "dash": "dot"},
        annotation_text=f"{threshold:.0%}",
        annotation_position="bottom right",
    )
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text="KV-cache blocks in use", tickformat=".0%", range=[0, 1.05])
    return finish(fig, "KV-cache usage over time")


def queue_figure(runs: list[RunData]) -> go.Figure | None:
    if not _has(runs, "steps", "running") and not _has(runs, "steps", "waiting"):
        return None
    fig = _side_by_side(runs)
    for j, run in enumerate(runs):
        binned = bin_steps(run.steps, ["running", "waiting"])
        for column, color in (("running", DECODE), ("waiting", PREFILL)):
            fig.add_trace(
                go.Scatter(
                    x=binned["time"],
                    y=binned[column],
                    mode="lines",
                    name=column,
                    line={"color": color},
                    legendgroup=column,
                    showlegend=j == 0,
                    hovertemplate=f"{column}: %{{y:.1f}} at %{{x:.1f}} s<extra></extra>",
                ),
                row=1,
                col=j + 1,
            )
        fig.update_xaxes(title_text="time (s)", row=1, col=j + 1)
    fig.update_yaxes(title_text="requests (mean per bin)", row=1, col=1)
    return finish(fig, "Running and waiting requests")


def preemption_cache_note(runs: list[RunData]) -> str | None:
    """A line of text instead of two empty charts: no run preempted a request and none
    hit the prefix cache (None when either happened, or nothing says)."""
    preempted = [r.steps["preempted"].fillna(0).sum() for r in runs if "preempted" in r.steps]
    rates = [prefix_cache_hit_rate(r) for r in runs]
    if not preempted or any(preempted) or any(r is None or r > 0 for r in rates):
        return None
    return "No request was preempted and no prompt token came from the prefix cache in " + (
        "either run." if len(runs) == 2 else "any run." if len(runs) > 2 else "the run."
    )


def preemption_cache_figure(runs: list[RunData]) -> go.Figure | None:
    """Cumulative preemptions over time, and each run's prefix-cache hit rate."""
    rates = [prefix_cache_hit_rate(r) for r in runs]
    if not _has(runs, "steps", "preempted") and all(r is None for r in rates):
        return None
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.68, 0.32],
        horizontal_spacing=0.12,
        subplot_titles=["Preemptions (cumulative)", "Prefix-cache hit rate"],
    )
    for i, run in enumerate(runs):
        if run.steps["preempted"].notna().any():
            steps = run.steps.dropna(subset=["time"]).assign(
                total=lambda s: s["preempted"].fillna(0).cumsum()
            )
            binned = bin_steps(steps, ["total"], how="max")
            fig.add_trace(
                go.Scatter(
                    x=binned["time"],
                    y=binned["total"],
                    mode="lines",
                    name=run.label,
                    line={"color": run_color(i), "shape": "hv"},
                    legendgroup=run.label,
                    hovertemplate=f"{run.label}: %{{y:.0f}} by %{{x:.1f}} s<extra></extra>",
                ),
                row=1,
                col=1,
            )
    fig.add_trace(
        go.Bar(
            x=[r.label for r in runs],
            y=[r if r is not None else 0 for r in rates],
            marker={"color": [run_color(i) for i in range(len(runs))]},
            showlegend=False,
            text=[f"{r:.0%}" if r is not None else "n/a" for r in rates],
            textposition="outside",
            cliponaxis=False,
            hovertemplate="%{x}: %{y:.1%}<extra></extra>",
        ),
        row=1,
        col=2,
    )
    fig.update_xaxes(title_text="time (s)", row=1, col=1)
    fig.update_yaxes(title_text="preemptions", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1], row=1, col=2)
    return finish(fig, "Preemptions and prefix caching")
