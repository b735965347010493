"""The tuner's trials, read from the Optuna study (``study.db``) or else ``trials.csv``.

Everything downstream works on one frame: ``number``, ``state``, ``feasible``, one
``value_<i>`` column per objective, ``params_<name>`` per parameter, and flattened metrics
(``goodput``, ``slo_attainment``, ``ttft_ms_p99``, ...).
"""

from __future__ import annotations

import ast
import json
import logging
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from slotune.reports.fmt import is_number

TABLE_METRICS: tuple[str, ...] = (
    "goodput",
    "slo_attainment",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "request_throughput",
    "num_preemptions",
    "failed",
    "timeouts",
)
STEADY = "steady"
"""Column of the run's steady-state check: True, False, or missing (nothing to check)."""


@dataclass(frozen=True)
class TrialsData:
    frame: pd.DataFrame
    objective_names: tuple[str, ...]
    directions: tuple[str, ...]
    param_names: tuple[str, ...]
    importances: dict[str, float] = field(default_factory=dict)
    importance_note: str | None = None
    source: str = "none"
    recommended: int | None = None
    """Number of the trial best.json recommends, when it says."""

    @property
    def value_columns(self) -> list[str]:
        return [f"value_{i}" for i in range(len(self.objective_names))]

    @property
    def completed(self) -> pd.DataFrame:
        return self.frame[self.frame["state"] == "COMPLETE"]


def flatten_metrics(metrics: Any) -> dict[str, float | bool]:
    """A trial's metrics (dict, or its JSON/repr text from a CSV) as flat numeric columns
    and the ``steady`` flag.

    ``{"ttft_ms": {"p99": 1.0}, "goodput": 2.0}`` -> ``{"ttft_ms_p99": 1.0, "goodput": 2.0}``,
    by the tuner's own flattening (``slotune.tuner.results.flat_metrics``).
    """
    from slotune.tuner.results import flat_metrics

    if isinstance(metrics, str):
        metrics = _parse_mapping(metrics)
    if not isinstance(metrics, dict):
        return {}
    flat = flat_metrics(metrics)
    out: dict[str, float | bool] = {k: float(v) for k, v in flat.items() if is_number(v)}
    if isinstance(flat.get(STEADY), bool):
        out[STEADY] = flat[STEADY]
    return out


def _parse_mapping(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def _objective_names(study: Any, objective: str | None) -> tuple[str, ...]:
    names = study.metric_names
    if names:
        return tuple(str(n) for n in names)
    if len(study.directions) == 1:
        return (objective or "objective",)
    return tuple(f"objective {i}" for i in range(len(study.directions)))


def _trial_feasible(trial: Any) -> bool:
    flag = trial.user_attrs.get("feasible")
    if flag is not None:
        return bool(flag)
    constraints = trial.constraints
    return all(c <= 0.0 for c in constraints.values())


def _frame_from_study(study: Any, n_objectives: int) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for trial in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {
            "number": trial.number,
            "state": trial.state.name,
            "feasible": _trial_feasible(trial),
        }
        values = trial.values or []
        for i in range(n_objectives):
            row[f"value_{i}"] = values[i] if i < len(values) else math.nan
        for name, value in trial.params.items():
            row[f"params_{name}"] = value
        row.update(flatten_metrics(trial.user_attrs.get("metrics")))
        rows.append(row)
    return pd.DataFrame(rows)


def _importances(study: Any, n_complete: int, param_names: tuple[str, ...]) -> dict[str, float]:
    import optuna

    if n_complete < 2:
        raise ValueError(f"needs at least 2 completed trials (the study has {n_complete})")
    target = None
    if len(study.directions) > 1:

        def target(t: Any) -> float:
            return t.values[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = optuna.importance.get_param_importances(study, target=target)
    if not result:
        raise ValueError("no parameter varied across the completed trials")
    return {k: float(v) for k, v in result.items() if k in param_names}


def load_study_trials(
    storage_url: str | Path, study_name: str | None, objective: str | None
) -> TrialsData:
    """Load the Optuna study from a SQLite file or a storage URL (database or journal
    file), creating no tables;
    importances use Optuna's default evaluator (PED-ANOVA)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from slotune.tuner.storage import open_reader

    url = f"sqlite:///{storage_url}" if isinstance(storage_url, Path) else storage_url
    storage = open_reader(url)
    study = optuna.load_study(study_name=study_name, storage=storage)
    names = _objective_names(study, objective)
    frame = _frame_from_study(study, len(names))
    directions = tuple(d.name.lower() for d in study.directions)
    param_names = tuple(sorted(c[len("params_") :] for c in frame if c.startswith("params_")))
    n_complete = int((frame["state"] == "COMPLETE").sum()) if len(frame) else 0
    importances: dict[str, float] = {}
    note = None
    try:
        importances = _importances(study, n_complete, param_names)
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        note = f"Parameter importances not computed: {exc}."
    return TrialsData(frame, names, directions, param_names, importances, note, "study.db")


def load_csv_trials(
    csv_path: Path,
    objective: str | None,
    directions: tuple[str, ...],
    metric_names: tuple[str, ...] = (),
) -> TrialsData:
    """Fallback when there is no study: Optuna's ``trials_dataframe`` as stored in CSV."""
    raw = pd.read_csv(csv_path)
    frame = pd.DataFrame({"number": raw.get("number", pd.Series(range(len(raw))))})
    frame["state"] = raw.get("state", pd.Series(["COMPLETE"] * len(raw))).astype(str)
    value_cols = ["value"] if "value" in raw else sorted(c for c in raw if c.startswith("values_"))
    for i, col in enumerate(value_cols):
        frame[f"value_{i}"] = pd.to_numeric(raw[col], errors="coerce")
    feasible = raw.get("user_attrs_feasible")
    frame["feasible"] = True if feasible is None else feasible.fillna(True).astype(bool)
    for col in raw:
        if col.startswith("params_"):
            frame[col] = raw[col]
    if "user_attrs_metrics" in raw:
        metrics = pd.DataFrame([flatten_metrics(m) for m in raw["user_attrs_metrics"]])
        frame = pd.concat([frame, metrics], axis=1)
    for col in TABLE_METRICS:
        if col not in frame and col in raw:
            frame[col] = pd.to_numeric(raw[col], errors="coerce")
    if STEADY not in frame and STEADY in raw:
        flags = {True: True, False: False, "True": True, "False": False}
        frame[STEADY] = raw[STEADY].map(flags)
    if len(value_cols) == 1:
        names: tuple[str, ...] = (objective or "objective",)
    else:
        names = tuple(f"objective {i}" for i in range(len(value_cols)))
    if len(metric_names) == len(names):
        names = metric_names
    if len(directions) != len(names):
        directions = ("maximize",) * len(names)
    param_names = tuple(sorted(c[len("params_") :] for c in frame if c.startswith("params_")))
    note = "Parameter importances not computed: no study.db to evaluate them on."
    return TrialsData(frame, names, directions, param_names, {}, note, "trials.csv")


def empty_trials(reason: str) -> TrialsData:
    frame = pd.DataFrame(columns=["number", "state", "feasible"])
    return TrialsData(frame, (), (), (), {}, reason, "none")
