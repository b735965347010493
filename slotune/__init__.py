"""slotune: find the LLM serving configuration that best meets your latency SLOs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("slotune")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+local"

__all__ = ["__version__"]
