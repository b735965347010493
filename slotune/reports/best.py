"""Reading ``best.json`` defensively: every optional key may be missing."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.reports.fmt import is_number

CONFIG_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EngineConfig))


def section(best: dict[str, Any], key: str) -> dict[str, Any]:
    value = best.get(key)
    return value if isinstance(value, dict) else {}


def slo_text(best: dict[str, Any]) -> str | None:
    slo = best.get("slo")
    if isinstance(slo, str) and slo.strip():
        return slo.strip()
    if isinstance(slo, dict):
        targets = _targets_from_mapping(slo)
        return ",".join(f"{k}={v:g}ms" for k, v in targets.items()) or None
    return None


def slo_targets_ms(best: dict[str, Any]) -> dict[str, float]:
    """SLO thresholds in milliseconds keyed by metric (``ttft``, ``tpot``, ``itl``, ``e2e``).

    Uses a parsed form when ``best.json`` carries one (``slo_targets``/``slo_parsed``, or
    ``slo`` as ``SLO.to_dict()`` writes it), else parses the SLO text with the workloads'
    parser; an unreadable SLO gives no targets (the report then draws no SLO lines).
    """
    for key in ("slo_targets", "slo_parsed", "slo"):
        parsed = best.get(key)
        if isinstance(parsed, dict):
            return _targets_from_mapping(parsed)
    text = slo_text(best)
    if not text:
        return {}
    from slotune.workloads.slo import parse_slo

    try:
        slo = parse_slo(text)
    except ValueError:
        return {}
    return {t.metric: t.threshold_ms for t in slo.targets}


def _targets_from_mapping(parsed: dict[str, Any]) -> dict[str, float]:
    targets: dict[str, float] = {}
    for name, value in parsed.items():
        if isinstance(value, dict):
            value = value.get("threshold_ms")
        if is_number(value):
            targets[str(name).lower().removesuffix("_ms")] = float(value)
    return targets
