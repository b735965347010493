"""Colours and the common layout of every report figure."""

from __future__ import annotations

import plotly.graph_objects as go

RUN_COLORS = ("#2563eb", "#f97316", "#10b981", "#a855f7")
FEASIBLE = "#2563eb"
INFEASIBLE = "#9ca3af"
BEST_LINE = "#dc2626"
RECOMMENDED = "#facc15"
SLO_LINE = "#dc2626"
PREFILL = "#f59e0b"
DECODE = "#3b82f6"
BUDGET = "#111827"


def run_color(index: int) -> str:
    return RUN_COLORS[index % len(RUN_COLORS)]


def finish(fig: go.Figure, title: str, height: int = 360) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 15}},
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        legend={"orientation": "h", "y": -0.18, "x": 0},
        hovermode="closest",
    )
    return fig
