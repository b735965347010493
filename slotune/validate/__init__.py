"""Validation against measured serving runs: read them, replay them, report the error."""

from slotune.validate.replay import Replay, replay
from slotune.validate.report import markdown_table, overall, run_row
from slotune.validate.runs import MeasuredRun, ServerSettings, load_run

__all__ = [
    "MeasuredRun",
    "Replay",
    "ServerSettings",
    "load_run",
    "markdown_table",
    "overall",
    "replay",
    "run_row",
]
