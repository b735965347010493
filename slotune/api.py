"""``slotune.tune`` and ``slotune.bench``: the tune workflow and a bench run, each with its
HTML report.

The reports sit above the tuner and the workloads (they read their results), so the
workflow and the bench take the report builder from their caller; this is where they meet
for the Python API and the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slotune.tuner.workflow import TuneEvent, TuneOptions, TuneResult
    from slotune.workloads.bench import BenchOutcome, BenchRequest, BenchView


def tune(
    options: TuneOptions | None = None,
    /,
    *,
    on_event: Callable[[TuneEvent], None] | None = None,
    report: bool = True,
    **option_fields: Any,
) -> TuneResult:
    """Run a tuning study (see ``slotune.tuner.workflow.tune``) and, unless ``report`` is
    False, write its ``report.html``."""
    from slotune.reports import TuneReport
    from slotune.tuner import workflow

    return workflow.tune(
        options, on_event=on_event, report=TuneReport() if report else None, **option_fields
    )


def bench(request: BenchRequest, view: BenchView | None = None) -> BenchOutcome:
    """Run one benchmark (see ``slotune.workloads.bench.run_bench``); with ``request.out``,
    write its ``report.html`` beside the run."""
    from slotune.reports import build_bench_report
    from slotune.workloads.bench import run_bench

    return run_bench(request, view, report=build_bench_report)
