"""The metrics a benchmark can be judged on, and reading them from a run's summary."""

from __future__ import annotations

import math
import re
from typing import Any

DISTRIBUTIONS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
SCALARS = (
    "duration_s",
    "request_throughput",
    "output_throughput",
    "completed",
    "failed",
    "num_preemptions",
    "prefix_cache_hit_rate",
    "total_input_tokens",
    "total_output_tokens",
)
NEEDS_SLO = ("slo_attainment", "goodput")
WALL = "wall_s"  # the run's wall-clock seconds, measured by regress (every backend)
_STAT = re.compile(r"^(mean|p(\d+(?:\.\d+)?))$")


def check_metric(name: str, *, backend: str, has_slo: bool) -> str | None:
    """Why ``name`` cannot be judged on this benchmark, or None when it can."""
    if name == WALL or backend == "command":
        return None
    if name in NEEDS_SLO:
        return None if has_slo else f"{name} needs an slo on the benchmark"
    if name in SCALARS:
        return None
    dist, _, stat = name.partition(".")
    if dist in DISTRIBUTIONS:
        m = _STAT.match(stat)
        if m and (m.group(2) is None or float(m.group(2)) <= 100):
            return None
        return f"{dist} takes .mean or .pNN with NN at most 100 (e.g. {dist}.p99), not {stat!r}"
    known = ", ".join([*SCALARS, *NEEDS_SLO, WALL, *(f"{d}.p99" for d in DISTRIBUTIONS)])
    return f"unknown metric {name!r}; known: {known}"


def percentiles_needed(names: list[str]) -> tuple[float, ...]:
    """The percentiles ``summarize`` must compute for these metrics (its defaults kept)."""
    wanted = {50.0, 90.0, 95.0, 99.0}
    for name in names:
        m = _STAT.match(name.partition(".")[2])
        if name.partition(".")[0] in DISTRIBUTIONS and m and m.group(2):
            wanted.add(float(m.group(2)))
    return tuple(sorted(wanted))


def read_metric(data: Any, name: str) -> float | None:
    """The value at the dotted ``name`` (a key may hold dots itself, as ``p99.9`` does;
    list items by index); None when absent or not a finite number."""
    node = _walk(data, name.split("."))
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node) if math.isfinite(node) else None


def _walk(node: Any, parts: list[str]) -> Any:
    if not parts:
        return node
    if isinstance(node, list):
        head = parts[0]
        ok = head.isdigit() and int(head) < len(node)
        return _walk(node[int(head)], parts[1:]) if ok else None
    if isinstance(node, dict):
        for n in range(len(parts), 0, -1):
            key = ".".join(parts[:n])
            if key in node:
                return _walk(node[key], parts[n:])
    return None
