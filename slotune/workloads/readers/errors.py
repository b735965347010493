"""The error every reader raises for bad input: file, line or row, what was expected."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class TraceFormatError(ValueError):
    def __init__(self, path: str | Path, where: str, message: str) -> None:
        super().__init__(f"{path}:{where}: {message}")
        self.path = str(path)
        self.where = where


class DropCounter(Counter):
    """Rows dropped by filters, by reason, so that none is silently lost."""

    def drop(self, reason: str) -> None:
        self[reason] += 1


def iter_json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` for each non-blank line of a JSON-lines file."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(
                    path,
                    f"line {lineno}",
                    f"invalid JSON ({exc.msg}); expected one JSON object per line",
                ) from None
