"""One worker of a study: claim a trial, run it, record it, until the study's global
budget of finished trials is reached.

Any number of workers, on any machines, can run on one storage at once:

- **Budget.** A worker claims a new trial only while ``finished + running < budget``,
  counting and claiming under the study's lock, so the study ends with exactly ``budget``
  finished trials. While the rest are running elsewhere it waits: if one of them is lost,
  its retry is queued and a waiting worker runs it.
- **Lost workers.** While a trial runs, a thread writes its heartbeat every
  ``heartbeat.interval`` seconds. A trial silent for ``heartbeat.grace`` seconds (its
  worker was killed, its machine lost) is failed by the next worker that claims, and a
  copy with the same parameters is queued (Optuna's ``RetryHeartbeatStaleTrialCallback``).
- **Failing trials.** A trial that raises is recorded as failed, with the error in its
  ``error`` user attribute, and the worker goes on (it stops after
  ``MAX_FAILURES_IN_A_ROW``: that is a bug, not a bad configuration).
- **Outages.** A database that cannot be reached is retried with backoff (see
  ``storage.retrying``); a trial whose result cannot be stored is not lost: it is stored
  once the database is back (or, if its heartbeat went stale meanwhile, its retry runs).
  A trial created by a claim that the outage cut short is given a heartbeat by the next
  claim, goes stale and is retried: it cannot hold a place in the budget for ever.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from slotune.tuner.storage import (
    DEFAULT_PATIENCE_S,
    Heartbeat,
    StorageUnreachable,
    StudyError,
    first_line,
    retrying,
    study_lock,
    watch_unwatched_trials,
)

MAX_FAILURES_IN_A_ROW = 5
_WAIT_POLL_S = 0.5


@dataclass(frozen=True)
class Identity:
    """Who runs a trial, stored on it: the worker's index within its command, its host
    and process id."""

    worker: int
    host: str
    pid: int

    @classmethod
    def here(cls, worker: int) -> Identity:
        return cls(worker, socket.gethostname(), os.getpid())


class NoClaim(Enum):
    """Why a worker did not take a trial."""

    WAIT = "the rest of the budget is running: wait for it (or for the retries of lost trials)"
    DONE = "the study has its finished trials"


class Worker:
    def __init__(
        self,
        url: str,
        study: Any,
        storage: Any,
        objective: Callable[[Any], Any],
        budget: int,
        *,
        identity: Identity,
        heartbeat: Heartbeat | None,
        timeout: float | None = None,
        callbacks: list[Callable[[Any, Any], None]] | None = None,
        patience: float = DEFAULT_PATIENCE_S,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.study = study
        self.storage = storage
        self.objective = objective
        self.budget = budget
        self.identity = identity
        self.heartbeat = heartbeat
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.callbacks = callbacks or []
        self.patience = patience
        self.say = say
        self.failures_in_a_row = 0
        self._study_id: int | None = None
        self._trial_ids: dict[int, int] = {}

    def run(self) -> None:
        while self.deadline is None or time.monotonic() < self.deadline:
            claim = self._retrying(self._claim, "claiming a trial")
            if claim is NoClaim.DONE:
                return
            if claim is NoClaim.WAIT:
                if self.heartbeat is None:
                    return  # without heartbeats a lost trial is never retried: nothing to wait for
                self._notify(None)
                time.sleep(_WAIT_POLL_S)
                continue
            self._notify(self._run_trial(claim))

    def _claim(self) -> Any:
        """Under the study's lock: count, then take a queued or new trial if the budget
        allows (its first heartbeat and owner recorded before the lock is released)."""
        from optuna.storages import fail_stale_trials
        from optuna.trial import TrialState

        if self.heartbeat is not None:
            fail_stale_trials(self.study)
        with study_lock(self.url, self.study.study_name):
            if self.heartbeat is not None:
                watch_unwatched_trials(self.storage, self.study.study_name)
            trials = self.study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)
            )
            done = sum(t.state == TrialState.COMPLETE for t in trials)
            if done >= self.budget:
                return NoClaim.DONE
            if len(trials) >= self.budget:
                return NoClaim.WAIT
            trial = self.study.ask()
            if self.heartbeat is not None:
                self.storage.record_heartbeat(self._trial_id(trial))
            trial.set_user_attr("host", self.identity.host)
            trial.set_user_attr("pid", self.identity.pid)
            return trial

    def _run_trial(self, trial: Any) -> Any:
        from optuna.trial import TrialState

        number = trial.number
        try:
            with self._beating(trial):
                values = self._retrying(lambda: self.objective(trial), f"running trial {number}")
        except (KeyboardInterrupt, StorageUnreachable):
            with contextlib.suppress(Exception):
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            raise
        except Exception as e:
            return self._record_failure(trial, e)
        self.failures_in_a_row = 0
        frozen = self._retrying(lambda: self._tell(trial, values=values), f"storing trial {number}")
        if frozen.state != TrialState.COMPLETE:
            self._say(
                f"trial {number} was declared lost (no heartbeat) while the storage was "
                "unreachable; its retry runs in its place"
            )
        return frozen

    def _record_failure(self, trial: Any, error: Exception) -> Any:
        from optuna.trial import TrialState

        message = f"{type(error).__name__}: {first_line(error)}"
        self._say(f"trial {trial.number} failed ({message}); going on")

        def record() -> Any:
            trial.set_user_attr("error", message)
            return self._tell(trial, state=TrialState.FAIL)

        frozen = self._retrying(record, f"recording the failure of trial {trial.number}")
        self.failures_in_a_row += 1
        if self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
            raise StudyError(
                f"{self.failures_in_a_row} trials in a row failed, the last with {message}; "
                "stopping this worker"
            ) from error
        return frozen

    def _tell(self, trial: Any, **kwargs: Any) -> Any:
        """Finish the trial (skipped if another worker failed it meanwhile, or if this
        call is a retry of one that went through) and return it as stored."""
        self.study.tell(trial, skip_if_finished=True, **kwargs)
        return self.storage.get_trial(self._trial_id(trial))

    @contextlib.contextmanager
    def _beating(self, trial: Any) -> Iterator[None]:
        heartbeat = self.heartbeat
        if heartbeat is None:
            yield
            return
        trial_id = self._trial_id(trial)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(heartbeat.interval):
                with contextlib.suppress(Exception):  # an outage: the next beat retries
                    self.storage.record_heartbeat(trial_id)

        thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _trial_id(self, trial: Any) -> int:
        if trial.number not in self._trial_ids:
            if self._study_id is None:
                self._study_id = self.storage.get_study_id_from_name(self.study.study_name)
            self._trial_ids[trial.number] = self.storage.get_trial_id_from_study_id_trial_number(
                self._study_id, trial.number
            )
        return self._trial_ids[trial.number]

    def _retrying(self, call: Callable[[], Any], what: str) -> Any:
        return retrying(call, what, patience=self.patience, say=self.say)

    def _notify(self, trial: Any) -> None:
        for callback in self.callbacks:
            callback(self.study, trial)

    def _say(self, message: str) -> None:
        import sys

        if self.say is not None:
            self.say(message)
        else:
            sys.stderr.write(f"slotune: {message}\n")
