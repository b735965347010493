"""``slotune worker`` and ``slotune status``: join a stored study from any machine, and see
where it stands."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from slotune.cli.app import app
from slotune.cli.common import fail, opt

_console = Console()

Storage = Annotated[str, opt("--storage", "Optuna storage URL of the study.")]
StudyName = Annotated[str, opt("--study-name", "The study's name.")]


@app.command()
def worker(
    storage: Storage,
    study_name: StudyName,
    trials: Annotated[
        int | None,
        opt(
            "--trials",
            "Finished trials the study should have, across all its workers "
            "(default: what its creator asked for).",
        ),
    ] = None,
    n_jobs: Annotated[int, opt("--n-jobs", "Worker processes on this machine.")] = 1,
    timeout: Annotated[float | None, opt("--timeout", "Stop new trials after N seconds.")] = None,
) -> None:
    """Run trials of an existing study, with the settings stored in it."""
    import socket

    from slotune.tuner import study as studies

    if trials is not None and trials < 1:
        fail(f"--trials must be at least 1 (got {trials})")
    if n_jobs < 1:
        fail(f"--n-jobs must be at least 1 (got {n_jobs})")
    if timeout is not None and timeout <= 0:
        fail(f"--timeout must be positive seconds (got {timeout})")
    _check_storage(storage)
    try:
        study, setup, _ = studies.load(storage, study_name)
        budget = trials or studies.run_settings(study)[0]
        if budget is None:
            fail(f"--trials: study {study_name!r} stores no trial budget; give --trials")
        evaluator = studies.worker_evaluator(setup)
        studies.set_budget(study, budget)
    except studies.StudyError as e:
        fail(str(e))
    done = studies.count_finished(study)
    _console.print(
        f"Worker on [bold]{socket.gethostname()}[/bold] joins study [bold]{study_name}[/bold]: "
        f"{setup.model} on {setup.gpu}, SLO {setup.slo}, objective {setup.objective}; "
        f"{done} of {budget} trials finished.",
        highlight=False,
    )
    seen = [done]

    def on_progress(watched: Any) -> None:
        now = studies.count_finished(watched)
        if now != seen[0]:
            seen[0] = now
            _console.print(f"  {now} of {budget} trials finished", highlight=False)

    try:
        studies.run_workers(
            storage,
            study_name,
            budget,
            n_jobs,
            timeout=timeout,
            on_progress=on_progress,
            evaluator=evaluator,
            seed=studies.joiner_seed(setup.seed),
        )
    except KeyboardInterrupt:
        Console(stderr=True).print("\nInterrupted: the finished trials are kept in the study.")
        raise typer.Exit(130) from None
    except studies.StudyError as e:
        fail(str(e))
    except Exception as e:  # the disk filled up meanwhile: one line, not a traceback
        from slotune.outputs import write_failure

        why = write_failure(e)
        if why is None:
            raise
        fail(f"--storage: cannot write the study ({why})")
    _print_status(storage, study_name)


def _check_storage(url: str) -> None:
    """Before any trial: a SQLite or journal file the worker can write to."""
    from slotune.outputs import OutputError
    from slotune.tuner.storage import check_writable

    try:
        check_writable(url)
    except OutputError as e:
        fail(f"--storage: {e}")


@app.command()
def status(storage: Storage, study_name: StudyName) -> None:
    """Trials done, running (per host), failed, the best so far and the time left."""
    _print_status(storage, study_name)


def _print_status(storage: str, study_name: str) -> None:
    from slotune.tuner.status import study_status
    from slotune.tuner.storage import StudyError

    try:
        s = study_status(storage, study_name)
    except StudyError as e:
        fail(str(e))
    budget = f" of {s.budget}" if s.budget is not None else ""
    running = ", ".join(f"{n} on {host}" for host, n in sorted(s.running.items())) or "none"
    lines = [
        f"Study [bold]{s.name}[/bold] in {s.storage}",
        f"  done:     {s.done}{budget} trials",
        f"  running:  {running}",
        f"  waiting:  {s.waiting}",
        f"  failed:   {s.failed} ({s.retried} lost by their worker and queued again)",
        f"  best:     {s.best or 'none yet'}",
    ]
    if s.mean_trial_s is not None:
        eta = "" if not s.eta_s else f"; about {_duration(s.eta_s)} left"
        lines.append(f"  time:     {s.mean_trial_s:.1f} s per trial{eta}")
    lines += [f"  error:    {e}" for e in s.errors]
    for line in lines:
        _console.print(line, highlight=False)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
