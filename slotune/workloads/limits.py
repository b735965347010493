"""What a trace's numbers may be: one place for the rules every reader and request checks.

Trace files are user input: a corrupted one can hold ``1e309`` (infinity), ``NaN``, negative
or absurdly large numbers. Each is rejected with a ``ValueError`` that names the field;
readers add the file and line.
"""

from __future__ import annotations

import math
from typing import Any

MAX_TOKENS = 10_000_000  # per prompt or output: far past any model's context
MAX_SECONDS = 1e9  # about 31 years: a trace's time span, a think time
MAX_TIMESTAMP = 1e13  # a raw timestamp (seconds or milliseconds since some epoch)
MAX_TOKEN_ID = 2**31 - 1
MAX_SEGMENT_KEY = 2**63 - 1
MAX_WHOLE_FILE_BYTES = 2**30
"""Formats read whole (a ShareGPT JSON array, a spec): a larger file is refused before a
byte is read, since its text alone takes its size again in memory (and 4x if not ASCII)."""
MAX_TRACE_ROWS = 2_000_000
"""Lines or rows of the formats read as a stream (JSONL, CSV): each request kept costs
about 0.7 KB (400k requests: 290 MB), so a bigger trace is refused at the line past this,
with its number, near 1.4 GB instead of growing until the machine runs out."""
FAST_CSV_BYTES = 256 * 2**20
"""The column-wise CSV reader holds the whole file; larger files stream row by row."""
MAX_PRIORITY = 2**31 - 1  # a request's priority lies in [-MAX_PRIORITY, MAX_PRIORITY]
MAX_TIER = 15  # service tiers 0 (the highest) .. MAX_TIER


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    if isinstance(value, int):
        return value  # keep big ints exact for the checks below
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return value


def parse_number(text: str, name: str) -> float:
    """A number written in a text field (CSV); ValueError says what is wrong."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}: expected a number, got {text!r}") from None
    return _number(value, name)


def check_int(value: Any, name: str, *, minimum: int = 0, maximum: int = MAX_TOKENS) -> int:
    """An integer in [minimum, maximum]; an integral float (``12.0``) is accepted."""
    v = _number(value, name)
    if int(v) != v:
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if not minimum <= v <= maximum:
        raise ValueError(f"{name}: expected an integer in [{minimum}, {maximum}], got {value!r}")
    return int(v)


def check_seconds(value: Any, name: str, *, maximum: float = MAX_SECONDS) -> float:
    """A finite, non-negative number of seconds up to ``maximum``."""
    v = _number(value, name)
    if not 0 <= v <= maximum:
        raise ValueError(f"{name}: expected seconds in [0, {maximum:g}], got {value!r}")
    return float(v)


def check_timestamp(value: Any, name: str) -> float:
    """A raw timestamp: finite, at most ``MAX_TIMESTAMP`` in size (it may be negative)."""
    v = _number(value, name)
    if not -MAX_TIMESTAMP <= v <= MAX_TIMESTAMP:
        raise ValueError(f"{name}: expected a timestamp within ±{MAX_TIMESTAMP:g}, got {value!r}")
    return float(v)


def check_priority(value: Any, name: str = "priority") -> int:
    return check_int(value, name, minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)


def check_tier(value: Any, name: str = "tier") -> int:
    return check_int(value, name, maximum=MAX_TIER)
