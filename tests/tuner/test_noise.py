"""The noise check: where the seed changes nothing (a closed loop draws no arrival times),
the study's own runs stand for the other seeds, and they are what a rerun at those seeds
measures; where it draws them (Poisson), every seed is run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slotune.engine.config import EngineConfig
from slotune.tuner.evaluate import Evaluator
from slotune.tuner.forked import forks
from slotune.tuner.noise import judge
from tests.tuner.studies import evaluator_for, record_runs

BEST = EngineConfig(max_num_batched_tokens=1024, max_num_seqs=16)
BASELINE = EngineConfig(max_num_batched_tokens=256, max_num_seqs=4)


def evaluator(**load: object) -> Evaluator:
    return evaluator_for(
        gpu="h100",
        slo="ttft=500ms,tpot=30ms",
        trace="sharegpt-like",
        num_requests=40,
        objective="weighted",
        **load,
    )


@pytest.mark.parametrize(("load", "same"), [({"concurrency": 6}, True), ({"rate": 8.0}, False)])
def test_reruns_only_where_the_seed_draws_arrivals(
    load: dict, same: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev = evaluator(**load)
    first = (ev.measure(BEST).score, ev.measure(BASELINE).score)
    runs = record_runs(monkeypatch)
    verdict = judge(ev, BEST, BASELINE, first)
    monkeypatch.undo()
    assert verdict.same_runs is same
    # the reruns go to forked children where the machine has the cores (not seen here)
    assert [seed for _, _, seed in runs] == ([] if same or forks() else [1, 1, 2, 2])
    # what a fresh evaluator at each other seed measures (nothing shared with ``ev``)
    for k, seed in enumerate(verdict.seeds[1:], start=1):
        other = Evaluator(replace(ev.setup, seed=seed), ev.trace)
        assert verdict.best[k] == other.measure(BEST).score
        assert verdict.baseline[k] == other.measure(BASELINE).score
    assert (len(set(verdict.baseline)) == 1) is same
