"""One stored run (``summary.json``, ``requests.csv``, ``steps.csv``) read into frames.

Per-request latencies come from the stored timestamps through the workloads' own metric
code (``slotune.workloads.metrics.request_metrics``); the run's headline numbers are read
from its ``summary.json`` as the runner wrote them, not recomputed.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from slotune.reports.columns import REQUEST_COLUMNS, STEP_COLUMNS
from slotune.reports.fmt import is_number

_LIST_SEPARATORS = re.compile(r"[\s,;|]+")


@dataclass(frozen=True)
class RunData:
    """A run with columns named by the keys of ``REQUEST_COLUMNS`` / ``STEP_COLUMNS``.

    ``requests`` also holds ``ttft_ms``, ``tpot_ms`` and ``e2el_ms``; ``steps["time"]`` is
    seconds since the run's first step. Missing columns are present and all-NaN.
    """

    label: str
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    itl_ms: np.ndarray
    config: dict[str, Any] = field(default_factory=dict)


def parse_token_times(cell: Any) -> list[float]:
    """Parse a serialized list of token times: JSON, Python repr, or separated numbers."""
    if cell is None:
        return []
    if isinstance(cell, (list, tuple, np.ndarray)):
        return [float(x) for x in cell]
    if isinstance(cell, float) and math.isnan(cell):
        return []
    if isinstance(cell, (int, float)):
        return [float(cell)]
    text = str(cell).strip()
    if text.startswith("["):
        try:
            return [float(x) for x in json.loads(text)]
        except (ValueError, TypeError):
            pass
    text = text.strip("[]()").strip()
    if not text:
        return []
    out: list[float] = []
    for token in _LIST_SEPARATORS.split(text):
        if token:
            try:
                out.append(float(token))
            except ValueError:
                continue
    return out


def flat_json_token_times(cells: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """Every request's token times in one array, and each request's count
    (``metrics.flat_token_times``' form), where each cell is a JSON list of numbers as the
    runner writes it (or empty): parsed in one pass, without a Python float per token.
    None where any cell is written otherwise (``parse_token_times`` reads those)."""
    texts = []
    counts = np.zeros(len(cells), dtype=np.int64)
    for i, cell in enumerate(cells.tolist()):
        if isinstance(cell, float) and math.isnan(cell):
            continue
        if not (isinstance(cell, str) and cell.startswith("[") and cell.endswith("]")):
            return None
        inner = cell[1:-1]
        if inner.strip():
            texts.append(inner)
            counts[i] = inner.count(",") + 1
    joined = ",".join(texts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns where the text does not parse to its end
        try:
            flat = np.fromstring(joined, sep=",") if joined else np.empty(0)
        except (ValueError, DeprecationWarning):
            return None
    if flat.size != counts.sum():
        return None
    return flat, counts


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object; a missing or unreadable file gives an empty dict."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def _canonical(
    frame: pd.DataFrame, mapping: dict[str, str], keep: tuple[str, ...] = ()
) -> pd.DataFrame:
    out = pd.DataFrame(index=frame.index)
    for key, column in mapping.items():
        if key in keep:
            out[key] = frame.get(column, None)
        elif column in frame:
            out[key] = pd.to_numeric(frame[column], errors="coerce")
        else:
            out[key] = np.nan
    return out


def _latencies(requests: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Per-request TTFT/TPOT/E2E and pooled ITL in ms, by the workloads' metric definitions."""
    from slotune.workloads.metrics import request_metrics
    from slotune.workloads.result import RunResult, empty_steps

    needed = ("arrival", "first_token", "finish", "output_tokens")
    requests = requests.copy()
    if requests.empty or requests[list(needed)].isna().all().any():
        for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
            requests[key] = np.nan
        return requests, np.empty(0)
    frame = pd.DataFrame({REQUEST_COLUMNS[k]: requests[k] for k in needed})
    flat = flat_json_token_times(requests["token_times"])
    if flat is None:
        cells = requests["token_times"]
        frame[REQUEST_COLUMNS["token_times"]] = [parse_token_times(c) for c in cells]
    frame[REQUEST_COLUMNS["error"]] = [_error(c) for c in requests["error"]]
    result = RunResult(requests=frame, steps=empty_steps(), duration_s=0.0)
    metrics = request_metrics(result, flat)
    requests["ttft_ms"] = metrics["ttft"] * 1000.0
    requests["tpot_ms"] = metrics["tpot"] * 1000.0
    requests["e2el_ms"] = metrics["e2e"] * 1000.0
    return requests, metrics["itl"] * 1000.0


def _error(cell: Any) -> str | None:
    """A stored error cell as the runner means it: None when the request succeeded."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return None
    text = str(cell).strip()
    return text if text and text not in ("nan", "None") else None


def load_run(run_dir: Path, label: str, config: dict[str, Any] | None = None) -> RunData:
    """Read a run folder; missing files give empty tables, never an exception. A folder
    read ahead (``read_ahead``) and unchanged since is taken from there."""
    ahead = _AHEAD.pop(run_dir.resolve(), None)
    tables = ahead[1] if ahead is not None and ahead[0] == _stamp(run_dir) else _tables(run_dir)
    summary, requests, steps, itl_ms = tables
    run_config = config if config is not None else summary.get("config")
    return RunData(
        label=label,
        summary=summary,
        requests=requests,
        steps=steps,
        itl_ms=itl_ms,
        config=run_config if isinstance(run_config, dict) else {},
    )


_Tables = tuple[dict[str, Any], pd.DataFrame, pd.DataFrame, np.ndarray]
_RUN_FILES = ("summary.json", "requests.csv", "steps.csv")
_AHEAD: dict[Path, tuple[tuple[tuple[int, int] | None, ...], _Tables]] = {}


def read_ahead(run_dir: Path) -> None:
    """Read a run folder now for the ``load_run`` of it that follows in this process (the
    tune reads its runs for the report while its last reruns end); that call takes it
    if the folder's files are unchanged, and frees it."""
    _AHEAD[run_dir.resolve()] = (_stamp(run_dir), _tables(run_dir))


def forget_ahead(run_dir: Path) -> None:
    """Drop a read-ahead of ``run_dir`` that no ``load_run`` took."""
    _AHEAD.pop(run_dir.resolve(), None)


def _stamp(run_dir: Path) -> tuple[tuple[int, int] | None, ...]:
    """Each run file's modification time and size (None: missing)."""
    stamps: list[tuple[int, int] | None] = []
    for name in _RUN_FILES:
        try:
            st = (run_dir / name).stat()
        except OSError:
            stamps.append(None)
        else:
            stamps.append((st.st_mtime_ns, st.st_size))
    return tuple(stamps)


def _tables(run_dir: Path) -> _Tables:
    summary = read_json(run_dir / "summary.json")
    keep = ("request_id", "token_times", "error")
    requests = _canonical(_read_csv(run_dir / "requests.csv"), REQUEST_COLUMNS, keep=keep)
    requests, itl_ms = _latencies(requests)
    steps = _canonical(_read_csv(run_dir / "steps.csv"), STEP_COLUMNS)
    if steps["time"].notna().any():
        steps["time"] = steps["time"] - steps["time"].min()
    else:
        steps["time"] = steps["step_time"].fillna(0).cumsum()
    if steps["kv_usage"].max(skipna=True) > 1.0:
        steps["kv_usage"] = steps["kv_usage"] / 100.0
    return summary, requests, steps, itl_ms


def percentile(run: RunData, metric: str, stat: str) -> float | None:
    """``stat`` (mean, p50, p90, p95, p99) of ``metric`` (ttft_ms, tpot_ms, itl_ms, e2el_ms).

    Read from the run's summary when it has it, else computed from the stored requests.
    """
    entry = run.summary.get(metric)
    if isinstance(entry, dict) and is_number(entry.get(stat)):
        return float(entry[stat])
    values = run.itl_ms if metric == "itl_ms" else run.requests.get(metric)
    if values is None:
        return None
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None
    if stat == "mean":
        return float(arr.mean())
    if stat.startswith("p") and stat[1:].isdigit():
        return float(np.percentile(arr, float(stat[1:])))
    return None


def prefix_cache_hit_rate(run: RunData) -> float | None:
    """Share of prompt tokens served from the prefix cache."""
    value = run.summary.get("prefix_cache_hit_rate")
    if is_number(value):
        return float(value)
    prompt = run.requests["prompt_tokens"].sum(skipna=True)
    if not prompt or not run.requests["cached_tokens"].notna().any():
        return None
    return float(run.requests["cached_tokens"].sum(skipna=True) / prompt)
