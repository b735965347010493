"""What-if: what the user would gain from a scheduling policy their engine does not run.

The recommendation is for the target engine (vLLM, SGLang), which cannot run slotune's own
policies (hybrid preemption, tier quotas, the decode budget, adaptive chunking). For each
such policy this reruns the recommended configuration with the policy switched on, in the
embedded engine's simulator at the report's load, and records both runs' scores: the gain
an engine that had it would bring. Policy settings (one each, not searched):

- hybrid preemption: ``preemption_mode="hybrid"`` at the default swap threshold;
- tier quotas (traces with two or more tiers): 20 % of the KV blocks and of each step's
  token budget reserved for tier 0;
- decode budget: the SLO's TPOT target (50 ms without one);
- adaptive chunking: the SLO's TPOT target, the budget ceiling at least 8192 tokens.

Hybrid preemption and the decode budget act on preempted requests only: when the
recommended run preempted none, their run is that run (not rerun). The stretch planner
plans hybrid preemption, adaptive chunking and the decode budget;
tier quotas rerun one step at a time, a few times a trial's cost. The reruns go in forked
processes (``tuner.forked``), as many at once as the machine has cores, while the tune's
finish writes its runs; the first may have started during the last trial
(``RerunAhead``, ``ahead.NextTrialAhead``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.tuner.forked import ForkedMap, cores

ADAPTIVE_CEILING = 8192
_ON_PREEMPTION = ("hybrid preemption", "decode budget")  # change nothing without preemption
TIER_SHARE = 0.2
DEFAULT_TPOT_MS = 50.0


@dataclass(frozen=True)
class Policy:
    name: str
    settings: dict[str, Any]


def policies(config: EngineConfig, tpot_ms: float | None, tiered: bool) -> list[Policy]:
    """The policies to try on ``config`` (each as the fields it changes)."""
    tpot = tpot_ms or DEFAULT_TPOT_MS
    out = [
        Policy("hybrid preemption", {"preemption_mode": "hybrid"}),
        Policy("decode budget", {"decode_budget_ms": tpot}),
        Policy(
            "adaptive chunking",
            {
                "adaptive_chunk_ms": tpot,
                "max_num_batched_tokens": max(config.max_num_batched_tokens, ADAPTIVE_CEILING),
            },
        ),
    ]
    if tiered:
        out.append(
            Policy(
                "tier quotas",
                {"top_tier_kv_share": TIER_SHARE, "top_tier_token_share": TIER_SHARE},
            )
        )
    return out


def _scores(summary: dict[str, Any], score: float) -> dict[str, Any]:
    tiers = summary.get("tiers") or {}
    return {
        "slo_attainment": summary.get("slo_attainment"),
        "goodput": summary.get("goodput"),
        "ttft_p99_ms": (summary.get("ttft_ms") or {}).get("p99"),
        "tpot_p99_ms": (summary.get("tpot_ms") or {}).get("p99"),
        "score": score,
        "tiers": {t: s.get("slo_attainment") for t, s in tiers.items()},
    }


def what_if(
    evaluator: Any,
    target: Any,
    config: EngineConfig,
    summary: dict[str, Any],
    rate: float | None,
    meanwhile: Callable[[], object] | None = None,
) -> dict[str, Any] | None:
    """Each policy ``target`` does not run, rerun on ``config`` in the simulator: ``{"base":
    scores of config, "policies": [{"name", "settings", "scores"} or {"name", "skipped"}]}``;
    None when there is nothing to ask (the target runs every policy, or the study runs a
    real engine, whose runs are not the simulator's). The reruns go on the machine's
    cores, as many at once as it has (``forked.ForkedMap``), while this process calls
    ``meanwhile`` (the tune's finish writes its runs), which is called in every case."""
    if evaluator.setup.backend != "sim":
        if meanwhile is not None:
            meanwhile()
        return None
    base = _scores(summary, evaluator.measurement(summary, rate).score)
    results, pending = _rows(evaluator, target, config, summary, base)
    variants = [variant for _, variant in pending]
    ahead = _take_ahead(evaluator, variants, rate)
    rest = [v for i, v in enumerate(variants) if ahead is None or i != ahead[0]]
    with ForkedMap(partial(rerun, evaluator, rate=rate), rest, cores()) as reruns:
        if meanwhile is not None:
            meanwhile()
        scores = reruns.results()
    if ahead is not None:
        i, started = ahead
        scores.insert(i, started.scores() or rerun(evaluator, variants[i], rate))
    for (row, _), row_scores in zip(pending, scores, strict=True):
        row["scores"] = row_scores
    if not results:
        return None
    return {"target": target.name, "rate": rate, "base": base, "policies": results}


@dataclass(frozen=True)
class RerunAhead:
    """A rerun started before the finish: the variant's ``config_key``, the load, and the
    forked child (``forked.Server``) that says its scores."""

    key: str
    rate: float | None
    server: Any

    def scores(self) -> dict[str, Any] | None:
        """Its scores, waited for (None: the child failed); the child ends then."""
        said, scores = self.server.next()
        if said:
            self.server.next()  # the end of its answer
        self.server.kill()
        return scores if said else None


def rerun_variants(
    evaluator: Any, target: Any, config: EngineConfig, summary: dict[str, Any]
) -> list[EngineConfig]:
    """The variants of ``config`` that ``what_if`` reruns, given its run's ``summary``."""
    return [variant for _, variant in _rows(evaluator, target, config, summary, {})[1]]


def _take_ahead(
    evaluator: Any, variants: list[EngineConfig], rate: float | None
) -> tuple[int, RerunAhead] | None:
    """The rerun started ahead, if it is one of ``variants`` at ``rate``: its index there,
    and it (one that is not is ended)."""
    from slotune.tuner.evaluate import config_key

    started, evaluator.rerun_ahead = evaluator.rerun_ahead, None
    if started is None:
        return None
    for i, variant in enumerate(variants):
        if started.rate == rate and config_key(variant) == started.key:
            return i, started
    started.server.kill()
    return None


def rerun(evaluator: Any, variant: EngineConfig, rate: float | None) -> dict[str, Any]:
    """The scores of ``variant``'s run at ``rate``."""
    run = evaluator.summarize(evaluator.run(variant, rate), rate)
    return _scores(run, evaluator.measurement(run, rate).score)


def _rows(
    evaluator: Any,
    target: Any,
    config: EngineConfig,
    summary: dict[str, Any],
    base: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], EngineConfig]]]:
    """Each policy's row (those not rerun complete: skipped, or ``base`` where it changes
    nothing) and the rows to complete by a rerun, with the variant to run."""
    tpot = evaluator.targets_ms.get("tpot")
    tiered = len({r.tier for r in evaluator.trace.requests}) > 1
    results: list[dict[str, Any]] = []
    todo: list[tuple[dict[str, Any], EngineConfig]] = []
    for policy in policies(config, tpot, tiered):
        try:
            variant = replace(config, **policy.settings)
        except ValueError as exc:
            results.append({"name": policy.name, "settings": policy.settings, "skipped": str(exc)})
            continue
        if not target.problems(variant):
            continue  # the target runs it: the search could choose it
        row: dict[str, Any] = {"name": policy.name, "settings": policy.settings}
        results.append(row)
        if policy.name in _ON_PREEMPTION and not summary.get("num_preemptions"):
            row.update(scores=base, same=True)
        else:
            todo.append((row, variant))
    return results, todo
