"""Per-request and per-step records, kept as plain lists while a run goes (cheap on the
hot path) and turned into DataFrames once at the end."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from slotune.engine.outputs import StepStats
from slotune.workloads.result import REQUEST_COLUMNS, STEP_COLUMNS, RunResult, empty_steps
from slotune.workloads.trace import Trace

NAN = math.nan


class Recorder:
    """``latency_s``: how much later than the engine a client learns of each token and
    finish; token times are recorded as the client saw them (``seen_at``), finishes and
    the duration are moved by ``result``."""

    def __init__(self, trace: Trace, latency_s: float = 0.0) -> None:
        n = len(trace)
        self.trace = trace
        self.latency_s = latency_s
        self.seen_at = float(latency_s).__add__  # an engine time as the client sees it
        self.index = {r.request_id: i for i, r in enumerate(trace.requests)}
        self.arrival = [NAN] * n
        self.finish = [NAN] * n
        self.token_times: list[list[float]] = [[] for _ in range(n)]
        self.prompt_tokens = [0] * n
        self.output_tokens: list[int | None] = [None] * n
        self.cached_tokens = [0] * n
        self.preemptions = [0] * n
        self.error: list[str | None] = ["not sent"] * n
        self.num_done = 0
        self._step_times: list[float] = []
        self._steps: list[StepStats] = []

    def sent(self, i: int, arrival_time: float, prompt_tokens: int) -> None:
        self.arrival[i] = arrival_time
        self.prompt_tokens[i] = prompt_tokens
        self.error[i] = None

    def pending(self) -> list[int]:
        """Requests sent and not yet ended."""
        return [
            i
            for i, (error, finish) in enumerate(zip(self.error, self.finish, strict=True))
            if error is None and math.isnan(finish)
        ]

    def tokens(self, i: int, now: float, count: int = 1) -> None:
        if count == 1:
            self.token_times[i].append(now)
        else:
            self.token_times[i].extend([now] * count)

    def done(
        self,
        i: int,
        now: float,
        *,
        error: str | None = None,
        output_tokens: int | None = None,
        cached_tokens: int = 0,
        preemptions: int = 0,
        prompt_tokens: int | None = None,
    ) -> None:
        self.finish[i] = now
        self.error[i] = error
        self.output_tokens[i] = output_tokens
        self.cached_tokens[i] = cached_tokens
        self.preemptions[i] = preemptions
        if prompt_tokens is not None:
            self.prompt_tokens[i] = prompt_tokens
        self.num_done += 1

    def step(self, now: float, s: StepStats) -> None:
        self._step_times.append(now)
        self._steps.append(s)

    def steps(self, times: list[float], steps: list[StepStats]) -> None:
        """Steps ending at ``times`` (one each)."""
        self._step_times.extend(times)
        self._steps.extend(steps)

    def steps_frame(self) -> pd.DataFrame:
        if not self._steps:
            return empty_steps()
        # numpy converts a column of Python numbers a few times faster than pandas does
        columns: dict[str, Any] = {"time": np.array(self._step_times)}
        for name, values in zip(StepStats._fields, zip(*self._steps, strict=True), strict=True):
            columns[name] = np.array(values)
        return pd.DataFrame(columns, columns=list(STEP_COLUMNS))

    def result(self, duration_s: float, engine_stats: dict[str, Any] | None = None) -> RunResult:
        """The run's frames, finishes and duration as the client sees them."""
        reqs = self.trace.requests
        finish = list(map(self.seen_at, self.finish)) if self.latency_s else self.finish
        out = [
            len(ts) if o is None else o
            for o, ts in zip(self.output_tokens, self.token_times, strict=True)
        ]
        data = {
            "request_id": [r.request_id for r in reqs],
            "session_id": [r.session_id for r in reqs],
            "turn": [r.turn for r in reqs],
            "tier": [r.tier for r in reqs],
            "arrival_time": self.arrival,
            "first_token_time": [ts[0] if ts else NAN for ts in self.token_times],
            "finish_time": finish,
            "token_times": self.token_times,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": out,
            "cached_tokens": self.cached_tokens,
            "num_preemptions": self.preemptions,
            "error": self.error,
        }
        requests = pd.DataFrame(data, columns=list(REQUEST_COLUMNS))
        return RunResult(
            requests=requests,
            steps=self.steps_frame(),
            duration_s=self.seen_at(duration_s),
            engine_stats=dict(engine_stats or {}),
        )
