"""Each backend through ``run_benchmark``: the simulator (deterministic), an HTTP server in
this process or started by the suite, the embedded engine, and a command."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from slotune.engine import EngineConfig
from slotune.regress import RunError, load_suite, run_benchmark
from slotune.server import simulated_model
from slotune.workloads import load_trace, run_simulated, summarize
from tests.regress.conftest import write
from tests.server.conftest import ServerThread

SERVER_CONFIG = EngineConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512)


def one(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    (bench,) = load_suite(write(tmp_path, "s.yaml", text)).benchmarks
    return bench


def test_sim_runs_once_and_equals_the_library_run(tmp_path: Path, tiny_trace: Path) -> None:
    bench = one(
        tmp_path,
        f"""benchmarks:
  - name: s
    trace: {tiny_trace}
    load: {{rate: 40}}
    config: {{max_num_batched_tokens: 128}}
    tolerances: {{ttft_ms.p99.9: +1%, request_throughput: -1%, wall_s: +50%}}
""",
    )
    result = run_benchmark(bench)
    assert result.deterministic and len(result.samples["wall_s"]) == 1
    from slotune.workloads import ArrivalSpec

    trace = load_trace(str(tiny_trace))
    config = EngineConfig(max_num_batched_tokens=128, max_model_len=48 + 56 + 11)
    ref = summarize(
        run_simulated(config, trace, arrivals=ArrivalSpec(rate=40)), percentiles=(99.9,)
    )
    assert result.samples["ttft_ms.p99.9"] == [ref["ttft_ms"]["p99.9"]]
    assert result.samples["request_throughput"] == [ref["request_throughput"]]


@pytest.fixture(scope="module")
def sim_server() -> Iterator[ServerThread]:
    engine, served = simulated_model(SERVER_CONFIG, gpu="h100", model="llama-3-8b")
    with ServerThread(engine, served) as s:
        yield s


def test_http_repeats_against_a_running_server(
    tmp_path: Path, tiny_trace: Path, sim_server: ServerThread
) -> None:
    bench = one(
        tmp_path,
        f"""benchmarks:
  - name: h
    backend: http
    url: {sim_server.url}
    model: llama-3-8b
    trace: {tiny_trace}
    load: {{concurrency: 4}}
    repeats: 2
    slo: ttft=2s
    tolerances: {{slo_attainment: -0.01, completed: 0, ttft_ms.p50: +20%}}
""",
    )
    result = run_benchmark(bench)
    assert not result.deterministic
    assert result.samples["completed"] == [8.0, 8.0]
    assert result.samples["slo_attainment"] == [1.0, 1.0]
    assert all(v is not None and v > 0 for v in result.samples["ttft_ms.p50"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_starts_the_suites_server_and_stops_it(tmp_path: Path, tiny_trace: Path) -> None:
    port = free_port()
    serve = f"{{python}} -m slotune serve --gpu h100 --port {port} --max-model-len 512"
    bench = one(
        tmp_path,
        f"""benchmarks:
  - name: h
    backend: http
    url: http://127.0.0.1:{port}
    model: llama-3-8b
    server: "{serve}"
    server_timeout_s: 60
    trace: {tiny_trace}
    num_requests: 3
    repeats: 1
    tolerances: {{completed: 0}}
""",
    )
    assert run_benchmark(bench).samples["completed"] == [3.0]
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # the server is gone


def test_a_server_that_exits_is_a_run_error(tmp_path: Path, tiny_trace: Path) -> None:
    bench = one(
        tmp_path,
        f"""benchmarks:
  - name: h
    backend: http
    url: http://127.0.0.1:9
    model: m
    server: "{{python}} -c 'import sys; print(\\"no port\\"); sys.exit(3)'"
    trace: {tiny_trace}
    tolerances: {{completed: 0}}
""",
    )
    with pytest.raises(RunError, match="h: server exited with 3: no port"):
        run_benchmark(bench)


def test_engine_runs_a_checkpoint(tmp_path: Path, tiny_trace: Path) -> None:
    from slotune.engine.model.init_model import init_model

    init_model(tmp_path / "tiny", "tiny", seed=0)
    bench = one(
        tmp_path,
        f"""benchmarks:
  - name: e
    backend: engine
    model: tiny
    trace: {tiny_trace}
    num_requests: 4
    repeats: 2
    config: {{max_num_batched_tokens: 256, num_gpu_blocks: 64}}
    tolerances: {{completed: 0, total_output_tokens: 0}}
""",
    )
    result = run_benchmark(bench)
    assert result.samples["completed"] == [4.0, 4.0]
    assert result.samples["total_output_tokens"] == [4.0 + 5 + 6 + 7] * 2


def test_command_metrics_from_stdout_or_a_file(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "bench.py",
        "import json, sys\n"
        "print('a table first')\n"
        "print(json.dumps({'rows': [{'total_ms': 0.25}]}))\n"
        "if len(sys.argv) > 1:\n"
        "    open(sys.argv[1], 'w').write(json.dumps({'x': 7}))\n",
    )
    stdout = one(
        tmp_path,
        f"""benchmarks:
  - name: c
    backend: command
    command: ["{{python}}", "{script.name}"]
    repeats: 2
    tolerances: {{rows.0.total_ms: +50%, wall_s: +100%}}
""",
    )
    result = run_benchmark(stdout)
    assert result.samples["rows.0.total_ms"] == [0.25, 0.25]
    assert all(v is not None and v > 0 for v in result.samples["wall_s"])
    from_file = one(
        tmp_path,
        f"""benchmarks:
  - name: c
    backend: command
    command: "{{python}} {script.name} {{workdir}}/m.json"
    metrics_file: "{{workdir}}/m.json"
    repeats: 1
    tolerances: {{x: 0}}
""",
    )
    assert run_benchmark(from_file).samples["x"] == [7.0]


def test_a_failing_command_is_a_run_error(tmp_path: Path) -> None:
    bench = one(
        tmp_path,
        """benchmarks:
  - name: c
    backend: command
    command: ["{python}", "-c", "import sys; sys.exit('broken')"]
    tolerances: {x: 0}
""",
    )
    with pytest.raises(RunError, match="c: command exited with 1: broken"):
        run_benchmark(bench)


def test_a_server_that_answers_nothing_is_a_run_error(tmp_path: Path, tiny_trace: Path) -> None:
    bench = one(
        tmp_path,
        f"""benchmarks:
  - name: h
    backend: http
    url: http://127.0.0.1:{free_port()}
    model: m
    trace: {tiny_trace}
    num_requests: 2
    repeats: 1
    tolerances: {{completed: 0}}
""",
    )
    with pytest.raises(RunError, match=r"h: every request failed, e\.g\. "):
        run_benchmark(bench)


def test_warmup_runs_are_discarded(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "count.py",
        "import json, pathlib\n"
        "log = pathlib.Path('runs.log')\n"
        "log.write_text(log.read_text() + 'x' if log.exists() else 'x')\n"
        "print(json.dumps({'run': len(log.read_text())}))\n",
    )
    bench = one(
        tmp_path,
        f"""benchmarks:
  - name: c
    backend: command
    command: ["{{python}}", "{script.name}"]
    warmup: 2
    repeats: 2
    tolerances: {{run: +0}}
""",
    )
    assert run_benchmark(bench).samples["run"] == [3.0, 4.0]
