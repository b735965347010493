"""The error every reader raises for bad input: file, line or row, what was expected."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


class TraceFormatError(ValueError):
    def __init__(self, path: str | Path, where: str, message: str) -> None:
        super().__init__(f"{path}:{where}: {message}")
        self.path = str(path)
        self.where = where


class DropCounter(Counter):
    """Rows dropped by filters, by reason, so that none is silently lost."""

    def drop(self, reason: str) -> None:
        self[reason] += 1
