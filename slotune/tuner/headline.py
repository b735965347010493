"""The recommendation in one honest sentence: what changes, what drives the gain, its cost.

Drivers, read from the two runs at the report load:

- ``slo``: the defaults miss the SLO there (attainment below the target);
- ``capacity``: they meet it but preempt requests (the KV cache fills);
- ``steadiness``: they meet it for (nearly) every request, but their queue keeps growing
  (the run never settled), so the rate is not one they hold;
- ``latency``: none of those, the recommendation only has lower latency (weighted score).

Costs: a quantized KV cache trades accuracy for capacity and bandwidth.
"""

from __future__ import annotations

from typing import Any

KV_COST = {
    "fp8": "an fp8 (e4m3) KV cache stores keys and values in 8 bits: a small accuracy "
    "loss, to check on your own evaluation set",
    "int8": "an int8 KV cache stores keys and values in 8 bits: a small accuracy loss, to "
    "check on your own evaluation set",
    "int4": "a 4-bit KV cache loses more accuracy than 8-bit ones: check it on your own "
    "evaluation set before serving",
}


def drivers(best: dict[str, Any], base: dict[str, Any], attainment_target: float) -> list[str]:
    """What the baseline run at the report load lacks that the recommendation has."""
    out = []
    att = base.get("slo_attainment")
    steady = (base.get("steady_state") or {}).get("steady")
    if att is not None and att < attainment_target:
        return ["slo"]  # a run that misses the SLO is usually unsteady too: the miss says it
    if (base.get("num_preemptions") or 0) > (best.get("num_preemptions") or 0):
        out.append("capacity")
    if steady is False and (best.get("steady_state") or {}).get("steady") is not False:
        out.append("steadiness")
    return out or ["latency"]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def headline(
    *,
    target_label: str,
    changed: dict[str, Any],
    verdict: Any | None,
    best_metrics: dict[str, Any],
    base_metrics: dict[str, Any],
    attainment_target: float,
    rate: float | None,
) -> tuple[str, list[str]]:
    """The sentence and the drivers (empty when the defaults are kept)."""
    defaults = f"{target_label}'s defaults"
    if not changed:
        return f"Keep {defaults}: no configuration tried beat them.", []
    if verdict is not None and not verdict.significant:
        what = "max SLO-meeting rate" if verdict.metric == "goodput_rps" else "weighted score"
        return (
            f"Keep {defaults}: the best configuration found ({_settings(changed)}) does not "
            f"beat them beyond run-to-run noise ({what}: {_samples(verdict.best)} against "
            f"{_samples(verdict.baseline)} over seeds {', '.join(map(str, verdict.seeds))})."
        ), []
    found = drivers(best_metrics, base_metrics, attainment_target)
    at = f" at {rate:.3g} req/s" if rate else ""
    why = {
        "slo": f"{defaults} miss the SLO{at} (attainment "
        f"{_pct(base_metrics.get('slo_attainment'))}, target {_pct(attainment_target)})",
        "capacity": f"{defaults} run out of KV cache{at} "
        f"({base_metrics.get('num_preemptions')} preemptions)",
        "steadiness": f"{defaults} meet the SLO for "
        f"{_pct(base_metrics.get('slo_attainment'))} of requests{at} but their queue keeps "
        "growing (not a steady state)",
        "latency": f"lower latency than {defaults}",
    }
    gain = ""
    if verdict is not None and verdict.gain is not None:
        what = "max SLO-meeting rate" if verdict.metric == "goodput_rps" else "weighted score"
        noise = (
            "no run-to-run noise: the load draws nothing at random"
            if verdict.same_runs
            else f"beyond the noise band of {100 * verdict.band:.1f}% over seeds "
            f"{', '.join(map(str, verdict.seeds))}"
        )
        gain = f" ({what} {100 * verdict.gain:+.1f}%, {noise})"
    only = "only steadiness: " if found == ["steadiness"] else ""
    text = f"Set {_settings(changed)}{gain}. Why: {only}" + "; ".join(why[d] for d in found) + "."
    kv = changed.get("kv_cache_dtype")
    if kv in KV_COST:
        if not base_metrics.get("num_preemptions"):
            text += (
                f" The {kv} KV cache helps by reading fewer bytes per step (attention is "
                "memory-bound), not by capacity: the defaults never ran out of KV cache "
                "(no preemptions)."
            )
        text += f" Cost: {KV_COST[kv]}."
    return text, found


def _settings(changed: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changed.items())


def _samples(values: tuple[float, ...]) -> str:
    return "/".join(f"{v:.3g}" for v in values)
