"""One runner, three targets: simulated engine, in-process engine, HTTP endpoint."""

from slotune.workloads.runner.engine_loop import run_engine, run_simulated
from slotune.workloads.runner.http import run_http

__all__ = ["run_engine", "run_http", "run_simulated"]
