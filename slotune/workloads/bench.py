"""One benchmark run, as ``slotune bench`` does it: the options as typed dataclasses, the
run on its backend (``backends.run``) and the summary it writes.

bench = run_bench(BenchRequest(model="llama-3-8b", trace=TraceOptions(num_requests=200),
                               load=LoadOptions(rate=8), slo="ttft=300ms,tpot=50ms",
                               knobs=EngineKnobs(max_num_seqs=64)))
bench.summary["slo_attainment"]

Bad input raises ``BenchError`` naming the option at fault by its ``slotune bench`` flag
(each field here is the flag of the same name). ``slotune.api.bench`` adds the report.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from slotune.engine.knobs import EngineKnobs

if TYPE_CHECKING:
    from slotune.engine.config import EngineConfig
    from slotune.workloads.arrivals import ArrivalSpec
    from slotune.workloads.backends import Backend
    from slotune.workloads.result import RunResult
    from slotune.workloads.trace import Trace

Progress = Callable[[int, int], None]


class BenchError(ValueError):
    """Bad input to a bench, found before or while it runs; the message names the option
    by its flag (``--slo: ...``)."""


@dataclass(frozen=True)
class TraceOptions:
    """Which requests: ``name`` is a bundled trace or a file (``--trace``)."""

    name: str = "sharegpt-like"
    format: str | None = None
    num_requests: int | None = None
    multi_turn: bool = False
    tokenizer: str | None = None


@dataclass(frozen=True)
class LoadOptions:
    """When the requests arrive, and which of them are scored (``warmup``/``cooldown``)."""

    rate: float | None = None
    burstiness: float = 1.0
    constant: bool = False
    concurrency: int | None = None
    timestamps: bool = False
    time_scale: float = 1.0
    stages: str | None = None
    duration: float | None = None
    warmup: float = 0.0
    cooldown: float = 0.0

    def arrivals(self) -> ArrivalSpec:
        from slotune.workloads.arrivals import ArrivalSpec, Stage, parse_stages

        rate = self.rate
        try:
            if self.stages is not None and (rate is not None or self.duration is not None):
                raise ValueError("--stages: give stages or --rate (with --duration), not both")
            if self.duration is not None and rate is None:
                raise ValueError("--duration: needs --rate (or use --stages RATE:SECONDS,...)")
            staged = parse_stages(self.stages) if self.stages else ()
            if self.duration is not None and rate is not None:
                staged, rate = (Stage(rate, self.duration),), None
            return ArrivalSpec(
                rate=rate,
                burstiness=self.burstiness,
                concurrency=self.concurrency,
                timestamps=self.timestamps,
                time_scale=self.time_scale,
                constant=self.constant,
                stages=staged,
            )
        except ValueError as exc:  # ArrivalSpec names its fields: give the flags instead
            flag = re.sub(r"^ArrivalSpec\.(\w+)", lambda m: "--" + m[1].replace("_", "-"), str(exc))
            raise BenchError(flag) from None


@dataclass(frozen=True)
class BenchRequest:
    """Everything a bench run reads. ``backend``: sim (``gpu``, ``model``, ``tp``, ``ep``,
    ``quantization``, ``stack`` or ``target``'s stack), engine (``model`` is a checkpoint
    folder) or http (``url``, ``endpoint``; ``model`` is the served name). The engine
    config is ``config`` (a JSON file or inline JSON) with ``knobs`` over it; ``timeout``
    is the client's limit per request (s); ``out`` a folder to write the run to."""

    backend: str = "sim"
    gpu: str = "h100"
    model: str = "llama-3-8b"
    tp: int = 1
    ep: int = 1
    quantization: str | None = None
    stack: str | None = None
    target: str | None = None
    url: str | None = None
    endpoint: str = "completions"
    trace: TraceOptions = field(default_factory=TraceOptions)
    load: LoadOptions = field(default_factory=LoadOptions)
    slo: str | None = None
    timeout: float | None = None
    knobs: EngineKnobs = field(default_factory=EngineKnobs)
    config: str | None = None
    seed: int = 0
    out: Path | None = None


class BenchView(Protocol):
    """What a caller shows of a bench while it runs (the CLI: lines and a progress bar)."""

    def note(self, text: str) -> None: ...

    def running(self, total: int) -> AbstractContextManager[Progress]: ...


class Quiet:
    """Shows nothing."""

    def note(self, text: str) -> None:
        pass

    @contextmanager
    def running(self, total: int) -> Iterator[Progress]:
        yield lambda done, total: None


@dataclass
class BenchOutcome:
    result: RunResult
    summary: dict[str, Any]
    out: Path | None = None
    report: Path | None = None
    report_error: str | None = None  # the run is written; only its report failed


def run_bench(
    request: BenchRequest,
    view: BenchView | None = None,
    *,
    report: Callable[[Path], Path] | None = None,
) -> BenchOutcome:
    """Run ``request`` and summarize it; with ``out``, write summary.json, requests.csv
    and steps.csv there, and ``report(out)`` beside them."""
    view = view or Quiet()
    backend, arrivals = _check(request)
    trace = _trace(request, arrivals, view)
    config = None if request.backend == "http" else _engine_config(request, trace)
    stats = trace.stats()
    if stats.get("tokenizer"):
        view.note(f"tokenizer: {stats['tokenizer']}")
    if trace.dropped:
        view.note(f"trace {trace.name}: dropped {trace.num_dropped} rows ({trace.dropped})")
    load = arrivals.describe(trace.requests_per_session)
    view.note(f"bench: {len(trace)} requests of {trace.name}, {load}, {backend.describe()}")
    result = _run(request, backend, config, trace, arrivals, view)
    summary = _summary(request, result, config, trace, arrivals, stats, load)
    outcome = BenchOutcome(result, summary)
    if request.out is not None:
        _write(request.out, outcome, report)
    return outcome


def _check(request: BenchRequest) -> tuple[Backend, ArrivalSpec]:
    """The backend and the arrivals, each option checked in the order the flags read."""
    from slotune.outputs import OutputError, check_folder
    from slotune.targets import resolve_stack
    from slotune.workloads.backends import make_backend
    from slotune.workloads.runner.timeouts import check_timeout
    from slotune.workloads.slo import parse_slo

    r = request
    if r.backend == "http" and not r.url:
        raise BenchError("--backend http needs --url (e.g. http://localhost:8000)")
    try:
        stack = resolve_stack(r.stack, r.target)
    except ValueError as exc:
        raise BenchError(f"--target: {exc}") from None
    try:
        backend = make_backend(
            r.backend,
            gpu=r.gpu,
            model=r.model,
            tp=r.tp,
            ep=r.ep,
            quantization=r.quantization,
            stack=stack,
            url=r.url,
            endpoint=r.endpoint,
            tokenizer=r.trace.tokenizer,
        )
    except ValueError as exc:
        raise BenchError(f"--{exc}") from None
    if r.out is not None:
        try:
            check_folder(r.out)
        except OutputError as exc:
            raise BenchError(f"--out: {exc}") from None
    if r.slo:
        try:
            parse_slo(r.slo)
        except ValueError as exc:
            raise BenchError(f"--slo: {exc}") from None
    try:
        check_timeout(r.timeout)
    except ValueError as exc:
        raise BenchError(f"--{exc}") from None
    arrivals = r.load.arrivals()
    if arrivals.stages and r.trace.num_requests is not None:
        raise BenchError(
            "--num-requests: the load stages (--stages or --duration) set the number of requests"
        )
    return backend, arrivals


def _trace(request: BenchRequest, arrivals: ArrivalSpec, view: BenchView) -> Trace:
    from slotune.workloads.load import load_trace

    t = request.trace
    try:
        trace = load_trace(
            t.name,
            format=t.format,
            num_requests=t.num_requests,
            tokenizer=t.tokenizer,
            seed=request.seed,
            multi_turn=t.multi_turn,
            model=request.model,
        )
    except (ValueError, OSError) as exc:
        raise BenchError(f"--trace: {exc}") from None
    if arrivals.num_sessions is not None:
        if arrivals.num_sessions > len(trace):
            view.note(
                f"trace {trace.name}: repeated to the {arrivals.num_sessions} sessions the "
                "stages send"
            )
        trace = trace.repeat_to(arrivals.num_sessions)
    if request.load.timestamps and not trace.has_timestamps:
        raise BenchError(
            f"--timestamps: trace {trace.name} has no timestamps; use --rate or --concurrency"
        )
    if request.slo:
        from slotune.workloads.slo import parse_slo

        try:
            parse_slo(request.slo).check_tiers({r.tier for r in trace.requests})
        except ValueError as exc:
            raise BenchError(f"--slo: {exc}") from None
    return trace


def _engine_config(request: BenchRequest, trace: Trace) -> EngineConfig:
    from slotune.engine.knobs import engine_config
    from slotune.workloads.trace import default_max_model_len

    try:
        return engine_config(request.config, request.knobs, lambda: default_max_model_len(trace))
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def _run(
    request: BenchRequest,
    backend: Backend,
    config: EngineConfig | None,
    trace: Trace,
    arrivals: ArrivalSpec,
    view: BenchView,
) -> RunResult:
    from slotune.workloads.backends import run

    with view.running(len(trace)) as progress:
        try:
            return run(
                backend,
                trace,
                arrivals,
                config,
                seed=request.seed,
                timeout_s=request.timeout,
                progress=progress,
            )
        except (ValueError, FileNotFoundError) as exc:
            raise BenchError(str(exc)) from None


def _summary(
    request: BenchRequest,
    result: RunResult,
    config: EngineConfig | None,
    trace: Trace,
    arrivals: ArrivalSpec,
    stats: dict[str, Any],
    load: str,
) -> dict[str, Any]:
    from slotune._version import __version__
    from slotune.workloads.metrics import summarize
    from slotune.workloads.slo import parse_slo

    r = request
    slo = parse_slo(r.slo) if r.slo else None
    try:
        summary = summarize(
            result,
            slo,
            warmup_s=r.load.warmup,
            cooldown_s=r.load.cooldown,
            stages=arrivals.stages,
        )
    except ValueError as exc:
        raise BenchError(f"--warmup/--cooldown: {exc}") from None
    summary.update(
        {
            "config": None if config is None else config.to_dict(),
            "backend": r.backend,
            "gpu": r.gpu if r.backend == "sim" else None,
            "stack": result.engine_stats.get("stack"),
            "model": r.model,
            "tp": r.tp,
            "quantization": r.quantization,
            "ep": r.ep,
            "url": r.url,
            "trace": {"name": trace.name, "stats": stats},
            "arrivals": load,
            "timeout_s": r.timeout,
            "seed": r.seed,
            "slotune_version": __version__,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "engine_stats": result.engine_stats,
        }
    )
    return summary


def _write(out: Path, outcome: BenchOutcome, report: Callable[[Path], Path] | None) -> None:
    outcome.result.save(out)
    (out / "summary.json").write_text(json.dumps(outcome.summary, indent=2, default=str))
    outcome.out = out
    if report is None:
        return
    try:
        outcome.report = report(out)
    except Exception as exc:  # the run's data is written; a report failure must not hide it
        outcome.report_error = str(exc)
