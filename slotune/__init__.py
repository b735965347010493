"""slotune: find the LLM serving configuration that best meets your latency SLOs.

``slotune.tune(gpu="h100", slo="ttft=300ms,tpot=50ms")`` runs a study and returns a
``TuneResult`` (see ``slotune.tuner.workflow``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("slotune")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+local"

if TYPE_CHECKING:
    from slotune.tuner.workflow import (
        TuneEvent,
        TuneInputError,
        TuneInterrupted,
        TuneOptions,
        TuneResult,
        tune,
    )

_WORKFLOW = ("TuneEvent", "TuneInputError", "TuneInterrupted", "TuneOptions", "TuneResult", "tune")


def __getattr__(name: str) -> Any:
    """The tune workflow, imported on first use (``import slotune`` stays light)."""
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
