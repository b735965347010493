"""Pick the recommendation and write ``best.json``, ``trials.csv`` and ``runs/``.

Selection rules: ``weighted`` takes the lowest score among trials meeting the attainment
target (the least violating one when none does); ``goodput`` the highest rate, ties broken
by the lower weighted score; ``pareto`` reports the non-dominated front (goodput up, score
down) and recommends its highest-goodput member that meets the target at the reference
load (else its highest goodput).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

from slotune.tuner.objectives import PENALTY_SCORE, total_violation
from slotune.workloads.runner.timeouts import TIMEOUT_ERROR


@dataclass(frozen=True)
class Outputs:
    best_json: Path
    trials_csv: Path
    best_run: Path
    baseline_run: Path
    best: dict[str, Any]


def finished(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if "config" in t.user_attrs
    ]


def _score(t: Any) -> float:
    value = t.user_attrs.get("score")
    return float(value) if value is not None else PENALTY_SCORE


def _goodput(t: Any) -> float:
    return float(t.user_attrs.get("goodput_value") or 0.0)


def _violation(t: Any) -> float:
    return total_violation(t.constraints)


def pareto_front(trials: list[Any]) -> list[Any]:
    """Trials no other trial beats on both goodput (higher ``goodput_value``) and score."""
    front = []
    for t in trials:
        g, s = _goodput(t), _score(t)
        dominated = any(
            _goodput(o) >= g and _score(o) <= s and (_goodput(o) > g or _score(o) < s)
            for o in trials
        )
        if not dominated:
            front.append(t)
    return sorted(front, key=lambda t: (-_goodput(t), _score(t)))


def select_best(
    trials: list[Any], objective: str, target: float, baseline: dict[str, Any] | None = None
) -> Any | None:
    """The recommendation; among equals, the one that changes fewest of ``baseline``'s
    settings (a radix cache that measures the same as hash is not worth a change)."""
    order = ranked(trials, objective, target, baseline)
    return order[0] if order else None


def ranked(
    trials: list[Any], objective: str, target: float, baseline: dict[str, Any] | None = None
) -> list[Any]:
    """The trials best first, by the rules ``select_best`` recommends with (for a pareto
    study: the front's members that meet the target, the rest of the front, then the
    others by goodput)."""

    def changes(t: Any) -> int:
        config = t.user_attrs.get("config", {})
        return sum(config.get(k) != v for k, v in (baseline or {}).items())

    if objective == "weighted":
        return sorted(trials, key=lambda t: (_violation(t), _score(t), changes(t), t.number))

    def by_goodput(t: Any) -> tuple[float, float, int, int]:
        return (-_goodput(t), _score(t), changes(t), t.number)

    if objective == "goodput":
        return sorted(trials, key=by_goodput)
    front = pareto_front(trials)
    meeting = [t for t in front if t.user_attrs.get("attainment", 0.0) >= target]
    first = sorted(meeting or front, key=by_goodput)
    rest = sorted((t for t in trials if t not in first), key=by_goodput)
    return first + rest


def trials_frame(study: Any) -> Any:
    """One row per trial: Optuna's columns (``number``, ``state``, ``value`` or
    ``values_<i>``, ``params_<name>``, ``user_attrs_feasible``), the configuration
    (``config_<field>``) and flat metrics (``ttft_ms_p99``, ``goodput``, ...)."""
    import pandas as pd

    multi = len(study.directions) > 1
    rows = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {"number": t.number, "state": t.state.name}
        if multi:
            for i in range(len(study.directions)):
                row[f"values_{i}"] = t.values[i] if t.values else math.nan
        else:
            row["value"] = t.value if t.values else math.nan
        row["duration_s"] = t.duration.total_seconds() if t.duration else math.nan
        row["user_attrs_feasible"] = t.user_attrs.get("feasible")
        for key in ("score", "attainment", "rate", "goodput_rps", "goodput_value", "reused_from"):
            if key in t.user_attrs:
                row[key] = t.user_attrs[key]
        for name, value in t.params.items():
            row[f"params_{name}"] = value
        for name, value in t.user_attrs.get("config", {}).items():
            row[f"config_{name}"] = value
        row.update(flat_metrics(t.user_attrs.get("metrics") or {}))
        rows.append(row)
    return pd.DataFrame(rows)


def flat_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """A run summary's numbers as flat columns (``ttft_ms_p99``, ``failed``, ...), plus
    ``steady`` (the steady-state check: True, False, or absent when it had nothing to
    check) and ``timeouts`` (requests the client gave up on)."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            if key.endswith("_ms"):
                for stat, v in value.items():
                    out[f"{key}_{stat}"] = v
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    steady = (summary.get("steady_state") or {}).get("steady")
    if isinstance(steady, bool):
        out["steady"] = steady
    if "failed" in summary:
        out["timeouts"] = int((summary.get("errors") or {}).get(TIMEOUT_ERROR, 0))
    return out


def write_run(
    out: Path,
    result: Any,
    summary: dict[str, Any],
    config: dict[str, Any],
    rate: float | None,
    label: str,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result.save(out)
    data = {**summary, "config": config, "rate": rate, "label": label}
    (out / "summary.json").write_text(json.dumps(data, indent=2, default=_json_default))


def _write_runs(
    writes: list[Callable[[], None]], out_dir: Path, after: Callable[[Path], object] | None
) -> None:
    for write in writes:
        write()
    if after is not None:
        after(out_dir)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def report_rate(setup: Any, best: Any, baseline: dict[str, Any]) -> float | None:
    """The load the stored runs use: the study's load, or for goodput studies the
    recommendation's goodput (where it just meets the SLO and the baseline is shown at)."""
    if setup.objective != "goodput":
        return setup.load.rate
    for rate in (
        best.user_attrs.get("goodput_rps"),
        baseline.get("goodput_rps"),
        (setup.ladder or {}).get("base"),
    ):
        if rate:
            return float(rate)
    return setup.load.rate


def write_outputs(
    *,
    out_dir: Path,
    study: Any,
    setup: Any,
    baseline: dict[str, Any],
    evaluator: Any,
    storage: str,
    after_writes: Callable[[Path], object] | None = None,
) -> Outputs:
    """Select the recommendation, rerun it and the baseline once at the report load into
    ``runs/``, and write ``trials.csv`` and ``best.json``. ``after_writes(out_dir)`` is
    called once ``runs/`` is written, while the what-if reruns may still go."""
    from slotune._version import __version__
    from slotune.engine.config import EngineConfig
    from slotune.targets import ExportRefused, get_target
    from slotune.tuner.export import command_line, launch_of
    from slotune.tuner.headline import headline
    from slotune.tuner.space import SearchSpace, describe

    trials = finished(study)
    best = select_best(trials, setup.objective, setup.attainment, baseline["config"])
    if best is None:
        raise ValueError(f"study {study.study_name!r} has no finished trial to recommend")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = get_target(setup.target)
    verdict = _verdict(setup, best, baseline, evaluator)
    keep = verdict is not None and not verdict.significant
    chosen = _KeptDefaults(baseline) if keep else best
    rate = report_rate(setup, chosen, baseline)
    runs: dict[str, dict[str, Any]] = {}
    writes: list[Callable[[], None]] = []
    for label, config_dict in (
        ("best", chosen.user_attrs["config"]),
        ("baseline", baseline["config"]),
    ):
        config = EngineConfig.from_dict(config_dict)
        result = evaluator.held_run(config, rate)  # measured in a trial: not run again
        if result is None:
            result = evaluator.run(config, rate)
        summary = evaluator.summarize(result, rate)
        path = out_dir / "runs" / label
        writes.append(partial(write_run, path, result, summary, config_dict, rate, label))
        runs[label] = {"summary": summary, "score": evaluator.measurement(summary, rate).score}
    from slotune.tuner.what_if import what_if

    best_config = EngineConfig.from_dict(chosen.user_attrs["config"])
    gains = what_if(  # the runs are written while the reruns go
        evaluator,
        target,
        best_config,
        runs["best"]["summary"],
        rate,
        meanwhile=partial(_write_runs, writes, out_dir, after_writes),
    )
    trials_csv = out_dir / "trials.csv"
    trials_frame(study).to_csv(trials_csv, index=False)
    config = EngineConfig.from_dict(chosen.user_attrs["config"])
    found = best.user_attrs["config"]
    changed = {k: v for k, v in found.items() if baseline["config"].get(k) != v}
    text, drivers = headline(  # within noise, it says so and names what was found
        target_label=target.label,
        changed=changed,
        verdict=verdict,
        best_metrics=runs["best"]["summary"],
        base_metrics=runs["baseline"]["summary"],
        attainment_target=setup.attainment,
        rate=rate,
    )
    best_dict = {**setup.to_dict(), "config": chosen.user_attrs["config"]}
    launch = launch_of(best_dict)
    try:
        command, refused = command_line(config, target, launch), None
    except ExportRefused as e:
        command, refused = None, str(e)
    data: dict[str, Any] = {
        "slotune_version": __version__,
        "date": now_iso(),
        "study_name": study.study_name,
        "storage": storage,
        "objective": setup.objective,
        "metric_names": list(study.metric_names or []),
        "directions": [d.name.lower() for d in study.directions],
        "objective_value": best.values[0] if len(best.values) == 1 else list(best.values),
        "trial": best.number,
        "feasible": bool(chosen.user_attrs.get("feasible")),
        "config": chosen.user_attrs["config"],
        "keep_defaults": keep or not changed,
        "best_found": found,
        "headline": text,
        "drivers": drivers,
        "noise": verdict.to_dict() if verdict is not None else None,
        "target": target.name,
        "metrics": runs["best"]["summary"],
        "score": runs["best"]["score"],
        "what_if": gains,
        "goodput_rps": chosen.user_attrs.get("goodput_rps"),
        "load": {
            "rate": rate,
            "description": replace(setup.load, rate=rate).describe(),
            "duration_s": setup.load.duration_s,
        },
        "scoring": {
            "warmup_s": setup.warmup_s,
            "cooldown_s": setup.cooldown_s,
            "request_timeout_s": setup.request_timeout_s,
        },
        "slo": setup.slo,
        "slo_targets": dict(evaluator.targets_ms),
        "weights": setup.weights,
        "tier_objective": setup.tier_objective,
        "percentile": setup.percentile,
        "attainment_target": setup.attainment,
        "gpu": setup.gpu,
        "model": setup.model,
        "tp": setup.tp,
        "quantization": setup.quantization,
        "ep": setup.ep,
        "backend": setup.backend,
        "stack": setup.stack,
        "trace": {"name": setup.trace, "stats": evaluator.trace.stats()},
        "baseline": {
            "name": f"{target.label} serving defaults",
            "note": target.baseline_note,
            "config": baseline["config"],
            "metrics": runs["baseline"]["summary"],
            "score": runs["baseline"]["score"],
            "goodput_rps": baseline.get("goodput_rps"),
            "objective_value": _baseline_value(setup.objective, baseline),
        },
        "seed": setup.seed,
        "sampler": setup.sampler,
        "num_trials": len(trials),
        "search_space": describe(SearchSpace.from_dict(setup.space)),
        "commands": {target.name: command},
        "export_refused": refused,
        "notes": [*setup.notes, *_saturation_note(setup, chosen)],
    }
    if setup.objective == "pareto":
        data["pareto_front"] = [
            {
                "trial": t.number,
                "goodput": _goodput(t),
                "goodput_rps": t.user_attrs.get("goodput_rps"),
                "score": _score(t),
                "attainment": t.user_attrs.get("attainment"),
                "config": t.user_attrs["config"],
            }
            for t in pareto_front(trials)
        ]
    best_json = out_dir / "best.json"
    write_json(best_json, data)
    return Outputs(
        best_json, trials_csv, out_dir / "runs" / "best", out_dir / "runs" / "baseline", data
    )


class _KeptDefaults:
    """The defaults in the place of the best trial, when it did not beat them beyond noise."""

    def __init__(self, baseline: dict[str, Any]) -> None:
        self.user_attrs = {
            "config": baseline["config"],
            "goodput_rps": baseline.get("goodput_rps"),
            "goodput_rung": baseline.get("goodput_rung"),
            "feasible": baseline.get("feasible"),
        }


def _verdict(setup: Any, best: Any, baseline: dict[str, Any], evaluator: Any) -> Any | None:
    """The noise check of the best trial against the baseline (None: they are the same)."""
    from slotune.engine.config import EngineConfig
    from slotune.tuner.noise import judge

    if best.user_attrs["config"] == baseline["config"]:
        return None
    if setup.tier_objective and best.user_attrs.get("feasible") and not baseline.get("feasible"):
        return None  # the defaults miss a tier floor the best meets: not a matter of noise
    by_rate = setup.objective in ("goodput", "pareto") and evaluator.ladder is not None
    key = "goodput_value" if by_rate else "score"
    first = (float(best.user_attrs.get(key) or 0.0), float(baseline.get(key) or 0.0))
    return judge(
        evaluator,
        EngineConfig.from_dict(best.user_attrs["config"]),
        EngineConfig.from_dict(baseline["config"]),
        first,
        (best.user_attrs.get("goodput_rung"), baseline.get("goodput_rung")),
    )


def _saturation_note(setup: Any, best: Any) -> list[str]:
    rung = best.user_attrs.get("goodput_rung")
    if not setup.ladder or rung is None or rung < setup.ladder["highest"]:
        return []
    return [
        "the recommendation meets the SLO at the highest rate searched: the trace is too "
        "short (or its sessions too few) to load the engine fully, so its goodput is a "
        "lower bound; use more requests or --objective weighted with a --rate"
    ]


def _baseline_value(objective: str, baseline: dict[str, Any]) -> Any:
    if objective == "weighted":
        return baseline.get("score")
    if objective == "goodput":
        return baseline.get("goodput_rps")
    return [baseline.get("goodput_rps"), baseline.get("score")]
