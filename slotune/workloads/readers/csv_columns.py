"""Column-wise reading of well-formed CSV traces (the fast path of ``csv_traces``).

Each function returns ``None`` for anything it does not fully vouch for (odd whitespace,
time zones, blank or short rows, out-of-range values, rows out of time order); the
row-by-row reader then reads the file and words the error. Where both read a file they
give the same numbers.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

from slotune.workloads.limits import MAX_SECONDS, MAX_TIMESTAMP, MAX_TOKENS

_AZURE_TIME = r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?$"
_COUNT = r"^\d{1,8}$"
_US = 1_000_000


def read_columns(text: str, columns: tuple[str, ...]) -> pd.DataFrame | None:
    """The named columns as strings, or None when the file is not plainly well formed."""
    if '"' in text:
        return None  # quoted fields: leave them to the csv module
    lines = [line for line in text.splitlines() if line]
    if not lines or any(line.count(",") != lines[0].count(",") for line in lines):
        return None  # short or long rows, or blank-looking ones
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, index_col=False)
    except (ValueError, pd.errors.ParserError):
        return None
    header = list(frame.columns)
    if len(set(header)) != len(header) or any(c not in header for c in columns):
        return None
    return frame[list(columns)]


def counts(column: pd.Series) -> np.ndarray | None:
    """Plain non-negative integers up to ``MAX_TOKENS``."""
    if not column.str.fullmatch(_COUNT, na=False).all():
        return None
    values = column.astype(np.int64).to_numpy()
    return None if len(values) and values.max() > MAX_TOKENS else values


def azure_seconds(column: pd.Series) -> np.ndarray | None:
    """Seconds since 1970 of naive ``YYYY-MM-DD HH:MM:SS[.fraction]`` date-times, cut to
    microseconds as ``parse_azure_timestamp`` does."""
    parts = column.str.extract(_AZURE_TIME)
    if parts[0].isna().any():
        return None
    try:
        days = pd.to_datetime(
            parts[0] + "-" + parts[1] + "-" + parts[2], format="%Y-%m-%d", exact=True
        )
    except (ValueError, OverflowError):
        return None
    hms = parts[[3, 4, 5]].astype(np.int64).to_numpy()
    if len(hms) and (hms[:, 0].max() > 23 or hms[:, 1:].max() > 59):
        return None
    frac = parts[6].fillna("").str.pad(6, side="right", fillchar="0").str[:6]
    micros = (
        (days.to_numpy().astype("datetime64[D]").astype(np.int64) * 86400) * _US
        + (hms[:, 0] * 3600 + hms[:, 1] * 60 + hms[:, 2]) * _US
        + frac.astype(np.int64).to_numpy()
    )
    seconds = micros.astype(np.float64) / 1e6
    if len(seconds) and np.abs(seconds).max() > MAX_TIMESTAMP:
        return None
    return seconds


def in_order(seconds: np.ndarray) -> bool:
    """Rows in time order, spanning at most ``MAX_SECONDS``."""
    if not len(seconds):
        return True
    return bool(np.all(np.diff(seconds) >= 0)) and seconds[-1] - seconds[0] <= MAX_SECONDS
