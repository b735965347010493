"""Optional dependencies: one place that says which extra brings a missing package.

``pip install slotune`` brings what the simulator, the tuner and the reports need; the real
engine's torch and triton come with ``slotune[engine]``.
"""

from __future__ import annotations

import importlib

_WHAT = {"engine": "the real engine (a model run with torch on this machine)"}


class MissingExtra(ImportError):
    """An optional package is not installed; the message names the extra that brings it."""


def require(module: str, *, extra: str) -> None:
    """Import ``module`` or raise ``MissingExtra`` naming ``slotune[extra]``."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        what = _WHAT.get(extra, f"this feature of slotune[{extra}]")
        raise MissingExtra(
            f"{what} needs {module}, which is not installed here: "
            f"pip install 'slotune[{extra}]' (for a GPU, a CUDA build of torch and "
            f"'slotune[{extra},gpu]')",
            name=module,
        ) from e
