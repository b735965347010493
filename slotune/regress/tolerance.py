"""Tolerances: how far a metric may move from its baseline, and in which direction is worse.

``+10%`` higher is worse by more than 10 % of the baseline; ``-5%`` lower is worse;
``±2%`` (or ``+-2%``) either way; without ``%`` the amount is absolute (``-0.01``);
``0`` means exactly equal. YAML reads an unquoted ``+0.5`` as the number 0.5, so a
positive number means higher is worse, like ``+0.5``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Direction = Literal["up", "down", "both"]

_PATTERN = re.compile(r"^(\+-|±|\+|-)?(\d+(?:\.\d*)?|\.\d+)(%?)$")
_SIGNS: dict[str, Direction] = {"+": "up", "-": "down", "±": "both", "+-": "both"}


@dataclass(frozen=True)
class Tolerance:
    """``worse``: the direction that counts as a regression; ``amount``: how much of it is
    allowed, a fraction of the baseline when ``relative``."""

    worse: Direction
    amount: float
    relative: bool

    def allowed(self, baseline: float) -> float:
        """The change allowed in the worse direction, in the metric's units."""
        return self.amount * abs(baseline) if self.relative else self.amount

    def __str__(self) -> str:
        sign = {"up": "+", "down": "-", "both": "±"}[self.worse]
        if self.relative:
            return f"{sign}{self.amount * 100:.12g}%"
        return f"{sign}{self.amount:.12g}"


def parse_tolerance(value: str | float) -> Tolerance:
    """A tolerance from the suite; ``ValueError`` says what would be right."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a tolerance")
    if isinstance(value, (int, float)):
        if value == 0:
            return Tolerance("both", 0.0, relative=False)
        return Tolerance("up" if value > 0 else "down", abs(float(value)), relative=False)
    m = _PATTERN.match(value.strip())
    if m is None:
        raise ValueError(
            f"{value!r} is not a tolerance; write +10% (higher is worse), -5% (lower is "
            "worse), ±2% (either way) or an absolute amount such as -0.01"
        )
    sign, number, percent = m.groups()
    amount = float(number) / (100.0 if percent else 1.0)
    if sign is None and amount != 0:
        raise ValueError(
            f"{value!r} has no direction; write +{value} (higher is worse), -{value} "
            f"(lower is worse) or ±{value} (either way)"
        )
    return Tolerance(_SIGNS[sign] if sign else "both", amount, relative=bool(percent))
