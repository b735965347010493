"""Figures of the search: history, importances, slices, contour and Pareto front.

Each builder takes ``TrialsData`` and returns a plotly figure, or ``None`` when the study
holds nothing to draw. Feasible trials are blue dots, infeasible ones grey crosses.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from slotune.reports.style import BEST_LINE, FEASIBLE, INFEASIBLE, RECOMMENDED, finish
from slotune.reports.trials import TrialsData

_GRID = 48


def _hover(frame: pd.DataFrame, params: tuple[str, ...]) -> list[str]:
    lines = []
    for _, row in frame.iterrows():
        parts = [f"trial {row['number']}"]
        parts += [f"{p}={row.get(f'params_{p}')}" for p in params if f"params_{p}" in row]
        lines.append("<br>".join(parts))
    return lines


def _split(trials: TrialsData) -> tuple[pd.DataFrame, pd.DataFrame]:
    done = trials.completed
    feasible = done["feasible"].astype(bool)
    return done[feasible], done[~feasible]


def _points(
    fig: go.Figure,
    trials: TrialsData,
    x: str,
    y: str,
    row: int | None = None,
    col: int | None = None,
    *,
    legend: bool = True,
) -> None:
    """Feasible and infeasible trials; a trial without ``x`` (a conditional parameter it
    never sampled) or ``y`` is left out."""
    feasible, infeasible = _split(trials)
    for frame, name, color, symbol in (
        (feasible, "feasible", FEASIBLE, "circle"),
        (infeasible, "infeasible", INFEASIBLE, "x"),
    ):
        frame = frame.dropna(subset=[x, y])
        if frame.empty:
            continue
        fig.add_trace(
            go.Scatter(
                x=frame[x].tolist(),
                y=frame[y].tolist(),
                mode="markers",
                name=name,
                legendgroup=name,
                showlegend=legend,
                marker={"color": color, "symbol": symbol, "size": 7, "opacity": 0.8},
                text=_hover(frame, trials.param_names),
                hovertemplate="%{text}<br>%{y:.4g}<extra></extra>",
            ),
            row=row,
            col=col,
        )


def _mark_recommended(
    fig: go.Figure,
    trials: TrialsData,
    x: str,
    y: str,
    row: int | None = None,
    col: int | None = None,
    *,
    legend: bool = True,
) -> None:
    done = trials.completed
    chosen = done[done["number"] == trials.recommended]
    if trials.recommended is None or chosen.empty:
        return
    fig.add_trace(
        go.Scatter(
            x=chosen[x].tolist(),
            y=chosen[y].tolist(),
            mode="markers",
            name=f"recommended (trial {trials.recommended})",
            legendgroup="recommended",
            showlegend=legend,
            marker={
                "color": RECOMMENDED,
                "symbol": "star",
                "size": 16,
                "line": {"color": "#111827", "width": 1},
            },
            hovertemplate=f"recommended: trial {trials.recommended}<br>%{{y:.4g}}<extra></extra>",
        ),
        row=row,
        col=col,
    )


# The unit of an objective on an axis (the others are scores without one).
_OBJECTIVE_UNITS = {"goodput": "req/s"}


def objective_label(name: str, direction: str | None = None) -> str:
    """``goodput (req/s, maximize)``: an objective's axis title with its unit."""
    extra = [x for x in (_OBJECTIVE_UNITS.get(name), direction) if x]
    return f"{name} ({', '.join(extra)})" if extra else name


def _best_so_far(frame: pd.DataFrame, column: str, direction: str) -> pd.Series:
    values = frame[column].where(frame["feasible"].astype(bool))
    return values.cummax() if direction == "maximize" else values.cummin()


def history_figure(trials: TrialsData) -> go.Figure | None:
    """Objective value by trial number with the best feasible value so far."""
    done = trials.completed.sort_values("number")
    if done.empty:
        return None
    n = len(trials.objective_names)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for i, (name, direction) in enumerate(
        zip(trials.objective_names, trials.directions, strict=True)
    ):
        column = f"value_{i}"
        _points(fig, trials, "number", column, row=i + 1, col=1, legend=i == 0)
        best = _best_so_far(done, column, direction)
        fig.add_trace(
            go.Scatter(
                x=done["number"].tolist(),
                y=best.tolist(),
                mode="lines",
                line={"color": BEST_LINE, "shape": "hv", "width": 2},
                name="best feasible so far",
                legendgroup="best",
                showlegend=i == 0,
                connectgaps=True,
            ),
            row=i + 1,
            col=1,
        )
        _mark_recommended(fig, trials, "number", column, row=i + 1, col=1, legend=i == 0)
        fig.update_yaxes(title_text=objective_label(name, direction), row=i + 1, col=1)
    fig.update_xaxes(title_text="trial", row=n, col=1)
    return finish(fig, "Optimization history", height=320 + 180 * (n - 1))


def importance_figure(trials: TrialsData) -> go.Figure | None:
    if not trials.importances:
        return None
    items = sorted(trials.importances.items(), key=lambda kv: kv[1])
    fig = go.Figure(
        go.Bar(
            x=[v for _, v in items],
            y=[k for k, _ in items],
            orientation="h",
            marker={"color": FEASIBLE},
            text=[f"{v:.2f}" for _, v in items],
            textposition="auto",
            hovertemplate="%{y}: %{x:.3f}<extra></extra>",
        )
    )
    target = trials.objective_names[0] if trials.objective_names else "objective"
    fig.update_xaxes(title_text=f"importance for {target} (Optuna PED-ANOVA, sums to 1)")
    return finish(fig, "Parameter importances", height=120 + 34 * len(items))


def top_params(trials: TrialsData, k: int = 2) -> list[str]:
    """The ``k`` most important parameters; by number of distinct values without importances."""
    if trials.importances:
        ranked = sorted(trials.importances, key=lambda p: -trials.importances[p])
    else:
        done = trials.completed
        ranked = sorted(
            trials.param_names,
            key=lambda p: -done[f"params_{p}"].nunique() if f"params_{p}" in done else 0,
        )
    return ranked[:k]


def slice_figure(trials: TrialsData, params: list[str]) -> go.Figure | None:
    """The first objective against each of ``params``."""
    params = [p for p in params if f"params_{p}" in trials.frame]
    if trials.completed.empty or not params or not trials.objective_names:
        return None
    fig = make_subplots(rows=1, cols=len(params), shared_yaxes=True, horizontal_spacing=0.06)
    for j, param in enumerate(params):
        _points(fig, trials, f"params_{param}", "value_0", row=1, col=j + 1, legend=j == 0)
        fig.update_xaxes(title_text=param, row=1, col=j + 1, **_axis_kind(trials, param))
    fig.update_yaxes(title_text=objective_label(trials.objective_names[0]), row=1, col=1)
    return finish(fig, "Slices of the most important parameters")


def _numeric(series: pd.Series) -> np.ndarray | None:
    values = pd.to_numeric(series, errors="coerce")
    if values.isna().any():
        return None
    return values.to_numpy(dtype=float)


def _is_log(values: np.ndarray) -> bool:
    return bool(values.min() > 0 and values.max() / values.min() >= 20)


def _axis_kind(trials: TrialsData, param: str) -> dict[str, Any]:
    values = _numeric(trials.completed[f"params_{param}"])
    if values is None or values.size == 0:
        return {"type": "category"}
    if not _is_log(values):
        return {}
    ticks = log_ticks(float(values.min()), float(values.max()))
    return {"type": "log", "tickvals": ticks, "ticktext": [_tick(v) for v in ticks]}


def log_ticks(low: float, high: float) -> list[float]:
    """Ticks of a log axis over [low, high] at 1, 2 and 5 times the powers of ten (1, 2,
    5 ... only 1 and 10s over more than three decades), every one labelled in full:
    plotly's own labels the minor ticks with their first digit ("7 8 9 10 2 3")."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    steps = (1.0,) if last - first > 3 else (1.0, 2.0, 5.0)
    ticks = [m * 10.0**k for k in range(first, last + 1) for m in steps]
    inside = [t for t in ticks if low / 1.5 <= t <= high * 1.5]
    return inside or [low, high]


def _coords(series: pd.Series) -> tuple[np.ndarray, dict[str, object]]:
    """Positions in [0, 1] for interpolation, and the axis settings to show them."""
    values = _numeric(series)
    if values is None or np.unique(values).size < 3:
        labels = sorted({str(v) for v in series}, key=_natural)
        index = {label: i for i, label in enumerate(labels)}
        pos = np.array([index[str(v)] for v in series], dtype=float)
        last = max(len(labels) - 1, 1)
        axis = {"tickvals": [i / last for i in range(len(labels))], "ticktext": labels}
        return pos / last, axis
    log = _is_log(values)
    scaled = np.log(values) if log else values
    low, high = scaled.min(), scaled.max()
    span = (high - low) or 1.0
    ticks = np.linspace(low, high, 5)
    shown = np.exp(ticks) if log else ticks
    axis = {"tickvals": ((ticks - low) / span).tolist(), "ticktext": [_tick(v) for v in shown]}
    return (scaled - low) / span, axis


def _tick(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _natural(label: str) -> tuple[int, float, str]:
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def _interpolate(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Inverse-distance-weighted surface on a regular grid over [0, 1]²."""
    grid = np.linspace(0.0, 1.0, _GRID)
    gx, gy = np.meshgrid(grid, grid)
    d2 = (gx[..., None] - x) ** 2 + (gy[..., None] - y) ** 2
    weights = 1.0 / np.maximum(d2, 1e-9)
    return (weights * z).sum(axis=-1) / weights.sum(axis=-1)


def contour_figure(trials: TrialsData, params: list[str]) -> go.Figure | None:
    """The first objective over the two given parameters, interpolated between trials."""
    if len(params) < 2 or not trials.objective_names:
        return None
    px, py = (f"params_{p}" for p in params[:2])
    if px not in trials.frame or py not in trials.frame:
        return None
    done = trials.completed.dropna(subset=["value_0", px, py])
    if len(done) < 3:
        return None
    x, x_axis = _coords(done[px])
    y, y_axis = _coords(done[py])
    z = _interpolate(x, y, done["value_0"].to_numpy(dtype=float))
    grid = np.linspace(0.0, 1.0, _GRID)
    fig = go.Figure(
        go.Contour(
            x=grid,
            y=grid,
            z=z,
            colorscale="Blues",
            reversescale=trials.directions[0] != "maximize",
            colorbar={"title": {"text": objective_label(trials.objective_names[0])}},
            ncontours=14,
            hoverinfo="skip",
        )
    )
    feasible = done["feasible"].astype(bool).to_numpy()
    for mask, name, color, symbol in (
        (feasible, "feasible", "#111827", "circle"),
        (~feasible, "infeasible", INFEASIBLE, "x"),
    ):
        if mask.any():
            fig.add_trace(
                go.Scatter(
                    x=x[mask],
                    y=y[mask],
                    mode="markers",
                    name=name,
                    marker={"color": color, "symbol": symbol, "size": 6},
                    text=_hover(done[mask], trials.param_names),
                    hovertemplate="%{text}<extra></extra>",
                )
            )
    fig.update_xaxes(title_text=params[0], range=[-0.03, 1.03], **x_axis)
    fig.update_yaxes(title_text=params[1], range=[-0.03, 1.03], **y_axis)
    title = f"Contour: {trials.objective_names[0]} over {params[0]} × {params[1]}"
    return finish(fig, title, height=440)


def pareto_front(points: np.ndarray, directions: tuple[str, ...]) -> np.ndarray:
    """Mask of the non-dominated rows of ``points`` (one column per objective)."""
    signs = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
    costs = points * signs
    mask = np.ones(len(costs), dtype=bool)
    for i, c in enumerate(costs):
        dominated = np.all(costs <= c, axis=1) & np.any(costs < c, axis=1)
        mask[i] = not dominated.any()
    return mask


def pareto_figure(trials: TrialsData) -> go.Figure | None:
    """The first two objectives of a multi-objective study, front among feasible trials."""
    if len(trials.objective_names) < 2:
        return None
    feasible, infeasible = _split(trials)
    feasible = feasible.dropna(subset=["value_0", "value_1"])
    if feasible.empty and infeasible.empty:
        return None
    fig = go.Figure()
    _points(fig, trials, "value_0", "value_1")
    if not feasible.empty:
        points = feasible[["value_0", "value_1"]].to_numpy(dtype=float)
        front = feasible[pareto_front(points, trials.directions[:2])].sort_values("value_0")
        fig.add_trace(
            go.Scatter(
                x=front["value_0"].tolist(),
                y=front["value_1"].tolist(),
                mode="lines+markers",
                name="Pareto front (feasible)",
                line={"color": BEST_LINE, "width": 2},
                marker={"color": BEST_LINE, "size": 10, "symbol": "diamond"},
                text=_hover(front, trials.param_names),
                hovertemplate="%{text}<extra></extra>",
            )
        )
    _mark_recommended(fig, trials, "value_0", "value_1")
    fig.update_xaxes(title_text=objective_label(trials.objective_names[0], trials.directions[0]))
    fig.update_yaxes(title_text=objective_label(trials.objective_names[1], trials.directions[1]))
    return finish(fig, "Pareto front", height=420)
