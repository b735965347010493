"""The report's what-if section: what slotune's own policies would gain on the
recommendation, for a target engine that does not run them (``tuner.what_if``)."""

from __future__ import annotations

from typing import Any

from slotune.reports import fmt
from slotune.reports.html import note, table

_COLUMNS = (
    ("SLO attainment", "slo_attainment", fmt.pct),
    ("goodput (req/s)", "goodput", fmt.num),
    ("TTFT p99", "ttft_p99_ms", fmt.ms),
    ("TPOT p99", "tpot_p99_ms", fmt.ms),
)


def _points(after: Any, before: Any) -> str:
    if not (fmt.is_number(after) and fmt.is_number(before)):
        return fmt.NA
    return f"{100 * (after - before):+.1f} points"


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={fmt.text(v)}" for k, v in settings.items())


def what_if_sentence(data: dict[str, Any]) -> str:
    """One sentence: the policy that gains most attainment, with its numbers."""
    base = data.get("base") or {}
    ran = [p for p in data.get("policies", []) if "scores" in p]
    if not ran:
        return f"{data.get('target')} runs none of slotune's policies; none could be tried."

    def gain(p: dict[str, Any]) -> float:
        value, before = p["scores"].get("slo_attainment"), base.get("slo_attainment")
        return value - before if fmt.is_number(value) and fmt.is_number(before) else -1.0

    top = max(ran, key=gain)
    s = top["scores"]
    points = _points(s.get("slo_attainment"), base.get("slo_attainment"))
    lead = f"{data.get('target')} does not run {len(ran)} of slotune's scheduling policies. "
    if gain(top) <= 0:
        return (
            lead + "None of them would raise the recommended configuration's SLO attainment "
            f"({fmt.pct(base.get('slo_attainment'))}) at this load (simulated)."
        )
    return (
        lead + f"With {top['name']}, the recommended configuration would reach "
        f"{fmt.pct(s.get('slo_attainment'))} SLO attainment instead of "
        f"{fmt.pct(base.get('slo_attainment'))} ({points}), "
        f"TPOT p99 {fmt.ms(s.get('tpot_p99_ms'))} instead of {fmt.ms(base.get('tpot_p99_ms'))} "
        "(simulated, same load)."
    )


def what_if_html(best: dict[str, Any]) -> str | None:
    """The section's body, or None when the study has no what-if (target slotune, real
    engine, or an older study)."""
    data = best.get("what_if")
    if not isinstance(data, dict):
        return None
    base = data.get("base") or {}
    tiers = sorted(
        {t for p in data.get("policies", []) for t in (p.get("scores") or {}).get("tiers", {})},
        key=int,
    )
    headers = [
        "policy",
        "settings",
        *[c for c, _, _ in _COLUMNS],
        *[f"tier {t} attainment" for t in tiers],
    ]
    rows: list[list[Any]] = [
        [
            f"as recommended ({data.get('target')})",
            "—",
            *[show(base.get(key)) for _, key, show in _COLUMNS],
            *[fmt.pct((base.get("tiers") or {}).get(t)) for t in tiers],
        ]
    ]
    for p in data.get("policies", []):
        s = p.get("scores")
        if s is None:
            rows.append(
                [
                    p["name"],
                    f"not run: {p.get('skipped')}",
                    *[fmt.NA] * (len(_COLUMNS) + len(tiers)),
                ]
            )
            continue
        same = " (no preemption: the same run)" if p.get("same") else ""
        rows.append(
            [
                p["name"] + same,
                _settings(p.get("settings") or {}),
                *[show(s.get(key)) for _, key, show in _COLUMNS],
                *[fmt.pct((s.get("tiers") or {}).get(t)) for t in tiers],
            ]
        )
    return (
        note(what_if_sentence(data))
        + table(headers, rows, css="metrics")
        + note(
            "Each row reruns the recommended configuration with one of slotune's policies "
            "switched on, on the embedded engine's simulator at the report's load: what an "
            "engine that had the policy would gain."
        )
    )
