"""Running a suite's benchmarks through the library's public runners (the same calls as
``slotune bench``) and collecting each judged metric once per repeat."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotune.regress import identity
from slotune.regress.metrics import WALL, percentiles_needed, read_metric
from slotune.regress.results import BenchmarkResult, SuiteResult
from slotune.regress.suite import Benchmark, Suite

Log = Callable[[str], None]


class RunError(RuntimeError):
    """A benchmark that could not run (bad trace or config, a server that did not start,
    a command that failed); the message names the benchmark."""


@dataclass(frozen=True)
class _Prepared:
    trace: Any
    arrivals: Any
    config: Any
    slo: Any


def run_suite(suite: Suite, log: Log = lambda _: None) -> SuiteResult:
    """Every benchmark of ``suite``, in order."""
    return SuiteResult.new(str(suite.path), [run_benchmark(b, log) for b in suite.benchmarks])


def run_benchmark(bench: Benchmark, log: Log = lambda _: None) -> BenchmarkResult:
    """``bench.repeats`` runs; each judged metric's value per run (None where undefined)."""
    samples: dict[str, list[float | None]] = {m: [] for m in bench.tolerances}
    summary: dict[str, Any] = {}
    server = _server(bench, log) if bench.backend == "http" and bench.server else nullcontext()
    with server:
        for i in range(bench.warmup):
            log(f"{bench.name}: warm-up {i + 1}/{bench.warmup} ({bench.backend})")
            _run_once(bench)
        for i in range(bench.repeats):
            log(f"{bench.name}: run {i + 1}/{bench.repeats} ({bench.backend})")
            summary = _run_once(bench)
            for metric, values in samples.items():
                values.append(read_metric(summary, metric))
    return BenchmarkResult(
        name=bench.name,
        backend=bench.backend,
        deterministic=bench.deterministic,
        report_only=sorted(bench.report_only),
        tolerances={m: str(t) for m, t in bench.tolerances.items()},
        samples=samples,
        summary=summary,
        identity=identity.measured(bench),
    )


def _run_once(bench: Benchmark) -> dict[str, Any]:
    if bench.backend == "command":
        return _run_command(bench)
    from slotune.workloads import summarize

    prepared = _prepare(bench)
    go = _start(bench, prepared)
    t0 = time.perf_counter()
    try:
        result = go()
    except (ValueError, FileNotFoundError) as exc:
        raise RunError(f"{bench.name}: {exc}") from None
    wall = time.perf_counter() - t0
    percentiles = percentiles_needed(list(bench.tolerances))
    summary = summarize(result, prepared.slo, percentiles)
    if summary["num_requests"] and not summary["completed"]:
        first = next(iter(summary.get("errors") or {"no error recorded": 0}))
        raise RunError(f"{bench.name}: every request failed, e.g. {first}")
    return {**summary, WALL: wall}


def _prepare(bench: Benchmark) -> _Prepared:
    from slotune.workloads import ArrivalSpec, load_trace, parse_slo

    spec = bench.trace
    try:
        trace = load_trace(
            spec.name,
            format=spec.format,
            num_requests=spec.num_requests,
            tokenizer=spec.tokenizer,
            seed=bench.seed,
            multi_turn=spec.multi_turn,
        )
        arrivals = ArrivalSpec(**bench.load)
        if bench.load.get("timestamps") and not trace.has_timestamps:
            raise ValueError(f"load.timestamps: trace {trace.name} has no timestamps")
        config = None if bench.backend == "http" else _engine_config(bench.config, trace)
        slo = parse_slo(bench.slo) if bench.slo else None
    except (ValueError, OSError, TypeError) as exc:
        raise RunError(f"{bench.name}: {exc}") from None
    return _Prepared(trace, arrivals, config, slo)


def _engine_config(fields: dict[str, Any], trace: Any) -> Any:
    """The benchmark's ``EngineConfig``; ``max_model_len`` defaults to the trace's longest
    request, as ``slotune bench`` does."""
    from slotune.engine.config import EngineConfig
    from slotune.workloads import default_max_model_len

    if "max_model_len" not in fields:
        fields = {**fields, "max_model_len": default_max_model_len(trace)}
    return EngineConfig.from_dict(fields)


def _start(bench: Benchmark, p: _Prepared) -> Callable[[], Any]:
    """Build what the run needs (untimed) and return the run itself."""
    from slotune.workloads.backends import make_backend, start

    try:
        backend = make_backend(
            bench.backend,
            gpu=bench.gpu,
            model=bench.model,
            tp=bench.tp,
            ep=bench.ep,
            quantization=bench.quantization,
            stack=bench.stack,
            url=bench.url,
            endpoint=bench.endpoint,
            tokenizer=bench.trace.tokenizer,
        )
        run = start(backend, p.config)
    except (ValueError, OSError) as exc:
        raise RunError(f"{bench.name}: {exc}") from None
    return lambda: run(p.trace, p.arrivals, seed=bench.seed, timeout_s=bench.timeout_s)


def _run_command(bench: Benchmark) -> dict[str, Any]:
    """Run the command in the suite's folder; its metrics come from ``metrics_file`` or
    the last line of its output that is a JSON object."""
    with tempfile.TemporaryDirectory(prefix="slotune-regress-") as workdir:
        marks = {"{workdir}": workdir, "{python}": sys.executable}
        cmd = bench.command or ""
        if isinstance(cmd, str):
            args: str | list[str] = _fill(cmd, {k: shlex.quote(v) for k, v in marks.items()})
        else:
            args = [_fill(a, marks) for a in cmd]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                args,
                shell=isinstance(args, str),
                cwd=bench.workdir,
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as exc:
            raise RunError(f"{bench.name}: cannot run {args!r}: {exc}") from None
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise RunError(f"{bench.name}: command exited with {proc.returncode}: {tail[0]}")
        data = _command_metrics(bench, proc.stdout, marks)
    return {**data, WALL: wall}


def _command_metrics(bench: Benchmark, stdout: str, marks: dict[str, str]) -> dict[str, Any]:
    if bench.metrics_file:
        file = Path(bench.workdir, _fill(bench.metrics_file, marks))
        try:
            data = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RunError(f"{bench.name}: metrics_file {file}: {exc}") from None
        if isinstance(data, dict):
            return data
        raise RunError(f"{bench.name}: metrics_file {file} is not a JSON object")
    for line in reversed(stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    raise RunError(f"{bench.name}: the command printed no JSON object line")


def _fill(text: str, marks: dict[str, str]) -> str:
    for mark, value in marks.items():
        text = text.replace(mark, value)
    return text


@contextmanager
def _server(bench: Benchmark, log: Log) -> Iterator[None]:
    """Start ``bench.server``, wait for ``GET /health``, stop it afterwards."""
    from slotune.workloads.server_process import ServerProcess, ServerStartError

    log(f"{bench.name}: starting server: {bench.server}")
    command = _fill(bench.server or "", {"{python}": shlex.quote(sys.executable)})
    with tempfile.TemporaryDirectory(prefix="slotune-server-") as tmp:
        server = ServerProcess(
            command,
            bench.url or "",
            log=Path(tmp) / "server.log",
            cwd=bench.workdir,
            start_timeout_s=bench.server_timeout_s,
        )
        try:
            server.start()
        except ServerStartError as exc:
            raise RunError(f"{bench.name}: {exc}") from None
        try:
            yield
        finally:
            server.stop()
