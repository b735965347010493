"""Optuna studies on any storage URL: create or join, resume, sample, and run workers.

A study carries its ``TuneSetup``, the baseline's measurements and its run settings
(budget, heartbeat) as study user attributes, so any worker (``--n-jobs``, ``slotune
worker`` on another machine, a later ``--resume``) rebuilds the whole experiment from the
storage URL and the study name. Simulation is CPU-bound Python, so parallel workers are
processes sharing the storage. ``--trials`` counts the study's finished trials, across
all workers: a resumed study runs what is missing (see ``worker.py``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotune.tuner.setup import BASELINE_ATTR, RUN_ATTR, SETUP_ATTR, TuneSetup
from slotune.tuner.space import SearchSpace
from slotune.tuner.storage import (
    DEFAULT_PATIENCE_S,
    Heartbeat,
    StudyError,
    default_storage,
    is_journal,
    is_outage,
    open_storage,
    quiet_optuna,
    redact,
    retrying,
    study_lock,
)
from slotune.tuner.worker import Identity, Worker

SAMPLERS = ("tpe", "nsga2", "random", "grid")
DEFAULT_HEARTBEAT_S = 30

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "SAMPLERS",
    "Joined",
    "StudyError",
    "check_same_setup",
    "count_finished",
    "create",
    "create_or_join",
    "default_storage",
    "enqueue_grid",
    "joiner_seed",
    "load",
    "make_sampler",
    "open_storage",
    "quiet_optuna",
    "run_settings",
    "run_worker",
    "run_workers",
    "set_budget",
    "study_lock",
    "study_names",
    "worker_evaluator",
    "write_study_outputs",
]


def study_names(url: str) -> list[str]:
    import optuna

    if url.startswith("sqlite:///") and not Path(url.split("///", 1)[1]).exists():
        return []
    storage = open_storage(url)
    return [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]


@dataclass(frozen=True)
class Joined:
    """A study this process created or joined, with its stored setup and baseline."""

    study: Any
    setup: TuneSetup
    baseline: dict[str, Any]
    created: bool


def create_or_join(
    url: str,
    name: str,
    setup: TuneSetup,
    measure_baseline: Callable[[], tuple[TuneSetup, dict[str, Any]]],
    *,
    trials: int,
    heartbeat: int = DEFAULT_HEARTBEAT_S,
) -> Joined:
    """The study ``name``: created (with the baseline measured and queued, once) by the
    first worker to get the study's lock, joined by the others, who must have the same
    setup (``StudyError`` naming each differing field otherwise)."""
    with study_lock(url, name):
        if name in study_names(url):
            study, stored, baseline = load(url, name)
            check_same_setup(stored, setup, name)
            return Joined(study, stored, baseline, created=False)
        setup, baseline = measure_baseline()
        study = create(url, name, setup, baseline, trials=trials, heartbeat=heartbeat)
        return Joined(study, setup, baseline, created=True)


def check_same_setup(stored: TuneSetup, mine: TuneSetup, name: str) -> None:
    diff = stored.explain_differences(mine)
    if diff:
        raise StudyError(
            f"study {name!r} was created with other settings: {diff}; run with the study's "
            "settings (`slotune worker` reads them from the study)"
        )


def create(
    url: str,
    name: str,
    setup: TuneSetup,
    baseline: dict[str, Any],
    *,
    trials: int | None = None,
    heartbeat: int = DEFAULT_HEARTBEAT_S,
) -> Any:
    import optuna

    from slotune.tuner.trial import DIRECTIONS, METRIC_NAMES

    storage = open_storage(url)
    study = optuna.create_study(
        storage=storage, study_name=name, directions=list(DIRECTIONS[setup.objective])
    )
    study.set_metric_names(list(METRIC_NAMES[setup.objective]))
    study.set_user_attr(SETUP_ATTR, setup.to_dict())
    study.set_user_attr(BASELINE_ATTR, baseline)
    study.set_user_attr(RUN_ATTR, {"trials": trials, "heartbeat": heartbeat})
    enqueue_baseline(study, setup, baseline)
    return study


def enqueue_baseline(study: Any, setup: TuneSetup, baseline: dict[str, Any]) -> None:
    """vLLM's defaults are the first trial when the space holds them: the tuner then never
    recommends worse than the baseline, and the run is already cached. A study of timed
    (steady-state) runs, whose few trials each cost several bursts, then tries the defaults
    with every other KV cache format the space holds: the knob that moves a server's
    capacity most, which a short random start-up rarely pairs with good batch settings."""
    from dataclasses import replace

    from slotune.engine.config import EngineConfig

    if setup.sampler == "grid":
        return
    space = SearchSpace.from_dict(setup.space)
    config = EngineConfig.from_dict(baseline["config"])
    params = space.params_for(config)
    if params is None:
        return
    study.enqueue_trial(params, user_attrs={"baseline": True})
    if setup.load.duration_s is None:
        return
    for dtype in space.params["kv_cache_dtype"].values or ():
        neighbour = space.params_for(replace(config, kv_cache_dtype=dtype))
        if dtype != config.kv_cache_dtype and neighbour is not None:
            study.enqueue_trial(neighbour)


def load_study(name: str, storage: Any, sampler: Any = None) -> Any:
    """``optuna.load_study``, waiting (``retrying``) while the database is unreachable: it
    may go down between opening the storage and this first query."""
    import optuna

    return retrying(
        lambda: optuna.load_study(study_name=name, storage=storage, sampler=sampler),
        f"loading study {name!r}",
    )


def load(url: str, name: str) -> tuple[Any, TuneSetup, dict[str, Any]]:
    """The study, its setup and its baseline (StudyError when it is not a slotune study)."""
    storage = open_storage(url)
    try:
        study = load_study(name, storage)
    except KeyError:
        raise StudyError(f"no study named {name!r} in {redact(url)}") from None
    attrs = study_attrs(study)
    if SETUP_ATTR not in attrs:
        raise StudyError(f"study {name!r} in {redact(url)} was not created by slotune tune")
    return study, TuneSetup.from_dict(attrs[SETUP_ATTR]), attrs.get(BASELINE_ATTR, {})


def study_attrs(study: Any) -> dict[str, Any]:
    """The study's user attributes, waiting (``retrying``) while the database is
    unreachable: a worker reads them as it joins, maybe while the server restarts."""
    attrs: dict[str, Any] = retrying(lambda: study.user_attrs, "reading the study's attributes")
    return attrs


def worker_evaluator(setup: TuneSetup) -> Any:
    """An evaluator with the study's trace loaded on this machine, refused (naming the
    trace) when that trace is not the one the study was created with."""
    from slotune.tuner.evaluate import Evaluator, load_setup_trace
    from slotune.tuner.setup import trace_digest

    try:
        trace = load_setup_trace(setup)
    except (ValueError, OSError) as e:
        raise StudyError(
            f"trace: cannot load the study's trace {setup.trace!r} here ({e})"
        ) from None
    digest = trace_digest(trace)
    if setup.trace_digest and digest != setup.trace_digest:
        raise StudyError(
            f"trace: {setup.trace!r} here is not the study's trace (digest {digest[:12]} here, "
            f"{setup.trace_digest[:12]} in the study); give this machine the same trace file"
        )
    return Evaluator(setup, trace)


def write_study_outputs(url: str, name: str, out_dir: Path) -> Any:
    """``best.json``, ``trials.csv`` and ``runs/`` of a study in any storage, as ``slotune
    tune`` writes them when its study is done (the recommendation and the baseline are
    rerun once, on this machine's copy of the study's trace)."""
    from slotune.tuner.results import write_outputs

    study, setup, baseline = load(url, name)
    return write_outputs(
        out_dir=out_dir,
        study=study,
        setup=setup,
        baseline=baseline,
        evaluator=worker_evaluator(setup),
        storage=url,
    )


def joiner_seed(seed: int) -> int:
    """A sampler seed for a worker that joins a study: its host and process id mixed in,
    so that workers started alike on several machines do not propose the same trials."""
    import hashlib
    import os
    import socket

    text = f"{seed}:{socket.gethostname()}:{os.getpid()}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")


def set_budget(study: Any, trials: int) -> None:
    """Make ``trials`` the study's stored budget (what ``status`` counts against and a
    ``slotune worker`` without ``--trials`` runs to): the last worker to ask sets it."""
    run = dict(study_attrs(study).get(RUN_ATTR) or {})
    if run.get("trials") != trials:
        retrying(
            lambda: study.set_user_attr(RUN_ATTR, {**run, "trials": trials}),
            "storing the trial budget",
        )


def run_settings(study: Any) -> tuple[int | None, int]:
    """The study's stored budget (None: not stored) and heartbeat seconds."""
    run = study_attrs(study).get(RUN_ATTR) or {}
    return run.get("trials"), int(run.get("heartbeat") or DEFAULT_HEARTBEAT_S)


def startup_trials(n_trials: int) -> int:
    """The trials a TPE study of ``n_trials`` draws at random before it models any."""
    return max(3, min(10, n_trials // 4))


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
            n_startup_trials=startup_trials(n_trials),
        )
    if name == "nsga2":
        population = max(4, min(50, n_trials // 5))
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise StudyError(f"--sampler: unknown sampler {name!r}; use one of {', '.join(SAMPLERS)}")


def count_finished(study: Any) -> int:
    """The study's completed trials, waiting (``retrying``) while the database is
    unreachable: a worker counts them as it joins and after each trial."""
    from optuna.trial import TrialState

    return len(
        retrying(
            lambda: study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
            "counting the finished trials",
        )
    )


def enqueue_grid(
    study: Any, space: SearchSpace, seed: int, total: int, *, url: str | None = None
) -> int:
    """Queue grid points (in a seeded shuffle) not yet in the study until ``total`` trials
    are finished or waiting; returns the grid's size. With the study's storage ``url``,
    under the study's lock, so that workers starting together queue each point once."""
    if url is not None:
        with study_lock(url, study.study_name):
            return enqueue_grid(study, space, seed, total)
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
    budget: int,
    worker: int,
    *,
    timeout: float | None = None,
    callbacks: list[Callable[[Any, Any], None]] | None = None,
    evaluator: Any | None = None,
    seed: int | None = None,
    patience: float = DEFAULT_PATIENCE_S,
    alone: bool = False,
) -> None:
    """Run trials of a stored study in this process until it has ``budget`` finished
    trials (reusing ``evaluator``'s loaded trace and cached runs when given). The sampler's
    seed is ``seed``, by default the study's seed plus ``worker``. ``alone``: no other
    worker runs the study, so the next trial can be guessed and measured ahead
    (``ahead.NextTrialAhead``)."""

    from slotune.tuner.ahead import NextTrialAhead
    from slotune.tuner.evaluate import Evaluator
    from slotune.tuner.trial import TrialObjective

    stored, setup, baseline = load(url, name)
    heartbeat = None if is_journal(url) else Heartbeat.every(run_settings(stored)[1])
    storage = open_storage(url, heartbeat)
    seed = setup.seed + worker if seed is None else seed
    sampler = make_sampler(setup.sampler, seed, n_trials=budget)
    study = load_study(name, storage, sampler)
    if evaluator is None or evaluator.setup != setup:
        evaluator = Evaluator(setup)
    space = SearchSpace.from_dict(setup.space)
    ahead = (
        NextTrialAhead(evaluator, space, budget, baseline)
        if alone and NextTrialAhead.applies(setup, 1)
        else None
    )
    objective = TrialObjective(
        setup,
        evaluator,
        space,
        baseline_rung=baseline.get("goodput_rung"),
        worker=worker,
        ahead=ahead,
    )
    try:
        Worker(
            url,
            study,
            storage,
            objective,
            budget,
            identity=Identity.here(worker),
            heartbeat=heartbeat,
            timeout=timeout,
            callbacks=callbacks,
            patience=patience,
        ).run()
    finally:
        if ahead is not None:
            ahead.close()


def _worker_entry(
    url: str, name: str, budget: int, worker: int, timeout: float | None, seed: int | None
) -> None:
    try:
        run_worker(url, name, budget, worker, timeout=timeout, seed=seed)
    except KeyboardInterrupt:
        pass
    except StudyError as e:
        sys.stderr.write(f"slotune: worker {worker}: {e}\n")
        sys.exit(1)


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


def run_workers(
    url: str,
    name: str,
    budget: int,
    n_jobs: int,
    *,
    timeout: float | None = None,
    on_progress: Callable[[Any], None] | None = None,
    evaluator: Any | None = None,
    seed: int | None = None,
    alone: bool = False,
) -> None:
    """Run the study up to ``budget`` finished trials on ``n_jobs`` processes: this one
    and ``n_jobs - 1`` spawned workers (sampler seeds ``seed + i``, by default the study's
    seed + i). ``on_progress(study)`` follows every trial. ``alone``: this command's one
    worker is the study's only one (``run_worker``)."""

    n_jobs = max(1, min(n_jobs, budget))
    ctx = multiprocessing.get_context("spawn")
    children = [
        ctx.Process(
            target=_worker_entry,
            args=(url, name, budget, i, timeout, None if seed is None else seed + i),
            daemon=True,
        )
        for i in range(1, n_jobs)
    ]
    for child in children:
        child.start()
    watcher = load_study(name, open_storage(url))
    interrupted = [False]

    def progress(_study: Any, _trial: Any) -> None:
        if interrupted[0]:
            raise KeyboardInterrupt  # Ctrl-C was pressed during the trial
        if on_progress is not None:
            try:
                on_progress(watcher)
            except Exception as e:  # the display waits for the database; the workers retry
                if not is_outage(e):
                    raise

    try:
        with _noting_interrupts(interrupted):
            run_worker(
                url,
                name,
                budget,
                0,
                timeout=timeout,
                callbacks=[progress],
                evaluator=evaluator,
                seed=seed,
                alone=alone and n_jobs == 1,
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
