"""The report's section on ``tune --verify``: predicted against measured per configuration."""

from __future__ import annotations

from typing import Any

from slotune.reports import fmt
from slotune.reports.html import note, table

_QUANTITIES = (
    ("TTFT p99 (ms)", "ttft_p99_ms"),
    ("TPOT p99 (ms)", "tpot_p99_ms"),
    ("goodput (req/s)", "goodput"),
    ("score", "score"),
)


def _mean(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def _pair(predicted: float | None, runs: list[dict[str, Any]], key: str) -> str:
    measured = [r[key] for r in runs if r.get(key) is not None]
    text = f"{fmt.num(predicted)} / {fmt.num(_mean(runs, key))}"
    if len(measured) > 1:
        text += f" [{fmt.num(min(measured))}–{fmt.num(max(measured))}]"
    return text


def verify_html(best: dict[str, Any]) -> str | None:
    """The section's body, or None when the study was not verified."""
    v = best.get("verify")
    if not isinstance(v, dict):
        return None
    rows = []
    for c in v.get("candidates", []):
        runs = c.get("measured") or []
        result = c.get("error") or ("recommended" if c["label"] == v.get("winner") else "")
        cells = [_pair(c["predicted"].get(key), runs, key) for _, key in _QUANTITIES]
        rows.append([c["label"], *cells, result])
    headers = ["configuration", *(f"{h}: simulated / measured" for h, _ in _QUANTITIES), ""]
    rho = v.get("rank_correlation")
    summary = (
        f"Simulated order {', '.join(v.get('simulated_order', []))}; measured order "
        f"{', '.join(v.get('measured_order', [])) or '(nothing measured)'}; Spearman rank "
        f"correlation {'-' if rho is None else f'{rho:.2f}'} (ranked by {v.get('primary')}). "
        f"{v.get('note', '')}."
    )
    return note(summary) + table(headers, rows, css="metrics")
