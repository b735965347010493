"""What a benchmark measures, as opposed to what it judges: the backend, the GPU, the
model, the simulated stack and the trace. A result records it; a baseline measured on
anything else is not comparable (another GPU makes every figure "improved" or
"regressed"), so ``mismatches`` refuses it, before the suite runs for what the suite
file says, and after for what only the run finds out (the real GPU of an engine run).

The configuration, the load and the SLO are not part of it: changing them is what a
regression check is for. A file (a trace, a GPU profile, a model's config.json) is
identified by its name and content, not by its path, so a baseline recorded in another
checkout still matches.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from slotune.regress.suite import Benchmark

MEASURED_GPU = "gpu"
"""The field an engine run fills in after it runs: the device it ran on."""


def planned(bench: Benchmark) -> dict[str, Any]:
    """What ``bench`` measures, known from the suite alone."""
    trace = bench.trace
    out: dict[str, Any] = {"backend": bench.backend}
    if bench.backend == "command":
        out["command"] = bench.command
        return out
    if bench.backend == "sim":
        from slotune.engine.sim.stack import DEFAULT_STACK

        out.update(
            gpu=_named(bench.gpu),
            tp=bench.tp,
            stack=_named(bench.stack) if bench.stack else DEFAULT_STACK,
        )
        if bench.ep != 1 or bench.quantization:
            out.update(ep=bench.ep, quantization=bench.quantization)
    out["model"] = _named(bench.model)
    if bench.backend == "http":
        out.update(endpoint=bench.endpoint)
    out.update(
        {
            "trace": _named(trace.name),
            "trace.format": trace.format,
            "trace.num_requests": trace.num_requests,
            "trace.multi_turn": trace.multi_turn,
            "trace.tokenizer": _named(trace.tokenizer) if trace.tokenizer else None,
        }
    )
    return out


def measured(bench: Benchmark) -> dict[str, Any]:
    """``planned`` plus what the run found: the device of an engine run."""
    out = planned(bench)
    if bench.backend == "engine":
        out[MEASURED_GPU] = _device_name()
    return out


class NotComparable(ValueError):
    """A baseline that measured something else than this suite or run."""


def check_comparable(
    baseline: Any, identities: dict[str, dict[str, Any] | None], where: str = "this suite"
) -> None:
    """``NotComparable`` unless the ``baseline`` (a ``SuiteResult``) shares a benchmark
    with ``identities`` (benchmark name -> identity) and measured each shared one alike."""
    base = baseline.by_name()
    shared = [name for name in identities if name in base]
    if not shared:
        raise NotComparable(
            f"the baseline is from another suite ({baseline.suite}): it has none of the "
            f"benchmarks of {where} ({_names(list(identities))}; baseline: "
            f"{_names(list(base))})"
        )
    problems = [
        f"{name}: {', '.join(found)}"
        for name in shared
        if (found := mismatches(base[name].identity, identities[name]))
    ]
    if problems:
        raise NotComparable(
            "the baseline measured something else; record it again with `slotune regress "
            f"baseline` on this setup: {'; '.join(problems)}"
        )


def mismatches(baseline: dict[str, Any] | None, current: dict[str, Any] | None) -> list[str]:
    """``key (baseline: A; here: B)`` for each field both know and disagree on; a field
    only one side has (the device, before the run) is not compared. A baseline without
    an identity (recorded before slotune recorded one) cannot vouch for one."""
    if current is None:
        return []
    if baseline is None:
        return ["it records no identity (GPU, model, trace)"]
    return [
        f"{key} (baseline: {baseline[key]}; here: {current[key]})"
        for key in sorted(set(baseline) & set(current))
        if baseline[key] != current[key]
    ]


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _named(value: str) -> str:
    """A name as is; an existing file as ``name@sha256:<12 hex>`` of its content."""
    path = Path(value)
    if not path.is_file():
        return value
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"{path.name}@sha256:{digest.hexdigest()[:12]}"


def _device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return "cpu"
