"""Give freed memory back: a large request body must not raise the server's RSS for good.

glibc's malloc raises its mmap threshold to the size of each large block freed (up to
32 MB), so that after one 10 MB body, later blocks of that size come from the heap and
stay there when freed: the RSS keeps every hostile body's high-water mark. Fixing the
threshold (``mallopt(M_MMAP_THRESHOLD)``) keeps large blocks in their own mappings,
returned on free. Elsewhere than glibc it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from functools import cache
from typing import Any

logger = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 << 10


@cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018  (glibc only)
    except (OSError, AttributeError):
        return None
    return libc


def keep_large_blocks_mapped() -> bool:
    """Blocks from ``MMAP_THRESHOLD_BYTES`` up get their own mapping, returned on free;
    whether the C library took it."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
