"""The tune workflow as one call: ``slotune.tune(...) -> TuneResult``.

Check the options, create the study (measuring vLLM's defaults once) or join it, queue the
grid, run the trials up to the study's global budget, then rerun the recommendation and the
baseline and write ``best.json``, ``trials.csv``, ``runs/`` and the report::

    result = slotune.tune(gpu="h100", slo="ttft=300ms,tpot=50ms", trials=20)
    print(result.config, result.best["goodput_rps"])

The report is a view above the tuner: the caller hands in its builder (``report``;
``slotune.tune`` passes ``slotune.reports.build_report``).

Bad options raise ``TuneInputError`` naming the ``TuneOptions`` field; a study that cannot
be created, joined or finished raises ``StudyError``; Ctrl-C raises ``TuneInterrupted``.
``on_event`` follows the stages and every finished trial (the CLI draws its display from it).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotune.engine.config import EngineConfig
from slotune.outputs import write_failure
from slotune.tuner.prepare import (
    Prepared,
    StudyPlace,
    TuneInputError,
    TuneOptions,
    baseline_config,
    check_places,
    measure_baseline,
    place_study,
    prepare,
)
from slotune.tuner.setup import TuneSetup
from slotune.tuner.storage import StudyError

if TYPE_CHECKING:
    from slotune.tuner.evaluate import Evaluator
    from slotune.tuner.study import Joined


class Stage(Enum):
    BASELINE = "measuring the target engine's defaults (the baseline)"
    TRIALS = "running trials"
    FINISH = "rerunning the recommendation and the baseline for the report"
    VERIFY = "measuring the top configurations on the server (--verify)"


@dataclass(frozen=True)
class StageStarted:
    stage: Stage


@dataclass(frozen=True)
class StageDone:
    stage: Stage


@dataclass(frozen=True)
class StudyReady:
    """The study this call works on, created or joined, before any trial of this call."""

    name: str
    storage: str
    setup: TuneSetup
    baseline: dict[str, Any]
    created: bool
    finished: int  # finished trials already in the study
    budget: int  # finished trials the study should end with (capped by a grid's size)
    grid_size: int | None
    num_requests: int  # requests per run in this machine's trace


@dataclass(frozen=True)
class BestTrial:
    number: int
    score: float | None
    feasible: bool
    goodput_rps: float | None


@dataclass(frozen=True)
class TrialsProgress:
    finished: int  # in the whole study
    start: int  # finished when this call began its trials
    budget: int
    best: BestTrial | None


TuneEvent = StageStarted | StageDone | StudyReady | TrialsProgress


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C: ``stored`` says whether the study exists (and keeps ``finished`` trials)."""

    def __init__(self, storage: str, stored: bool, finished: int) -> None:
        super().__init__(storage, stored, finished)
        self.storage = storage
        self.stored = stored
        self.finished = finished


@dataclass(frozen=True)
class TuneResult:
    study_name: str
    storage: str
    out_dir: Path
    setup: TuneSetup  # as stored in the study
    config: EngineConfig  # the recommendation
    best: dict[str, Any]  # the content of best.json (metrics, baseline, commands, notes)
    baseline: dict[str, Any]  # vLLM's defaults as measured when the study was created
    created: bool
    finished_trials: int
    budget: int
    best_json: Path
    trials_csv: Path
    best_run: Path
    baseline_run: Path
    database: Path | None  # the SQLite file, when the storage is one
    report: Path | None
    report_note: str | None  # why there is no report, when there is none
    verified: Any = None  # the VerifyOutcome of --verify
    verified_stack: Path | None = None  # the stack fitted to the measured runs


ReportBuilder = Callable[[Path], Path]
"""Writes the report of an output folder and returns its path. A builder with a
``read_ahead(out_dir)`` method (``slotune.reports.TuneReport``) has it called in the finish
once the runs are written, while the what-if reruns end."""


def tune(
    options: TuneOptions | None = None,
    /,
    *,
    on_event: Callable[[TuneEvent], None] | None = None,
    report: ReportBuilder | None = None,
    **option_fields: Any,
) -> TuneResult:
    """Run a tuning study; ``options`` or the ``TuneOptions`` fields as keywords. With
    ``report``, write the report of the output folder with it at the end."""
    unknown = sorted(set(option_fields) - {f.name for f in fields(TuneOptions)})
    if unknown:
        raise TypeError(f"tune() got unknown options {unknown}; see the fields of TuneOptions")
    if options is None:
        options = TuneOptions(**option_fields)
    elif option_fields:
        raise TypeError("tune() takes TuneOptions or its fields as keywords, not both")
    check_places(options)
    prepared = prepare(options)
    options = prepared.options
    place = place_study(options, prepared.setup.objective)
    try:
        return _Run(options, prepared, place, on_event or _ignore).run(report)
    except (StudyError, KeyboardInterrupt):
        raise
    except Exception as e:
        why = write_failure(e)
        if why is None:
            raise
        raise StudyError(
            f"cannot write the study or its results ({why}); free some space or choose "
            f"another folder (--out) or storage (--storage)"
        ) from None


def _ignore(_event: TuneEvent) -> None:
    return None


class _Run:
    def __init__(
        self,
        options: TuneOptions,
        prepared: Prepared,
        place: StudyPlace,
        emit: Callable[[TuneEvent], None],
    ) -> None:
        self.options = options
        self.prepared = prepared
        self.place = place
        self.emit = emit
        self.evaluator = self._evaluator(prepared.setup)

    def _evaluator(self, setup: TuneSetup) -> Evaluator:
        """The study's evaluator; a weighted study's holds the best run and the baseline's,
        which the finish writes out instead of running them again."""
        from slotune.tuner.evaluate import Evaluator
        from slotune.tuner.trial import weighted_rank

        evaluator = Evaluator(setup, self.prepared.trace)
        if setup.objective == "weighted":
            evaluator.hold_runs(weighted_rank(setup))
        return evaluator

    def run(self, report: ReportBuilder | None) -> TuneResult:
        # made once, here: every run reads them, and forked children inherit them
        self.prepared.trace.own_prompt_token_ids()
        with _kept_from_collections():
            return self._run(report)

    def _run(self, report: ReportBuilder | None) -> TuneResult:
        from slotune.tuner import study as studies

        joined = self._create_or_join()
        study, setup, baseline = joined.study, joined.setup, joined.baseline
        if not joined.created:
            studies.set_budget(study, self.prepared.trials)
            self.evaluator = self._evaluator(setup)
        budget, grid_size = self.prepared.trials, None
        if setup.sampler == "grid":
            from slotune.tuner.space import SearchSpace

            space = SearchSpace.from_dict(setup.space)
            grid_size = studies.enqueue_grid(
                study, space, setup.seed, self.prepared.trials, url=self.place.storage
            )
            budget = min(budget, grid_size)
        start = studies.count_finished(study)
        self.emit(
            StudyReady(
                self.place.name,
                self.place.storage,
                setup,
                baseline,
                joined.created,
                start,
                budget,
                grid_size,
                len(self.prepared.trace),
            )
        )
        seed = None if joined.created else studies.joiner_seed(setup.seed)
        if budget > start:
            self._optimize(study, setup, baseline, start, budget, seed)
        return self._finish(study, setup, baseline, joined.created, budget, report)

    def _create_or_join(self) -> Joined:
        from slotune.tuner import study as studies

        def baseline() -> tuple[TuneSetup, dict[str, Any]]:
            self.emit(StageStarted(Stage.BASELINE))
            config = baseline_config(self.prepared)
            self.evaluator.pin(config)
            self._measure_ahead(config)
            measured = measure_baseline(self.prepared, self.evaluator)
            self.emit(StageDone(Stage.BASELINE))
            return measured

        try:
            return studies.create_or_join(
                self.place.storage,
                self.place.name,
                self.prepared.setup,
                baseline,
                trials=self.prepared.trials,
                heartbeat=self.options.heartbeat,
            )
        except KeyboardInterrupt:
            raise TuneInterrupted(self.place.storage, stored=False, finished=0) from None

    def _measure_ahead(self, baseline: Any) -> None:
        """A new study's baseline and first trials, measured at once on this machine's
        cores before the study asks for them (``tuner.ahead``)."""
        from slotune.tuner.ahead import can_measure_ahead, first_configs
        from slotune.tuner.forked import cores

        setup, evaluator = self.prepared.setup, self.evaluator
        if not can_measure_ahead(setup, self.options.n_jobs, evaluator.ladder is not None):
            return
        drawn = first_configs(setup, baseline, self.prepared.trials)
        evaluator.measure_ahead([baseline, *drawn], workers=cores())

    def _optimize(
        self,
        study: Any,
        setup: TuneSetup,
        baseline: dict[str, Any],
        start: int,
        budget: int,
        seed: int | None,
    ) -> None:
        from slotune.tuner import study as studies
        from slotune.tuner.results import finished, select_best

        def on_progress(watched: Any) -> None:
            best = select_best(
                finished(watched), setup.objective, setup.attainment, baseline["config"]
            )
            done = studies.count_finished(watched)
            self.emit(TrialsProgress(done, start, budget, _best_trial(best)))

        self.emit(StageStarted(Stage.TRIALS))
        try:
            studies.run_workers(
                self.place.storage,
                self.place.name,
                budget,
                self.options.n_jobs,
                timeout=self.options.timeout,
                on_progress=on_progress if self.emit is not _ignore else None,
                evaluator=self.evaluator,
                seed=seed,
                alone=True,  # the study this command created or resumes
            )
        except KeyboardInterrupt:
            done = studies.count_finished(study)
            raise TuneInterrupted(self.place.storage, stored=True, finished=done) from None
        finally:
            self.emit(StageDone(Stage.TRIALS))

    def _finish(
        self,
        study: Any,
        setup: TuneSetup,
        baseline: dict[str, Any],
        created: bool,
        budget: int,
        report: ReportBuilder | None,
    ) -> TuneResult:
        from slotune.tuner import study as studies
        from slotune.tuner.results import write_outputs

        self.emit(StageStarted(Stage.FINISH))
        try:
            outputs = write_outputs(
                out_dir=self.place.out_dir,
                study=study,
                setup=setup,
                baseline=baseline,
                evaluator=self.evaluator,
                storage=self.place.storage,
                after_writes=getattr(report, "read_ahead", None),
            )
        except ValueError as e:
            raise StudyError(str(e)) from None
        finally:
            self.emit(StageDone(Stage.FINISH))
        verified, stack, best = self._verify(study, setup, baseline, outputs)
        if best is not None:
            outputs = replace(outputs, best=best)
        storage = self.place.storage
        database = Path(storage.split("///", 1)[1]) if storage.startswith("sqlite:///") else None
        built = _build_report(report, self.place.out_dir) if report else "report not asked for"
        return TuneResult(
            study_name=self.place.name,
            storage=storage,
            out_dir=self.place.out_dir,
            setup=setup,
            config=EngineConfig.from_dict(outputs.best["config"]),
            best=outputs.best,
            baseline=baseline,
            created=created,
            finished_trials=studies.count_finished(study),
            budget=budget,
            best_json=outputs.best_json,
            trials_csv=outputs.trials_csv,
            best_run=outputs.best_run,
            baseline_run=outputs.baseline_run,
            database=database,
            report=built if isinstance(built, Path) else None,
            report_note=built if isinstance(built, str) else None,
            verified=verified,
            verified_stack=stack,
        )

    def _verify(
        self, study: Any, setup: TuneSetup, baseline: dict[str, Any], outputs: Any
    ) -> tuple[Any, Path | None, dict[str, Any] | None]:
        """``--verify``: measure the top configurations on the server, re-rank, calibrate;
        the outcome, the fitted stack and the new ``best.json``."""
        o = self.options
        if o.verify is None:
            return None, None, None
        from slotune.tuner import verify as v

        options = v.VerifyOptions(
            o.verify, o.verify_top, o.verify_repeats, o.verify_flags, o.verify_timeout
        )
        self.emit(StageStarted(Stage.VERIFY))
        try:
            out_dir = self.place.out_dir / "verify"
            outcome = v.verify(
                v.candidates_from(study, setup, baseline, o.verify_top),
                evaluator=self.evaluator,
                options=options,
                flags=v.flags_for(options.engine(), setup),
                rate=outputs.best["load"]["rate"],
                out_dir=out_dir,
            )
            best = v.write_outcome(outcome, outputs.best_json)
            stack = None
            if setup.backend == "sim":  # a stack prices simulated runs only
                stack = v.calibrate(outcome, setup, stack_path=out_dir / "stack.json")
        finally:
            self.emit(StageDone(Stage.VERIFY))
        return outcome, stack, best


@contextmanager
def _kept_from_collections() -> Iterator[None]:
    """What this process holds now lives through the tune (the trace and its prompt
    tokens: tens of millions of references on an hour's trace). Python's cyclic collector
    would walk all of it in every full pass, one or two after each run; frozen
    (``gc.freeze``, as CPython advises before forking), it is left out, also in the forked
    children. Handed back to the collector at the end, unless the caller had frozen
    objects of its own (``gc.unfreeze`` hands back all or nothing)."""
    frozen_before = gc.get_freeze_count()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


def _best_trial(trial: Any) -> BestTrial | None:
    if trial is None:
        return None
    attrs = trial.user_attrs
    return BestTrial(
        number=trial.number,
        score=attrs.get("score"),
        feasible=bool(attrs.get("feasible")),
        goodput_rps=attrs.get("goodput_rps"),
    )


def _build_report(build: ReportBuilder, out_dir: Path) -> Path | str:
    try:
        return build(out_dir)
    except Exception as e:  # the report is a view: a failure there must not lose the results
        return f"report.html not written: {e}"


__all__ = [
    "BestTrial",
    "Stage",
    "StageDone",
    "StageStarted",
    "StudyError",
    "StudyReady",
    "TrialsProgress",
    "TuneEvent",
    "TuneInputError",
    "TuneInterrupted",
    "TuneOptions",
    "TuneResult",
    "tune",
]
