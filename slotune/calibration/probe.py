"""``slotune calibrate --server``: a short fixed probe of a deployment, and its stack.

The probe replays the bundled ShareGPT-like trace at a few closed-loop concurrencies
(``PROBE``: a light, a medium and a heavy load), so it never floods a server whose
capacity is unknown, and keeps each run in ``slotune validate``'s layout. The stack is
then fitted to those runs as ``calibrate --from-runs`` fits it; the simulator needs the
deployment's GPU, model, tensor parallelism and engine settings to replay them, which an
HTTP server does not report, so the caller gives them. The loads send overlapping prompts
(one trace, one seed), and the replays start cold: the server drops its prefix cache
before each load after the first, where it can (a warning names the loads it could not).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slotune.engine.config import EngineConfig

PROBE = ((1, 24), (4, 48), (16, 96))  # (concurrency, requests)
Log = Callable[[str], None]


@dataclass(frozen=True)
class Deployment:
    """What the simulator must know of the server it replays the probe for."""

    gpu: str
    model: str
    tp: int = 1
    config: EngineConfig = field(default_factory=EngineConfig)


def probe(
    url: str,
    deployment: Deployment,
    out_dir: Path,
    *,
    loads: tuple[tuple[int, int], ...] = PROBE,
    seed: int = 0,
    log: Log = lambda _: None,
) -> list[Path]:
    """Run the probe against the server at ``url``; one run folder per load."""
    from slotune.workloads import load_trace
    from slotune.workloads.arrivals import ArrivalSpec
    from slotune.workloads.backends import HttpBackend, run
    from slotune.workloads.server_process import RESET_HINT, reset_prefix_cache, served_model

    backend = HttpBackend(url.rstrip("/"), served_model(url.rstrip("/")))
    dirs = []
    for i, (concurrency, num_requests) in enumerate(loads):
        trace = load_trace("sharegpt-like", num_requests=num_requests, seed=seed)
        if i and reset_prefix_cache(url) is None:
            log(
                f"probe: warning: the server did not drop its prefix cache, so the load of "
                f"{concurrency} may hit the prompts sent before ({RESET_HINT})"
            )
        log(f"probe: {num_requests} requests at concurrency {concurrency}")
        result = run(backend, trace, ArrivalSpec(concurrency=concurrency), None, seed=seed)
        where = out_dir / f"concurrency-{concurrency}"
        result.save(where)
        summary = {
            "model": deployment.model,
            "gpu": deployment.gpu,
            "tp": deployment.tp,
            "config": deployment.config.to_dict(),
            "backend": "http",
            "url": url,
            "arrivals": f"closed loop of {concurrency}",
        }
        (where / "summary.json").write_text(json.dumps(summary, indent=2))
        dirs.append(where)
    return dirs
