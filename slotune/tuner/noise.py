"""Is the recommendation better than the baseline beyond run-to-run noise?

The study measures every configuration once, at the study's seed. Before a change is
recommended, the best trial and the baseline are measured again at ``NOISE_SEEDS`` more
seeds (other arrival times and sampled outputs on the same requests), with the study's
objective: the goodput search (max SLO-meeting rate) for ``goodput`` and ``pareto``
studies, the weighted score at the study's load for ``weighted`` ones. The gain is real
only when every sample of the recommendation beats every sample of the baseline (the
ranges of the two do not overlap); otherwise the recommendation is to keep the defaults.
The noise band reported is the baseline's spread, relative to its median. Where the seed
changes nothing (a simulated run on a load that draws no arrival times, such as the trace's
own timestamps), the other seeds' samples are the study's own runs (``Verdict.same_runs``):
three equal samples, a band of 0, and no rerun. Simulated reruns go at once, in forked
processes (``tuner.forked``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from slotune.engine.config import EngineConfig

NOISE_SEEDS = 2
"""Seeds beyond the study's: three samples per configuration in all."""


@dataclass(frozen=True)
class Verdict:
    metric: str  # "goodput_rps" or "score"
    higher_is_better: bool
    best: tuple[float, ...]  # the recommendation's samples, the study's seed first
    baseline: tuple[float, ...]
    seeds: tuple[int, ...]
    same_runs: bool = False  # the seeds change nothing: one run per configuration stands for all

    @property
    def significant(self) -> bool:
        if self.higher_is_better:
            return min(self.best) > max(self.baseline)
        return max(self.best) < min(self.baseline)

    @property
    def band(self) -> float:
        """The baseline's spread over its median (0.04: samples within 4 %)."""
        mid = statistics.median(self.baseline)
        return (max(self.baseline) - min(self.baseline)) / mid if mid else 0.0

    @property
    def gain(self) -> float | None:
        """Median over median, less one (lower score is better: the reduction)."""
        ours, theirs = statistics.median(self.best), statistics.median(self.baseline)
        if not theirs:
            return None
        return ours / theirs - 1 if self.higher_is_better else 1 - ours / theirs

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "best": list(self.best),
            "baseline": list(self.baseline),
            "seeds": list(self.seeds),
            "band": self.band,
            "gain": self.gain,
            "significant": self.significant,
            "same_runs": self.same_runs,
        }


def judge(
    evaluator: Any,
    best: EngineConfig,
    baseline: EngineConfig,
    first: tuple[float, float],
    start_rungs: tuple[int | None, int | None] = (None, None),
) -> Verdict:
    """Measure ``best`` and ``baseline`` at ``NOISE_SEEDS`` more seeds; ``first`` holds
    their values at the study's seed (already measured), ``start_rungs`` the rungs their
    goodput searches found there (each search at another seed starts from its own)."""
    from slotune.tuner.evaluate import Evaluator

    setup = evaluator.setup
    by_rate = setup.objective in ("goodput", "pareto") and evaluator.ladder is not None
    seeds = tuple(setup.seed + i for i in range(NOISE_SEEDS + 1))
    ours, theirs = [first[0]], [first[1]]
    # where the seed changes nothing, the study's evaluator (and the runs it holds) stands
    # for the other seeds: the samples are the same runs, not rerun
    same = evaluator.seed_free
    pairs = ((best, ours, start_rungs[0]), (baseline, theirs, start_rungs[1]))

    def sample(job: tuple[int, int]) -> float:
        seed, which = job
        config, _, start = pairs[which]
        other = evaluator if same else Evaluator(replace(setup, seed=seed), evaluator.trace)
        if by_rate:
            assert other.ladder is not None
            rung = start if start is not None else other.ladder.rung(16.0)
            return other.goodput(config, rung, exact=True).value
        return other.measure(config).score

    jobs = [(seed, which) for seed in seeds[1:] for which in range(len(pairs))]
    if not same and setup.backend == "sim":  # independent simulated runs: all at once
        from slotune.tuner.forked import map_forked

        values = map_forked(sample, jobs)
    else:  # the study's own runs, or a real engine's (never timed against each other)
        values = [sample(job) for job in jobs]
    for (_, which), value in zip(jobs, values, strict=True):
        pairs[which][1].append(value)
    metric = "goodput_rps" if by_rate else "score"
    return Verdict(metric, by_rate, tuple(ours), tuple(theirs), seeds, same)
