"""``slotune.tune``: the tune workflow with its HTML report.

The reports sit above the tuner (they read its studies), so the workflow takes the report
builder from its caller; this is where the two meet for the Python API and the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slotune.tuner.workflow import TuneEvent, TuneOptions, TuneResult


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
    from slotune.reports import build_report
    from slotune.tuner import workflow

    return workflow.tune(
        options, on_event=on_event, report=build_report if report else None, **option_fields
    )
