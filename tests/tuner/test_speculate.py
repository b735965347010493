"""The what-if reruns of the best trial so far go on a spare core during the trials: at the
finish the recommendation's come from there, the same as rerun then."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slotune.api import tune
from slotune.tuner import speculate, what_if
from slotune.tuner.forked import forks

OPTIONS: dict[str, Any] = {
    "gpu": "h100",
    "slo": "ttft=300ms,tpot=50ms",
    "objective": "weighted",
    "num_requests": 24,
    "concurrency": 6,  # no arrival times drawn: the noise check keeps the best trial
    "trials": 8,
    "report": False,
}


def _what_if(out: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], list[Any]]:
    """best.json's what-if, and the variants the finish ran itself."""
    ran: list[Any] = []
    forked = what_if.map_forked

    def recorded(fn: Any, items: Any, workers: Any = None) -> Any:
        ran.extend(items)
        return forked(fn, items, workers)

    with monkeypatch.context() as m:
        m.setattr(what_if, "map_forked", recorded)
        result = tune(**OPTIONS, out=str(out))
    return json.loads(result.best_json.read_text())["what_if"], ran


@pytest.mark.skipif(not forks(), reason="no spare core to run them on")
def test_the_finish_takes_the_reruns_measured_during_the_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead, ran_at_finish = _what_if(tmp_path / "ahead", monkeypatch)
    monkeypatch.setattr(speculate.WhatIfAhead, "applies", staticmethod(lambda *_: False))
    alone, ran_alone = _what_if(tmp_path / "alone", monkeypatch)
    assert ran_alone and not ran_at_finish  # adaptive chunking at least is always rerun
    assert ahead == alone
