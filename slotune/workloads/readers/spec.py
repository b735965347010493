"""A workload spec (``slotune traces fit``) read as a trace: its requests are synthesized."""

from __future__ import annotations

import json
from pathlib import Path

from slotune.workloads.readers.errors import TraceFormatError, read_text
from slotune.workloads.spec import check_spec
from slotune.workloads.synthesize import synthesize
from slotune.workloads.trace import Trace


def read_spec_trace(path: Path, *, num_requests: int | None, seed: int) -> Trace:
    """``num_requests`` drawn with the spec's statistics (default: as many as were fitted)."""
    try:
        spec = json.loads(read_text(path))
        check_spec(spec)
        trace = synthesize(spec, num_requests or int(spec.get("requests", 1000)), seed=seed)
    except TraceFormatError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise TraceFormatError(path, "line 1", f"bad workload spec: {exc}") from None
    return Trace(name=trace.name, requests=trace.requests, seed=seed, source=f"spec:{path}")
