"""CSV traces with timestamps and lengths only: Azure LLM inference and BurstGPT.

Azure (``TIMESTAMP`` absolute date-times such as ``2023-11-16 18:15:46.6805900``,
``ContextTokens``, ``GeneratedTokens``) and BurstGPT (``Timestamp`` in seconds, ``Model``,
``Request tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``; failed requests
are the rows with 0 response tokens, dropped and counted). Prompts get unique tokens of
the recorded length. Rows must be in time order. Either format may add a ``priority``
and a ``tier`` column (see ``TraceRequest``).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

from slotune.workloads import limits
from slotune.workloads.limits import (
    check_int,
    check_priority,
    check_seconds,
    check_tier,
    check_timestamp,
    parse_number,
)
from slotune.workloads.readers import csv_columns
from slotune.workloads.readers.errors import (
    DropCounter,
    TraceFormatError,
    at,
    iter_lines,
    read_head,
    read_text,
)
from slotune.workloads.trace import Trace, TraceRequest

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
OPTIONAL_COLUMNS = ("priority", "tier")  # per request, 0 when absent
Row = tuple[float, int, int, int, int]  # since the first row, prompt, output, priority, tier
BURSTGPT_COLUMNS = (
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
)


def read_header(path: Path) -> list[str]:
    first = read_head(path).split("\n", 1)[0]
    try:
        return [c.strip() for c in next(csv.reader([first]), [])]
    except csv.Error:
        return []


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.reader(line for _, line in iter_lines(path))  # a stream, not the whole file
    try:
        header = [c.strip() for c in next(reader, [])]
        _check_unique(path, header)
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceFormatError(
                path,
                "row 1",
                f"missing column(s) {missing}; expected a header with {list(required)}",
            )
        for row in reader:
            if not any(c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise TraceFormatError(
                    path, f"row {reader.line_num}", f"expected {len(header)} fields, got {len(row)}"
                )
            yield reader.line_num, dict(zip(header, (c.strip() for c in row), strict=True))
    except csv.Error as exc:
        raise TraceFormatError(path, f"row {reader.line_num}", f"bad CSV ({exc})") from None


def _check_unique(path: Path, header: list[str]) -> None:
    """Each column once: readers that took the first or the last of two ``ContextTokens``
    columns read different traces from one file."""
    for i, name in enumerate(header):
        if name in header[:i]:
            raise TraceFormatError(
                path,
                "row 1",
                f"column {name!r} appears twice (columns {header.index(name) + 1} and "
                f"{i + 1}); expected each column once",
            )


def _count(path: Path, row: int, name: str, text: str) -> int:
    with at(path, f"row {row}"):
        return check_int(parse_number(text, f"column {name!r}"), f"column {name!r}")


def parse_azure_timestamp(text: str) -> datetime:
    """Azure's date-times carry 7 fractional digits; Python accepts at most 6."""
    head, _, frac = text.strip().partition(".")
    stamp = datetime.fromisoformat(head.replace("T", " ").rstrip("Z"))
    if frac:
        digits = "".join(ch for ch in frac if ch.isdigit())
        stamp = stamp.replace(microsecond=int((digits + "000000")[:6]))
    return stamp


def _azure_seconds(text: str) -> float:
    stamp = parse_azure_timestamp(text)
    if stamp.tzinfo is not None:
        stamp = stamp.astimezone(timezone.utc).replace(tzinfo=None)
    return float((stamp - _EPOCH) // timedelta(microseconds=1)) / 1e6


_EPOCH = datetime(1970, 1, 1)


def _trace(
    path: Path,
    seed: int,
    rows: Iterable[Row],
    prompt_col: str,
    prefix: str,
    failed_reason: str,
) -> Trace:
    """The trace of ``Row`` rows: a row with no output (a failed request) or no prompt is
    counted as dropped."""
    dropped = DropCounter()
    requests: list[TraceRequest] = []
    for since, n_in, n_out, priority, tier in rows:
        if n_out == 0:
            dropped.drop(failed_reason)
        elif n_in == 0:
            dropped.drop(f"{prompt_col} = 0")
        else:
            arrival = round(since, 6)
            rid = f"{prefix}{len(requests)}"
            requests.append(TraceRequest(rid, n_in, n_out, arrival, priority=priority, tier=tier))
    return Trace(
        name=path.stem, requests=tuple(requests), seed=seed, dropped=dict(dropped), source=str(path)
    )


def _read(
    path: Path,
    seed: int,
    columns: tuple[str, ...],
    time_col: str,
    prompt_col: str,
    output_col: str,
    parse_time: Callable[[str], float],
    prefix: str,
    failed_reason: str,
) -> Trace:
    def rows() -> Iterator[Row]:
        first: float | None = None
        last: float | None = None
        for row, values in _rows(path, columns):
            try:
                t = check_timestamp(parse_time(values[time_col]), f"column {time_col!r}")
            except (ValueError, OverflowError):
                raise TraceFormatError(
                    path,
                    f"row {row}",
                    f"column {time_col!r}: cannot read time {values[time_col]!r}",
                ) from None
            if last is not None and t < last:
                raise TraceFormatError(
                    path,
                    f"row {row}",
                    f"{time_col} {values[time_col]} is before the previous row's; "
                    "expected rows in time order",
                )
            last = t
            if first is None:
                first = t
            with at(path, f"row {row}"):
                check_seconds(t - first, f"{time_col} since the first row")
            n_in = _count(path, row, prompt_col, values[prompt_col])
            n_out = _count(path, row, output_col, values[output_col])
            with at(path, f"row {row}"):
                priority = _optional(values, "priority", check_priority)
                tier = _optional(values, "tier", check_tier)
            yield t - first, n_in, n_out, priority, tier

    return _trace(path, seed, rows(), prompt_col, prefix, failed_reason)


def _optional(values: dict[str, str], name: str, check: Callable[[object, str], int]) -> int:
    text = values.get(name, "")
    return check(parse_number(text, f"column {name!r}"), f"column {name!r}") if text else 0


def _read_azure_fast(path: Path, seed: int) -> Trace | None:
    """The same trace as ``_read`` from checked columns; None if the file is not plain
    or too big to hold whole, or has the optional columns, which the row reader reads)."""
    if path.stat().st_size > limits.FAST_CSV_BYTES:
        return None
    header = read_header(path)
    _check_unique(path, header)  # pandas would rename a second column "X.1"
    if any(c in header for c in OPTIONAL_COLUMNS):
        return None
    frame = csv_columns.read_columns(read_text(path), AZURE_COLUMNS)
    if frame is None:
        return None
    seconds = csv_columns.azure_seconds(frame["TIMESTAMP"])
    n_in = csv_columns.counts(frame["ContextTokens"])
    n_out = csv_columns.counts(frame["GeneratedTokens"])
    if seconds is None or n_in is None or n_out is None or not csv_columns.in_order(seconds):
        return None
    first = float(seconds[0]) if len(seconds) else 0.0
    columns = zip(seconds.tolist(), n_in.tolist(), n_out.tolist(), strict=True)
    rows = ((t - first, a, b, 0, 0) for t, a, b in columns)
    return _trace(path, seed, rows, "ContextTokens", "az", "GeneratedTokens = 0")


def read_azure(path: Path, *, seed: int, fast: bool = True) -> Trace:
    """Column-wise when the file is plain (``fast``), else (and for errors) row by row."""
    trace = _read_azure_fast(path, seed) if fast else None
    if trace is not None:
        return trace
    return _read(
        path,
        seed,
        AZURE_COLUMNS,
        "TIMESTAMP",
        "ContextTokens",
        "GeneratedTokens",
        _azure_seconds,
        "az",
        "GeneratedTokens = 0",
    )


def read_burstgpt(path: Path, *, seed: int) -> Trace:
    return _read(
        path,
        seed,
        BURSTGPT_COLUMNS,
        "Timestamp",
        "Request tokens",
        "Response tokens",
        lambda text: parse_number(text, "Timestamp"),
        "bg",
        "failed (Response tokens = 0)",
    )
