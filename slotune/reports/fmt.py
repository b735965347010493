"""Number formatting for the report: every missing value reads "n/a"."""

from __future__ import annotations

import math
import numbers
from typing import Any, TypeGuard

NA = "n/a"


def is_number(value: object) -> TypeGuard[float]:
    """A finite real number, numpy scalars included, booleans excluded."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def num(value: Any, digits: int = 2) -> str:
    if not is_number(value):
        return NA
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def sig(value: Any, digits: int = 4) -> str:
    """``digits`` significant figures in plain notation, never an exponent: ``25,630``,
    ``57.37``, ``0.01235``; trailing zeros dropped as ``g`` drops them."""
    if not is_number(value):
        return NA
    v = float(value)
    if v == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    shown = f"{round(v, decimals):,.{decimals}f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown


def ms(value: Any) -> str:
    return f"{num(value, 1)} ms" if is_number(value) else NA


def pct(value: Any, digits: int = 1) -> str:
    """A share in [0, 1] as a percentage."""
    return f"{100 * value:.{digits}f}%" if is_number(value) else NA


def signed_pct(value: Any) -> str:
    """A relative change (0.25 means +25%)."""
    return f"{100 * value:+.1f}%" if is_number(value) else NA


def text(value: Any) -> str:
    if value is None or value == "":
        return NA
    if isinstance(value, float):
        return num(value, 3)
    return str(value)
