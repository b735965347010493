"""Optuna studies on any storage URL: create, resume, sample, and run worker processes.

A study carries its ``TuneSetup`` and the baseline's measurements as study user
attributes, so a worker process (``--n-jobs``) or a later ``--resume`` rebuilds the whole
experiment from the storage URL and the study name. Simulation is CPU-bound Python, so
parallel workers are processes, each with its own sampler seed, sharing the storage.
``--trials`` counts the study's finished trials: a resumed study runs what is missing.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import random
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from slotune.tuner.setup import BASELINE_ATTR, SETUP_ATTR, TuneSetup
from slotune.tuner.space import SearchSpace

SAMPLERS = ("tpe", "nsga2", "random", "grid")
_SQLITE_TIMEOUT_S = 60


class StudyError(ValueError):
    """A study that cannot be created or resumed as asked."""


def quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message=".*SQLite.*")


def default_storage(out_dir: Path) -> str:
    return f"sqlite:///{out_dir / 'study.db'}"


@functools.lru_cache(maxsize=8)
def open_storage(url: str) -> Any:
    """The Optuna storage of ``url``, opened once per process."""
    import optuna

    quiet_optuna()
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        kwargs = {"connect_args": {"timeout": _SQLITE_TIMEOUT_S}}
    else:
        kwargs = {"pool_pre_ping": True}
    try:
        storage = optuna.storages.RDBStorage(_with_driver(url), engine_kwargs=kwargs)
    except Exception as e:  # SQLAlchemy raises many kinds for a bad URL or an unreachable DB
        raise StudyError(f"--storage {url}: cannot open the storage ({_first_line(e)})") from None
    if url.startswith("sqlite"):
        _fast_sqlite(storage.engine)
    return storage


def _fast_sqlite(engine: Any) -> None:
    """Write-ahead log with normal sync: each trial's dozen small commits no longer wait
    for the disk (SQLite's default made a 50-trial study spend ~20 s in fsync), and
    readers do not block the writing workers. A finished trial survives a crash or Ctrl-C
    of the process; only a power loss can drop the last commits."""
    import sqlalchemy

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(engine, "connect", on_connect)
    engine.dispose()


def _with_driver(url: str) -> str:
    """``postgresql://`` with the driver that is installed: SQLAlchemy 2.1 defaults to
    psycopg 3, while the ``postgres`` extra installs psycopg2."""
    import importlib.util

    for prefix in ("postgresql://", "postgres://"):
        if (
            url.startswith(prefix)
            and importlib.util.find_spec("psycopg") is None
            and (importlib.util.find_spec("psycopg2") is not None)
        ):
            return "postgresql+psycopg2://" + url[len(prefix) :]
    return url


def study_names(url: str) -> list[str]:
    import optuna

    if url.startswith("sqlite:///") and not Path(url.split("///", 1)[1]).exists():
        return []
    storage = open_storage(url)
    return [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]


def create(url: str, name: str, setup: TuneSetup, baseline: dict[str, Any]) -> Any:
    import optuna

    from slotune.tuner.trial import DIRECTIONS, METRIC_NAMES

    storage = open_storage(url)
    study = optuna.create_study(
        storage=storage, study_name=name, directions=list(DIRECTIONS[setup.objective])
    )
    study.set_metric_names(list(METRIC_NAMES[setup.objective]))
    study.set_user_attr(SETUP_ATTR, setup.to_dict())
    study.set_user_attr(BASELINE_ATTR, baseline)
    _enqueue_baseline(study, setup, baseline)
    return study


def _enqueue_baseline(study: Any, setup: TuneSetup, baseline: dict[str, Any]) -> None:
    """vLLM's defaults are the first trial when the space holds them: the tuner then never
    recommends worse than the baseline, and the run is already cached."""
    from slotune.engine.config import EngineConfig

    if setup.sampler == "grid":
        return
    params = SearchSpace.from_dict(setup.space).params_for(
        EngineConfig.from_dict(baseline["config"])
    )
    if params is not None:
        study.enqueue_trial(params, user_attrs={"baseline": True})


def load(url: str, name: str) -> tuple[Any, TuneSetup, dict[str, Any]]:
    """The study, its setup and its baseline (StudyError when it is not a slotune study)."""
    import optuna

    storage = open_storage(url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise StudyError(f"no study named {name!r} in {url}") from None
    attrs = study.user_attrs
    if SETUP_ATTR not in attrs:
        raise StudyError(f"study {name!r} in {url} was not created by slotune tune")
    return study, TuneSetup.from_dict(attrs[SETUP_ATTR]), attrs.get(BASELINE_ATTR, {})


def make_sampler(name: str, seed: int, *, n_trials: int) -> Any:
    """TPE is multivariate with grouped subspaces, because the space is conditional."""
    import optuna

    quiet_optuna()
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            constant_liar=True,
            n_startup_trials=max(3, min(10, n_trials // 4)),
        )
    if name == "nsga2":
        population = max(4, min(50, n_trials // 5))
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise StudyError(f"--sampler: unknown sampler {name!r}; use one of {', '.join(SAMPLERS)}")


def count_finished(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def enqueue_grid(study: Any, space: SearchSpace, seed: int, total: int) -> int:
    """Queue grid points (in a seeded shuffle) not yet in the study until ``total`` trials
    are finished or waiting; returns the grid's size."""
    from optuna.trial import TrialState

    from slotune.tuner.evaluate import config_key
    from slotune.tuner.trial import config_key_of

    points = space.grid()
    random.Random(seed).shuffle(points)
    trials = study.get_trials(deepcopy=False)
    seen = {config_key_of(t.user_attrs["config"]) for t in trials if "config" in t.user_attrs}
    seen |= {
        config_key(space.config_from_params(t.params))
        for t in trials
        if t.state == TrialState.WAITING
    }
    planned = sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.WAITING))
    for params in points:
        if planned >= total:
            break
        key = config_key(space.config_from_params(params))
        if key not in seen:
            study.enqueue_trial(params, skip_if_exists=False)
            seen.add(key)
            planned += 1
    return len(points)


def run_worker(
    url: str,
    name: str,
    n_trials: int,
    worker: int,
    *,
    timeout: float | None = None,
    callbacks: list[Callable[[Any, Any], None]] | None = None,
    evaluator: Any | None = None,
) -> None:
    """Run ``n_trials`` trials of a stored study in this process (reusing ``evaluator``'s
    loaded trace and cached runs when given)."""
    import optuna

    from slotune.tuner.evaluate import Evaluator
    from slotune.tuner.trial import TrialObjective

    if n_trials <= 0:
        return
    _, setup, baseline = load(url, name)
    sampler = make_sampler(setup.sampler, setup.seed + worker, n_trials=n_trials)
    study = optuna.load_study(study_name=name, storage=open_storage(url), sampler=sampler)
    if evaluator is None or evaluator.setup != setup:
        evaluator = Evaluator(setup)
    objective = TrialObjective(
        setup,
        evaluator,
        SearchSpace.from_dict(setup.space),
        baseline_rung=baseline.get("goodput_rung"),
        worker=worker,
    )
    study.optimize(objective, n_trials=n_trials, timeout=timeout, callbacks=callbacks or [])


def _worker_entry(url: str, name: str, n_trials: int, worker: int, timeout: float | None) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        run_worker(url, name, n_trials, worker, timeout=timeout)


@contextlib.contextmanager
def _noting_interrupts(interrupted: list[bool]) -> Iterator[None]:
    """The first Ctrl-C only notes the interrupt: the running trial finishes and the
    study stops after it (``progress`` raises KeyboardInterrupt then). A second one
    raises at once. Raising from the first would be unreliable: when the signal lands
    inside a weakref callback or a finalizer (SQLAlchemy and Optuna run many), Python
    prints the KeyboardInterrupt and drops it, and the study would run on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if interrupted[0]:
            signal.default_int_handler(signum, frame)
        interrupted[0] = True
        sys.stderr.write("\nStopping after the running trial (Ctrl-C again stops now).\n")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def split_trials(n_trials: int, n_jobs: int) -> list[int]:
    """Trials per worker: as even as possible, the total exact."""
    n_jobs = max(1, min(n_jobs, n_trials)) if n_trials > 0 else 1
    return [n_trials // n_jobs + (1 if i < n_trials % n_jobs else 0) for i in range(n_jobs)]


def run_workers(
    url: str,
    name: str,
    n_trials: int,
    n_jobs: int,
    *,
    timeout: float | None = None,
    on_progress: Callable[[Any], None] | None = None,
    evaluator: Any | None = None,
) -> None:
    """Run ``n_trials`` more trials on ``n_jobs`` processes: this one and ``n_jobs - 1``
    spawned workers on the same storage. ``on_progress(study)`` follows every trial."""
    import optuna

    quotas = split_trials(n_trials, n_jobs)
    ctx = multiprocessing.get_context("spawn")
    children = [
        ctx.Process(target=_worker_entry, args=(url, name, q, i + 1, timeout), daemon=True)
        for i, q in enumerate(quotas[1:])
    ]
    for child in children:
        child.start()
    watcher = optuna.load_study(study_name=name, storage=open_storage(url))
    interrupted = [False]

    def progress(_study: Any, _trial: Any) -> None:
        if interrupted[0]:
            raise KeyboardInterrupt  # Ctrl-C was pressed during the trial
        if on_progress is not None:
            on_progress(watcher)

    try:
        with _noting_interrupts(interrupted):
            run_worker(
                url, name, quotas[0], 0, timeout=timeout, callbacks=[progress], evaluator=evaluator
            )
            while any(c.is_alive() for c in children):
                progress(None, None)
                time.sleep(0.25)
            progress(None, None)
    finally:
        for child in children:
            if child.is_alive():
                child.join(timeout=5)
            if child.is_alive():
                child.terminate()
    failed = [c.exitcode for c in children if c.exitcode not in (0, None)]
    if failed:
        raise StudyError(f"{len(failed)} worker process(es) failed (exit codes {failed})")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
