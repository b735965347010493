"""Where a workload runs, and the one way to run it there.

A *backend* is where a trace is replayed: the simulator (``SimBackend``: a GPU cost model
on a virtual clock), the embedded engine with a real checkpoint (``EngineBackend``, wall
clock), or any OpenAI-compatible server (``HttpBackend``). It is not a *target* (the
engine a user deploys, see ``slotune.targets``). ``bench``, ``tune``, ``regress`` and
``validate`` all run workloads through ``start``/``run`` here, so the same settings give
the same run whichever command asked for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from slotune.engine.config import EngineConfig
    from slotune.engine.engine import Engine
    from slotune.engine.sim.profile import GpuProfile
    from slotune.engine.sim.stack import StackProfile
    from slotune.workloads.arrivals import ArrivalSpec
    from slotune.workloads.result import RunResult
    from slotune.workloads.trace import Trace

BACKENDS = ("sim", "engine", "http")


@dataclass(frozen=True)
class SimBackend:
    """The simulated engine: ``model`` (a catalogue name or config.json) on ``gpu`` (a
    shipped profile name or a profile), ``tp``/``ep`` GPUs, an optional weight format and
    the serving ``stack`` around the kernels (a name, a JSON file or a profile)."""

    gpu: str | GpuProfile = "h100"
    model: str = "llama-3-8b"
    tp: int = 1
    ep: int = 1
    quantization: str | None = None
    stack: str | StackProfile | None = None

    kind: Literal["sim"] = "sim"

    def engine(self, config: EngineConfig) -> Engine:
        """An engine on this backend's simulated GPU (what ``slotune serve --gpu`` serves)."""
        from slotune.engine.engine import Engine

        return Engine.simulated(
            config,
            gpu=self.gpu,
            model=self.model,
            tp=self.tp,
            stack=self.stack,
            quantization=self.quantization,
            ep=self.ep,
        )

    def describe(self) -> str:
        return f"simulated {self.model} on {self.gpu}" + (f" x{self.tp}" if self.tp > 1 else "")


@dataclass(frozen=True)
class EngineBackend:
    """The embedded engine running the checkpoint in folder ``model`` on this machine."""

    model: str

    kind: Literal["engine"] = "engine"

    def describe(self) -> str:
        return f"embedded engine with {self.model}"


@dataclass(frozen=True)
class HttpBackend:
    """An OpenAI-compatible server at ``url`` serving ``model``."""

    url: str
    model: str
    endpoint: Literal["completions", "chat"] = "completions"
    tokenizer: str | None = None

    kind: Literal["http"] = "http"

    def describe(self) -> str:
        return f"{self.url} ({self.endpoint})"


Backend = SimBackend | EngineBackend | HttpBackend
Progress = Callable[[int, int], None]
Run = Callable[..., "RunResult"]


def make_backend(
    kind: str,
    *,
    gpu: str = "h100",
    model: str = "llama-3-8b",
    tp: int = 1,
    ep: int = 1,
    quantization: str | None = None,
    stack: str | None = None,
    url: str | None = None,
    endpoint: str = "completions",
    tokenizer: str | None = None,
) -> Backend:
    """The backend ``kind`` names (``sim``, ``engine`` or ``http``) with the settings it
    reads; ValueError naming the option at fault."""
    if kind == "sim":
        return SimBackend(gpu, model, tp, ep, quantization, stack)
    if kind == "engine":
        return EngineBackend(model)
    if kind == "http":
        if not url:
            raise ValueError("backend http needs a url (e.g. http://localhost:8000)")
        if endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint: {endpoint!r} is not completions or chat")
        return HttpBackend(url, model, endpoint, tokenizer)  # type: ignore[arg-type]
    raise ValueError(f"backend: {kind!r} is not one of {', '.join(BACKENDS)}")


def start(backend: Backend, config: EngineConfig | None) -> Run:
    """Build what a run on ``backend`` needs (an engine loads its checkpoint here, outside
    any timing) and return the run: ``run(trace, arrivals, *, seed, timeout_s, progress,
    horizon_s)``. ``config`` is None only for an HTTP server (it runs its own)."""
    if isinstance(backend, HttpBackend):
        return _http_run(backend)
    if config is None:
        raise ValueError(f"backend {backend.kind} needs an EngineConfig")
    if isinstance(backend, SimBackend):
        return _sim_run(backend, config)
    from slotune.engine.engine import Engine

    return _engine_run(Engine.local(config, model=backend.model))


def run(
    backend: Backend,
    trace: Trace,
    arrivals: ArrivalSpec,
    config: EngineConfig | None,
    *,
    seed: int = 0,
    timeout_s: float | None = None,
    progress: Progress | None = None,
    horizon_s: float | None = None,
) -> RunResult:
    """Replay ``trace`` at ``arrivals`` on ``backend`` with ``config``: ``timeout_s`` is the
    client's limit per request (None: the backend's default), ``horizon_s`` ends a
    simulated run at that engine time."""
    return start(backend, config)(
        trace, arrivals, seed=seed, timeout_s=timeout_s, progress=progress, horizon_s=horizon_s
    )


def _sim_run(backend: SimBackend, config: EngineConfig) -> Run:
    from slotune.workloads.runner.engine_loop import run_simulated

    def go(trace: Trace, arrivals: ArrivalSpec, **options: Any) -> RunResult:
        return run_simulated(
            config,
            trace,
            gpu=backend.gpu,
            model=backend.model,
            tp=backend.tp,
            stack=backend.stack,
            arrivals=arrivals,
            quantization=backend.quantization,
            ep=backend.ep,
            **options,
        )

    return go


def _engine_run(engine: Engine) -> Run:
    from slotune.workloads.runner.engine_loop import run_engine

    def go(
        trace: Trace, arrivals: ArrivalSpec, *, horizon_s: float | None = None, **options: Any
    ) -> RunResult:
        if horizon_s is not None:
            raise ValueError("horizon_s: only a simulated run ends at a horizon")
        return run_engine(engine, trace, arrivals, **options)

    return go


def _http_run(backend: HttpBackend) -> Run:
    def go(
        trace: Trace,
        arrivals: ArrivalSpec,
        *,
        timeout_s: float | None = None,
        horizon_s: float | None = None,
        **options: Any,
    ) -> RunResult:
        from slotune.workloads.runner.http import run_http

        if horizon_s is not None:
            raise ValueError("horizon_s: only a simulated run ends at a horizon")
        return run_http(
            backend.url,
            trace,
            arrivals,
            model=backend.model,
            endpoint=backend.endpoint,
            tokenizer=backend.tokenizer,
            **options,
            **({} if timeout_s is None else {"timeout_s": timeout_s}),
        )

    return go
