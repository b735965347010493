"""The installed slotune's version, for any layer to stamp on what it writes."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("slotune")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+local"
