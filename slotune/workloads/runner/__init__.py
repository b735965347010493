"""One runner, three targets: simulated engine, in-process engine, HTTP endpoint."""

from typing import TYPE_CHECKING, Any

from slotune.workloads.runner.engine_loop import run_engine, run_simulated

if TYPE_CHECKING:
    from slotune.workloads.runner.http import run_http


def __getattr__(name: str) -> Any:
    """``run_http`` on first use: a simulated run does not pay for asyncio."""
    if name == "run_http":
        from slotune.workloads.runner.http import run_http

        return run_http
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["run_engine", "run_http", "run_simulated"]
