"""A tune makes the trace's prompt tokens once, in its own process, before any run or
forked child, and keeps what lives through the tune out of the cyclic collector's passes
(frozen in every run, children included), handing it back at the end."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest

import slotune
from slotune.tuner.evaluate import Evaluator
from slotune.workloads import trace as traces


def test_prompts_are_made_once_here_and_every_run_leaves_them_to_the_freeze(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "log"  # appended to by this process and by forked children

    def note(line: str) -> None:
        with open(log, "a") as f:
            f.write(f"{line} {os.getpid()} {gc.get_freeze_count()}\n")

    materialize, run = traces._materialize, Evaluator.run

    def made(trace: Any) -> Any:
        note("made")
        return materialize(trace)

    def ran(self: Evaluator, *args: Any, **kwargs: Any) -> Any:
        note("run")
        return run(self, *args, **kwargs)

    monkeypatch.setattr(traces, "_materialize", made)
    monkeypatch.setattr(Evaluator, "run", ran)
    slotune.tune(
        out=str(tmp_path / "out"),
        gpu="h100",
        slo="ttft=300ms,tpot=40ms",
        num_requests=30,
        concurrency=6,
        trials=4,
    )
    lines = [line.split() for line in log.read_text().splitlines()]
    made_in = [(int(pid), int(frozen)) for kind, pid, frozen in lines if kind == "made"]
    assert made_in == [(os.getpid(), 0)]  # once, before anything was frozen
    runs = [(int(pid), int(frozen)) for kind, pid, frozen in lines if kind == "run"]
    assert len(runs) >= 4 and all(frozen > 0 for _, frozen in runs)
    assert gc.get_freeze_count() == 0  # handed back


def test_a_caller_s_own_frozen_objects_stay_frozen() -> None:
    from slotune.tuner.workflow import _kept_from_collections

    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        with _kept_from_collections():
            pass
        assert gc.get_freeze_count() >= mine > 0
    finally:
        gc.unfreeze()
    with _kept_from_collections():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
