"""Where a study stands, read from its storage alone: what ``slotune status`` shows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from slotune.tuner.storage import StudyError, cause_text, is_outage, open_reader, redact

_LAST_ERRORS = 3


@dataclass(frozen=True)
class StudyStatus:
    name: str
    storage: str
    budget: int | None
    done: int
    running: dict[str, int]
    """Running trials per worker host."""
    waiting: int
    failed: int
    retried: int
    """Failed trials whose retry was queued (their worker was lost)."""
    errors: list[str] = field(default_factory=list)
    """The last errors of trials that raised, ``trial N: Error: message``."""
    best: str | None = None
    mean_trial_s: float | None = None
    eta_s: float | None = None


def study_status(url: str, name: str) -> StudyStatus:
    """The study's progress; ``StudyError`` when it cannot be read."""
    import optuna

    try:
        storage = open_reader(url)
        study = optuna.load_study(study_name=name, storage=storage)
        trials = study.get_trials(deepcopy=False)
    except KeyError:
        raise StudyError(f"no study named {name!r} in {redact(url)}") from None
    except StudyError:
        raise
    except Exception as e:
        why = "is unreachable" if is_outage(e) else "cannot be read"
        raise StudyError(f"the storage {redact(url)} {why} ({cause_text(e)})") from None
    return _summarize(study, trials, url, name)


def _summarize(study: Any, trials: list[Any], url: str, name: str) -> StudyStatus:
    from optuna.trial import TrialState

    from slotune.tuner.study import run_settings

    def of(state: Any) -> list[Any]:
        return [t for t in trials if t.state == state]

    complete, running, failed = of(TrialState.COMPLETE), of(TrialState.RUNNING), of(TrialState.FAIL)
    retried: set[int] = set().union(*(t.system_attrs.get("retry_history", []) for t in trials))
    errors = [
        f"trial {t.number}: {t.user_attrs['error']}" for t in failed if "error" in t.user_attrs
    ][-_LAST_ERRORS:]
    durations = [t.duration.total_seconds() for t in complete if t.duration is not None]
    mean = sum(durations) / len(durations) if durations else None
    budget = run_settings(study)[0]
    return StudyStatus(
        name=name,
        storage=redact(url),
        budget=budget,
        done=len(complete),
        running=dict(Counter(str(t.user_attrs.get("host", "?")) for t in running)),
        waiting=len(of(TrialState.WAITING)),
        failed=len(failed),
        retried=sum(t.number in retried for t in failed),
        errors=errors,
        best=_best(study, complete),
        mean_trial_s=mean,
        eta_s=_eta(budget, len(complete), mean, running),
    )


def _eta(budget: int | None, done: int, mean: float | None, running: list[Any]) -> float | None:
    """Trials left times the mean trial time, spread over the workers running now."""
    if budget is None or mean is None:
        return None
    left = max(0, budget - done)
    workers = len({(t.user_attrs.get("host"), t.user_attrs.get("pid")) for t in running}) or 1
    return left * mean / workers


def _best(study: Any, complete: list[Any]) -> str | None:
    from slotune.tuner.results import finished, select_best
    from slotune.tuner.setup import BASELINE_ATTR, SETUP_ATTR

    attrs = study.user_attrs
    setup = attrs.get(SETUP_ATTR)
    if not complete or setup is None:
        return None
    baseline = (attrs.get(BASELINE_ATTR) or {}).get("config")
    best = select_best(finished(study), setup["objective"], setup["attainment"], baseline)
    if best is None:
        return None
    names = study.metric_names or [f"value {i}" for i in range(len(best.values))]
    values = ", ".join(f"{n} {v:.4g}" for n, v in zip(names, best.values, strict=True))
    tag = " (the baseline)" if best.user_attrs.get("baseline") else ""
    return f"trial {best.number}{tag}: {values}"
