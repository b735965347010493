"""Small studies made in the test process, for the worker and distributed tests."""

from __future__ import annotations

from typing import Any

import pytest

from slotune.tuner.evaluate import Evaluator, config_key
from slotune.tuner.study import Joined, create_or_join

SLO = "ttft=300ms,tpot=50ms"


def new_study(url: str, name: str, *, trials: int, heartbeat: int, **options: Any) -> Joined:
    """A weighted study of 20 requests at 4 req/s on a simulated H100 (the baseline
    measured and queued), unless ``options`` say otherwise."""
    from slotune.tuner.prepare import TuneOptions, measure_baseline, prepare

    opts = {"gpu": "h100", "slo": SLO, "num_requests": 20, "objective": "weighted", "rate": 4.0}
    prepared = prepare(TuneOptions(**{**opts, **options}, trials=trials, heartbeat=heartbeat))
    evaluator = Evaluator(prepared.setup, prepared.trace)
    return create_or_join(
        url,
        name,
        prepared.setup,
        lambda: measure_baseline(prepared, evaluator),
        trials=trials,
        heartbeat=heartbeat,
    )


def evaluator_for(**options: Any) -> Evaluator:
    """The evaluator of a study made from ``TuneOptions`` fields (prepared, not created)."""
    from slotune.tuner.prepare import TuneOptions, prepare

    prepared = prepare(TuneOptions(**options))
    return Evaluator(prepared.setup, prepared.trace)


def record_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, int]]:
    """Every ``Evaluator.run`` from now on, as (configuration key, rate, seed)."""
    seen: list[tuple[str, Any, int]] = []
    run = Evaluator.run

    def recorded(self: Evaluator, config: Any, rate: Any = None, backend: Any = None) -> Any:
        seen.append((config_key(config), rate, self.setup.seed))
        return run(self, config, rate, backend)

    monkeypatch.setattr(Evaluator, "run", recorded)
    return seen
