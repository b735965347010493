"""The what-if reruns of the best trial so far, on a spare core while the trials go on.

The finish reruns the recommendation under each policy its target lacks (``tuner.what_if``).
The trials after the start-up run one at a time, which leaves a core idle: the what-if
reruns of the best trial so far go there, in a forked child (``forked.Background``),
started again whenever another trial becomes the best. At the finish the recommendation's
reruns come from that child when it ran them (waiting for it while it still runs), and are
run then otherwise: the same runs, measured earlier.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.tuner.evaluate import Evaluator, config_key
from slotune.tuner.forked import Background
from slotune.tuner.setup import TuneSetup


class WhatIfAhead:
    def __init__(self, evaluator: Evaluator, setup: TuneSetup, baseline: dict[str, Any]) -> None:
        from slotune.targets import get_target

        self.evaluator = evaluator
        self.setup = setup
        self.baseline = baseline
        self.target = get_target(setup.target)
        self.background = Background()

    @staticmethod
    def applies(setup: TuneSetup, n_jobs: int) -> bool:
        """A core to spare (``ahead.spare_core``; the weighted objective measures trials at
        the load the report uses)."""
        from slotune.tuner.ahead import spare_core

        return spare_core(setup, n_jobs)

    def follow(self, best: Any | None) -> None:
        """After a trial: rerun the what-ifs of ``best`` (the best trial so far) unless
        they already run."""
        if best is None:
            return
        from slotune.tuner.results import report_rate
        from slotune.tuner.what_if import rerun, reruns

        config = EngineConfig.from_dict(best.user_attrs["config"])
        rate = report_rate(self.setup, best, self.baseline)
        key = (config_key(config), rate)
        if key == self.background.key:
            return
        variants = reruns(self.evaluator, self.target, config, best.user_attrs.get("metrics") or {})
        if not variants:
            self.background.cancel()
            return
        evaluator = self.evaluator

        def scores() -> Iterator[dict[str, dict[str, Any]]]:
            yield {config_key(v): rerun(evaluator, v, rate) for v in variants}

        self.background.start(key, scores)

    def known(self, config: EngineConfig, rate: float | None) -> dict[str, dict[str, Any]] | None:
        """The what-if scores of ``config`` at ``rate`` measured ahead (by the variant's
        ``config_key``), once they are; None when another configuration's ran, or none."""
        said, scores = self.background.next((config_key(config), rate))
        self.background.cancel()
        return scores if said else None

    def close(self) -> None:
        self.background.cancel()
