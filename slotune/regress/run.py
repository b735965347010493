"""Running a suite's benchmarks through the library's public runners (the same calls as
``slotune bench``) and collecting each judged metric once per repeat."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
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
    from slotune.workloads import run_engine, run_http, run_simulated

    if bench.backend == "sim":
        return lambda: run_simulated(
            p.config,
            p.trace,
            gpu=bench.gpu,
            model=bench.model,
            tp=bench.tp,
            arrivals=p.arrivals,
            seed=bench.seed,
        )
    if bench.backend == "engine":
        from slotune.engine import Engine

        try:
            engine = Engine.local(p.config, model=bench.model)
        except (ValueError, OSError) as exc:
            raise RunError(f"{bench.name}: {exc}") from None
        return lambda: run_engine(engine, p.trace, p.arrivals, seed=bench.seed)
    return lambda: run_http(
        bench.url or "",
        p.trace,
        p.arrivals,
        model=bench.model,
        endpoint=bench.endpoint,
        seed=bench.seed,
        tokenizer=bench.trace.tokenizer,
    )


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
    """Start ``bench.server`` in its own process group, wait for ``GET /health``, stop it
    (the whole group) afterwards."""
    log(f"{bench.name}: starting server: {bench.server}")
    with tempfile.TemporaryFile("w+") as output:
        marks = {"{python}": shlex.quote(sys.executable)}
        proc = subprocess.Popen(
            _fill(bench.server or "", marks),
            shell=True,
            cwd=bench.workdir,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_healthy(bench, proc, output)
            yield
        finally:
            _stop(proc)


def _wait_healthy(bench: Benchmark, proc: subprocess.Popen, output: Any) -> None:
    health = f"{(bench.url or '').rstrip('/')}/health"
    deadline = time.monotonic() + bench.server_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output.seek(0)
            tail = output.read().strip().splitlines()[-1:] or [""]
            raise RunError(f"{bench.name}: server exited with {proc.returncode}: {tail[0]}")
        try:
            with urllib.request.urlopen(health, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise RunError(f"{bench.name}: {health} did not answer within {bench.server_timeout_s:g} s")


STOP_TIMEOUT_S = 10.0


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group and wait until all of it has exited, SIGKILL
    after ``STOP_TIMEOUT_S``. The shell that started the server exits at once while the
    server drains, so waiting for the shell alone would leave the port still bound."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    _signal_group(proc, signal.SIGTERM)
    while _group_alive(proc):
        if time.monotonic() > deadline:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
            return
        time.sleep(0.05)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()  # reap the shell, or the group stays alive as its zombie
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True
