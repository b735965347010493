"""The outcome of one run: a row per request, a row per engine step."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

REQUEST_COLUMNS = (
    "request_id",
    "session_id",
    "turn",
    "tier",
    "arrival_time",
    "first_token_time",
    "finish_time",
    "token_times",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "num_preemptions",
    "error",
)
STEP_COLUMNS = (
    "time",
    "duration_s",
    "num_scheduled_tokens",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_running",
    "num_waiting",
    "kv_cache_usage",
    "num_preempted",
    "decode_context_sum",
    "prefill_context_sum",
)


@dataclass(frozen=True)
class RunResult:
    """``requests``: one row per request (times in seconds from the run's start; ``token_times``
    is a list of every output token's time; ``error`` is missing (None/NaN, test with
    ``isna()``) when the request succeeded, else what went wrong).
    ``steps``: one row per engine step (empty for HTTP targets), ``time`` being the step's end.
    """

    requests: pd.DataFrame
    steps: pd.DataFrame
    duration_s: float
    engine_stats: dict[str, Any] = field(default_factory=dict)

    def save(self, out_dir: str | Path) -> None:
        """Write ``requests.csv`` (token times as a JSON list) and ``steps.csv``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        reqs = self.requests.copy()
        reqs["token_times"] = list(map(token_times_json, reqs["token_times"]))
        reqs.to_csv(out / "requests.csv", index=False)
        self.steps.to_csv(out / "steps.csv", index=False)

    @classmethod
    def load(cls, run_dir: str | Path, *, duration_s: float | None = None) -> RunResult:
        """Read a run written by ``save`` (``duration_s`` from summary.json when present)."""
        d = Path(run_dir)
        reqs = pd.read_csv(
            d / "requests.csv", dtype={"request_id": str, "session_id": str, "error": str}
        )
        reqs["token_times"] = [
            json.loads(s) if isinstance(s, str) else [] for s in reqs["token_times"]
        ]
        reqs["error"] = reqs["error"].where(reqs["error"].notna(), None)
        steps = (
            pd.read_csv(d / "steps.csv") if (d / "steps.csv").stat().st_size > 1 else empty_steps()
        )
        summary = d / "summary.json"
        stats: dict[str, Any] = {}
        if duration_s is None and summary.exists():
            data = json.loads(summary.read_text())
            duration_s = data.get("duration_s")
            stats = data.get("engine_stats", {})
        if duration_s is None:
            duration_s = float(reqs["finish_time"].max()) if len(reqs) else 0.0
        return cls(requests=reqs, steps=steps, duration_s=float(duration_s), engine_stats=stats)


@lru_cache(maxsize=4096)
def _times_format(n: int) -> str:
    return "[" + ", ".join(["%.6f"] * n) + "]"


def token_times_json(times: Sequence[float]) -> str:
    """``times`` as a JSON list at microsecond resolution: each number reads back as
    ``round(t, 6)`` (printf's ``%.6f`` is correctly rounded, as ``round`` is), formatted
    in one call per request instead of one per token."""
    return _times_format(len(times)) % tuple(times)


def empty_steps() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float) for c in STEP_COLUMNS})
