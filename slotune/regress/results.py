"""What a run of a suite records: per benchmark, each judged metric's value in every
repeat. A baseline is the same file, kept."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

FORMAT = "slotune-regress/1"
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class BenchmarkResult:
    name: str
    backend: str
    deterministic: bool
    report_only: list[str]
    tolerances: dict[str, str]
    samples: dict[str, list[float | None]]
    summary: dict[str, Any] = field(default_factory=dict)
    identity: dict[str, Any] | None = None  # what it measured (see regress.identity)


@dataclass(frozen=True)
class SuiteResult:
    suite: str
    benchmarks: list[BenchmarkResult]
    slotune_version: str
    date: str
    host: str

    @classmethod
    def new(cls, suite: str, benchmarks: list[BenchmarkResult]) -> SuiteResult:
        from slotune._version import __version__

        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return cls(suite, benchmarks, __version__, now, platform.node())

    def by_name(self) -> dict[str, BenchmarkResult]:
        return {b.name: b for b in self.benchmarks}

    def save(self, path: Path) -> Path:
        """Write to the file ``path``, or ``results.json`` in the folder ``path`` when it
        does not end in ``.json``; the file written."""
        if path.suffix != ".json":
            path = path / RESULTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, **asdict(self)}
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        return path


def load_results(path: str | Path) -> SuiteResult:
    """A results file, or the ``results.json`` in a folder; ``ValueError`` says what is
    wrong with it."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a slotune regress results file (format {FORMAT})")
    try:
        benchmarks = [BenchmarkResult(**b) for b in data["benchmarks"]]
        return SuiteResult(
            data["suite"], benchmarks, data["slotune_version"], data["date"], data["host"]
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed results file ({exc})") from None
