"""``slotune serve``: its options as a typed dataclass, and the one function that builds
the engine they name and serves it.

launch(ServeRequest(gpu="h100", sim_model="llama-3-8b", knobs=EngineKnobs(max_num_seqs=64)))

Bad input raises ``ServeError`` naming the option by its ``slotune serve`` flag (each
field here is the flag of the same name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from slotune.engine.knobs import EngineKnobs, engine_config

DEFAULT_MAX_MODEL_LEN = 8192
"""``max_model_len`` when neither a flag nor ``--config`` sets it: the model's context,
at most this."""


class ServeError(ValueError):
    """Bad input to ``launch``, found before the server listens (or when it cannot)."""


@dataclass(frozen=True)
class ServeRequest:
    """A real checkpoint (``model``, on ``device``) or a simulated ``gpu`` (``sim_model``
    on ``tp`` GPUs, ``stack`` or ``target``'s stack), with ``config`` (a JSON file or
    inline JSON) and ``knobs`` over it, served at ``host``:``port``."""

    model: str | None = None
    gpu: str | None = None
    sim_model: str = "llama-3-8b"
    tp: int = 1
    stack: str | None = None
    target: str | None = None
    device: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_key: str | None = None
    max_queue: int | None = None
    drain_timeout: float = 30.0
    knobs: EngineKnobs = field(default_factory=EngineKnobs)
    config: str | None = None


@dataclass(frozen=True)
class Serving:
    """What ``launch`` serves, told before it starts listening."""

    name: str
    what: str  # "MODEL on DEVICE" or "simulated MODEL on GPU xTP"
    url: str
    max_model_len: int
    num_gpu_blocks: int
    block_size: int


def launch(request: ServeRequest, on_ready: Callable[[Serving], None] | None = None) -> None:
    """Build the engine ``request`` names, tell ``on_ready``, and serve until stopped."""
    from slotune.server.app import serve
    from slotune.server.served import local_model, simulated_model
    from slotune.targets import resolve_stack

    r = request
    if (r.model is None) == (r.gpu is None):
        raise ServeError("give either --model PATH (a real checkpoint) or --gpu G [--sim-model M]")
    if r.max_queue is not None and r.max_queue < 0:
        raise ServeError(f"--max-queue must be >= 0 (got {r.max_queue})")
    if not r.drain_timeout >= 0:
        raise ServeError(f"--drain-timeout must be >= 0 seconds (got {r.drain_timeout})")
    try:
        stack = resolve_stack(r.stack, r.target)
    except ValueError as exc:
        raise ServeError(f"--target: {exc}") from None
    try:
        config = engine_config(r.config, r.knobs, lambda: _model_max_len(r.model, r.sim_model))
        if r.model is not None:
            engine, served = local_model(
                config, r.model, served_model_name=r.served_model_name, device=r.device
            )
            what = f"{r.model} on {r.device}"
        else:
            engine, served = simulated_model(
                config,
                gpu=r.gpu or "",
                model=r.sim_model,
                tp=r.tp,
                served_model_name=r.served_model_name,
                stack=stack,
            )
            what = f"simulated {r.sim_model} on {r.gpu}" + (f" x{r.tp}" if r.tp > 1 else "")
    except (ValueError, FileNotFoundError) as exc:
        raise ServeError(str(exc)) from None
    if on_ready is not None:
        url = f"http://{r.host}:{r.port}/v1"
        blocks = engine.capacity.num_gpu_blocks
        on_ready(Serving(served.name, what, url, config.max_model_len, blocks, config.block_size))
    try:
        serve(
            engine,
            served,
            host=r.host,
            port=r.port,
            api_key=r.api_key,
            max_queue=r.max_queue,
            drain_timeout_s=r.drain_timeout,
        )
    except OSError as exc:
        raise ServeError(f"--host/--port: cannot listen on {r.host}:{r.port}: {exc}") from None


def _model_max_len(model: str | None, sim_model: str) -> int:
    if model is not None:
        from slotune.server.served import checkpoint_max_len

        length = checkpoint_max_len(model)
    else:
        from slotune.engine.sim.models import get_model

        try:
            length = get_model(sim_model).max_position_embeddings
        except ValueError:
            length = None
    return min(length or DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)
