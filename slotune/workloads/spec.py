"""A workload spec's checks: every number a spec file holds must be usable."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from slotune.workloads.fit import MAX_GROUPS, QUANTILES, SPEC_VERSION
from slotune.workloads.limits import MAX_SECONDS, MAX_TOKENS, check_int, check_seconds


def check_spec(spec: Any) -> None:
    """Every number a spec holds is usable (a hand-edited or corrupted file is an error)."""
    if not isinstance(spec, dict) or spec.get("slotune_spec") != SPEC_VERSION:
        raise ValueError(f'not a slotune workload spec (expected "slotune_spec": {SPEC_VERSION})')
    check_int(spec.get("requests", 1), "requests", minimum=1, maximum=MAX_TOKENS)
    lengths, sessions = spec.get("lengths"), spec.get("sessions")
    if not isinstance(lengths, dict) or not isinstance(sessions, dict):
        raise ValueError("'lengths' and 'sessions' must be objects")
    _check_quantiles(lengths.get("prompt"), "lengths.prompt", MAX_TOKENS)
    _check_quantiles(lengths.get("output"), "lengths.output", MAX_TOKENS)
    _check_quantiles(lengths.get("followup_prompt"), "lengths.followup_prompt", MAX_TOKENS, True)
    rho = lengths.get("prompt_output_spearman", 0.0)
    if isinstance(rho, bool) or not (isinstance(rho, (int, float)) and -1 <= rho <= 1):
        raise ValueError(f"lengths.prompt_output_spearman: expected [-1, 1], got {rho!r}")
    turns = sessions.get("turns")
    if not isinstance(turns, dict) or not turns:
        raise ValueError("sessions.turns: expected {turns: share}")
    for k, v in turns.items():
        if not str(k).isdigit():
            raise ValueError(f"sessions.turns: expected whole numbers of turns, got {k!r}")
        check_int(int(k), "sessions.turns key", minimum=1, maximum=10_000)
        check_seconds(v, "sessions.turns share", maximum=1.0)
    if not sum(turns.values()) > 0:
        raise ValueError("sessions.turns: the shares add up to 0")
    _check_quantiles(sessions.get("think_time_s"), "sessions.think_time_s", MAX_SECONDS, True)
    _check_arrivals(spec.get("arrivals"))
    _check_prefix(spec.get("prefix"))


def _check_quantiles(q: Any, name: str, maximum: float, optional: bool = False) -> None:
    if q is None and optional:
        return
    if not isinstance(q, list) or len(q) != len(QUANTILES):
        raise ValueError(f"{name}: expected {len(QUANTILES)} quantiles")
    values = [check_seconds(v, name, maximum=maximum) for v in q]
    if any(b < a for a, b in pairwise(values)):
        raise ValueError(f"{name}: quantiles must not decrease")


def _check_arrivals(arrivals: Any) -> None:
    if arrivals is None:
        return
    if not isinstance(arrivals, dict):
        raise ValueError("arrivals: expected an object or null")
    for key in ("rate", "burstiness", "period_s"):
        if not check_seconds(arrivals.get(key), f"arrivals.{key}", maximum=MAX_SECONDS) > 0:
            raise ValueError(f"arrivals.{key}: must be > 0")
    profile = arrivals.get("profile")
    if not isinstance(profile, list) or not profile:
        raise ValueError("arrivals.profile: expected a list of relative rates")
    if not sum(check_seconds(p, "arrivals.profile", maximum=1e6) for p in profile) > 0:
        raise ValueError("arrivals.profile: the rates add up to 0")


def _check_prefix(prefix: Any) -> None:
    if prefix is None:
        return
    if not isinstance(prefix, dict):
        raise ValueError("prefix: expected an object or null")
    check_seconds(prefix.get("share", 0.0), "prefix.share", maximum=1.0)
    weights = prefix.get("weights", [])
    if not isinstance(weights, list) or len(weights) > MAX_GROUPS:
        raise ValueError(f"prefix.weights: expected a list of at most {MAX_GROUPS} weights")
    if weights:
        if not sum(check_seconds(w, "prefix.weights", maximum=1.0) for w in weights) > 0:
            raise ValueError("prefix.weights: the weights add up to 0")
        _check_quantiles(prefix.get("shared_len"), "prefix.shared_len", MAX_TOKENS)
        _check_quantiles(prefix.get("suffix_len"), "prefix.suffix_len", MAX_TOKENS)
