"""Trials measured ahead on the machine's cores: a new study's first ones, all drawn at
random before any result (``first_configs``, ``Evaluator.measure_ahead``), and then the
next trial while one runs (``NextTrialAhead``).

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

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.tuner.setup import TuneSetup


def spare_core(setup: TuneSetup, n_jobs: int) -> bool:
    """Whether this command's study can use the machine's other cores for runs measured
    ahead: one worker, simulated runs (deterministic, and never timed against each other)
    at the study's load (the weighted objective), on a machine that forks."""
    from slotune.tuner.forked import forks

    return forks() and n_jobs == 1 and setup.backend == "sim" and setup.objective == "weighted"


def can_measure_ahead(setup: TuneSetup, n_jobs: int, has_ladder: bool) -> bool:
    """Whether a new study's first trials follow from its seed alone and can be measured
    ahead, for this command."""
    return spare_core(setup, n_jobs) and not has_ladder and setup.sampler in ("tpe", "random")


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


class NextTrialAhead:
    """The trial TPE asks next, guessed and measured on a spare core while this process
    measures the current one.

    What TPE draws depends on the results only through its split of the finished trials
    into the best tenth and the rest (by constraint violation first, then value); a trial
    among the rest (most are) counts the same whatever its result. So while a trial is
    measured here, a forked child tells a shadow of the study (the same trials, the same
    sampler state) that the trial was the worst yet (the largest violation and value),
    draws the next trial there, says what it drew, and measures it. When the study then
    asks for that configuration its measurement comes from the child
    (``Evaluator.take``); a wrong guess is dropped as soon as the study draws otherwise.
    The study's trials and path are those it has without this. At the study's last trial
    no trial follows: the child reruns the best trial's first what-if for the finish
    instead (``_rerun_ahead``).
    """

    def __init__(
        self,
        evaluator: Any,
        space: Any,
        budget: int | None = None,
        baseline: dict[str, Any] | None = None,
    ) -> None:
        from slotune.tuner.forked import Server

        self.evaluator = evaluator
        self.space = space
        self.budget = budget  # the finished trials the study ends with (None: not known)
        self.baseline = baseline or {}
        self.server = Server(self._handle)  # one child for the study: forked once
        self.rerun: tuple[str, float | None] | None = None  # the what-if rerun sent

    @staticmethod
    def applies(setup: TuneSetup, n_jobs: int) -> bool:
        """A TPE study (a random one's trials are all measured ahead) with a core to
        spare (``spare_core``)."""
        return setup.sampler == "tpe" and spare_core(setup, n_jobs)

    def before_measure(self, trial: Any, config: EngineConfig) -> None:
        """``trial`` asks for ``config``: take its measurement from the guess when it was
        right; else, as this process measures it now, guess the next trial meanwhile."""
        from slotune.tuner.evaluate import config_key

        if self.rerun is not None:  # the last trial was not the last after all
            self.server.kill()
            self.rerun = None
        if self.server.busy:
            said, guess = self.server.next()
            if said and guess == config_key(config):
                said, measured = self.server.next()
                if said:
                    self.evaluator.take(config, *measured)
                    self.server.next()  # the end of its answer
            else:
                self.server.kill()  # it would measure for nothing
        if not self.evaluator.measured(config):
            if self._last(trial):
                self._rerun_ahead(trial)
            else:
                self._guess_after(trial)

    def close(self) -> None:
        """End the child, or, where it reruns a what-if, leave it to the finish
        (``Evaluator.rerun_ahead``, taken by ``what_if.what_if``)."""
        from slotune.tuner.what_if import RerunAhead

        if self.rerun is not None and self.server.busy:
            self.evaluator.rerun_ahead = RerunAhead(*self.rerun, self.server)
        else:
            self.server.kill()
        self.rerun = None

    def _last(self, trial: Any) -> bool:
        """Whether ``trial`` is the study's last: no trial is asked after it."""
        from slotune.tuner.results import finished

        return self.budget is not None and len(finished(trial.study)) + 1 >= self.budget

    def _rerun_ahead(self, trial: Any) -> None:
        """While this process measures the last trial, start the finish's first what-if
        rerun of the best trial so far in the child, whose core would guess a trial that
        is never asked. The finish takes it where it reruns the same variant at the same
        load (the last trial is rarely the best), and ends it otherwise."""
        from slotune.engine.config import EngineConfig
        from slotune.targets import get_target
        from slotune.tuner.evaluate import config_key
        from slotune.tuner.results import finished, select_best
        from slotune.tuner.what_if import rerun_variants

        setup = self.evaluator.setup
        best = select_best(
            finished(trial.study), setup.objective, setup.attainment, self.baseline.get("config")
        )
        if best is None:
            return
        config = EngineConfig.from_dict(best.user_attrs["config"])
        if not self.evaluator.measured(config):
            return
        summary = self.evaluator.measure(config).summary
        variants = rerun_variants(self.evaluator, get_target(setup.target), config, summary)
        if variants and self.server.send(_Rerun(variants[0], setup.load.rate)):
            self.rerun = (config_key(variants[0]), setup.load.rate)

    def _guess_after(self, trial: Any) -> None:
        import optuna

        study = trial.study
        others = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        minimize = optuna.study.StudyDirection.MINIMIZE
        worst = [math.inf if d == minimize else -math.inf for d in study.directions]
        bounds = {key for t in others for key in t.constraints}  # the worst violation too
        this = optuna.trial.create_trial(
            params=trial.params,
            distributions=trial.distributions,
            values=worst,
            constraints=dict.fromkeys(bounds, math.inf) if bounds else None,
        )
        self.server.send(
            _Guess(
                study.sampler,
                study.directions,
                [*others, this],
                self.evaluator.measured_keys(),
                self.evaluator.best_rank,
            )
        )

    def _handle(self, request: _Guess | _Rerun) -> Iterator[Any]:
        """In the child: a guess of the next trial, or a what-if rerun."""
        if isinstance(request, _Rerun):
            from slotune.tuner.what_if import rerun

            yield rerun(self.evaluator, request.variant, request.rate)
        else:
            yield from self._guess(request)

    def _guess(self, request: _Guess) -> Iterator[Any]:
        """In the child: draw the next trial in a shadow study, say it, measure it."""
        import optuna

        from slotune.tuner.evaluate import config_key

        shadow = optuna.create_study(
            storage=optuna.storages.InMemoryStorage(),
            sampler=request.sampler,
            directions=request.directions,
        )
        _adopt(request.sampler, shadow)
        shadow.add_trials(request.trials)
        config = self.space.suggest(shadow.ask())
        key = config_key(config)
        yield key
        if key not in request.measured:
            yield self.evaluator.apart(config, request.best)


@dataclass(frozen=True)
class _Guess:
    """What the child needs to draw the next trial: the sampler as it is now, the study's
    trials with the running one told the worst, and the best rank held here."""

    sampler: Any
    directions: list[Any]
    trials: list[Any]
    measured: frozenset[str]  # configurations measured here (by config_key)
    best: tuple[float, ...] | None


@dataclass(frozen=True)
class _Rerun:
    """A what-if rerun for the child: the variant and the load."""

    variant: EngineConfig
    rate: float | None


def _adopt(sampler: Any, shadow: Any) -> None:
    """Let ``sampler`` (a copy, in a child) draw for ``shadow``: TPE's grouped search space
    remembers the one study it serves (Optuna 4-5: ``_group_decomposed_search_space``)."""
    space = getattr(sampler, "_group_decomposed_search_space", None)
    if space is not None and hasattr(space, "_study_id"):
        space._study_id = shadow._study_id
