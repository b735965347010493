"""Fitted constants and the one transform every fit here uses: each constant is moved by
the optimizer as a coordinate in [0, 1] between its bounds, linearly or, for a positive
constant that spans decades (an overhead, an efficiency far below 1), on a log scale.
The optimizer (scipy's bounded least squares) works on the unit box; callers read and
write values by name."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Param:
    """One fitted constant: its name, its bounds and whether it moves on a log scale."""

    name: str
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"{self.name}: low {self.low} must be below high {self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"{self.name}: a log-scale constant needs low > 0, not {self.low}")

    def to_unit(self, value: float) -> float:
        """``value`` (clipped to the bounds) as a coordinate in [0, 1]."""
        v = min(max(value, self.low), self.high)
        if self.log:
            return math.log(v / self.low) / math.log(self.high / self.low)
        return (v - self.low) / (self.high - self.low)

    def from_unit(self, z: float) -> float:
        """The value at coordinate ``z`` (clipped to [0, 1])."""
        z = min(max(float(z), 0.0), 1.0)
        if self.log:
            return self.low * (self.high / self.low) ** z
        return self.low + z * (self.high - self.low)


def to_unit(params: Sequence[Param], values: Mapping[str, float]) -> np.ndarray:
    """The unit-box point of ``values`` (one coordinate per parameter, in order)."""
    return np.array([p.to_unit(values[p.name]) for p in params])


def from_unit(params: Sequence[Param], z: Sequence[float] | np.ndarray) -> dict[str, float]:
    """The named values at unit-box point ``z``."""
    return {p.name: p.from_unit(v) for p, v in zip(params, z, strict=True)}
