"""The first trials of a new study, measured ahead on the machine's cores.

A TPE study draws its first trials at random (its start-up), and a random study draws all
of them: what a draw gives depends on the sampler's seed and on the order of the draws,
never on a result. So a shadow of the new study (in memory: the same sampler, seed and
queued baseline, each trial told a placeholder value) draws the configurations the study
will try first, before it exists. The baseline and those configurations are then measured
at once in forked processes (``Evaluator.measure_ahead``), and the study, run as always,
finds each in the evaluator's cache: its trials, its path and its results are those it
would have had without this. A draw the shadow got wrong only costs a run.

Only a study that one worker runs from its creation, on the simulator, at a load of its own
(the weighted objective, no rate search), is measured ahead: other workers' draws, a
joined study's history or a rate search would make the first trials depend on more than the
seed.
"""

from __future__ import annotations

from typing import Any

from slotune.engine.config import EngineConfig
from slotune.tuner.setup import TuneSetup


def can_measure_ahead(setup: TuneSetup, n_jobs: int, has_ladder: bool) -> bool:
    """Whether a new study's first trials follow from its seed alone, for this command."""
    return (
        n_jobs == 1
        and setup.backend == "sim"
        and setup.objective == "weighted"
        and not has_ladder
        and setup.sampler in ("tpe", "random")
    )


def first_configs(setup: TuneSetup, baseline: EngineConfig, trials: int) -> list[EngineConfig]:
    """The configurations a new study of ``trials`` trials will try first, in order: those
    it draws before any result can steer it (after its queued trials)."""
    import optuna

    from slotune.tuner.space import SearchSpace
    from slotune.tuner.study import enqueue_baseline, make_sampler, startup_trials
    from slotune.tuner.trial import DIRECTIONS

    drawn = trials if setup.sampler == "random" else startup_trials(trials)
    shadow = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        directions=list(DIRECTIONS[setup.objective]),
        sampler=make_sampler(setup.sampler, setup.seed, n_trials=trials),
    )
    enqueue_baseline(shadow, setup, {"config": baseline.to_dict()})
    space = SearchSpace.from_dict(setup.space)
    out: list[EngineConfig] = []
    while len(out) < min(drawn, trials):
        trial: Any = shadow.ask()
        out.append(space.suggest(trial))
        shadow.tell(trial, [0.0] * len(DIRECTIONS[setup.objective]))
    return out
