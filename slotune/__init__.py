"""slotune: find the LLM serving configuration that best meets your latency SLOs.

``slotune.tune(gpu="h100", slo="ttft=300ms,tpot=50ms")`` runs a study and returns a
``TuneResult`` (see ``slotune.tuner.workflow``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotune._version import __version__

if TYPE_CHECKING:
    from slotune.api import tune
    from slotune.tuner.workflow import (
        TuneEvent,
        TuneInputError,
        TuneInterrupted,
        TuneOptions,
        TuneResult,
    )

_WORKFLOW = ("TuneEvent", "TuneInputError", "TuneInterrupted", "TuneOptions", "TuneResult", "tune")


def __getattr__(name: str) -> Any:
    """The tune workflow, imported on first use (``import slotune`` stays light)."""
    if name == "tune":
        from slotune.api import tune

        return tune
    if name in _WORKFLOW:
        from slotune.tuner import workflow

        return getattr(workflow, name)
    raise AttributeError(f"module 'slotune' has no attribute {name!r}")


__all__ = [
    "TuneEvent",
    "TuneInputError",
    "TuneInterrupted",
    "TuneOptions",
    "TuneResult",
    "__version__",
    "tune",
]
