"""bench, regress and the tuner run a workload through one function: the same settings give
byte-identical per-request results and summaries, whichever command asked.

The settings are the ones a drifted copy dropped before (a non-default stack, a weight
format, expert parallelism and the client timeout), so a command that loses one of them
on the way gives other numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.engine.config import EngineConfig
from slotune.regress.run import _prepare, _start
from slotune.regress.suite import load_suite
from slotune.tuner.evaluate import Evaluator
from slotune.tuner.prepare import TuneOptions, prepare
from slotune.workloads import parse_slo, summarize
from slotune.workloads.backends import HttpBackend, SimBackend, make_backend

SETTINGS = {
    "gpu": "h100",
    "model": "mixtral-8x7b",
    "tp": 2,
    "ep": 2,
    "quantization": "fp8",
    "stack": "eager",
    "seed": 3,
}
NUM_REQUESTS, RATE, TIMEOUT_S = 40, 30.0, 0.8
SLO = "ttft=300ms,tpot=50ms"


def _bench(tmp_path: Path) -> tuple[pd.DataFrame, dict]:
    out = tmp_path / "bench"
    args = ["bench", "--trace", "sharegpt-like", "--num-requests", str(NUM_REQUESTS)]
    args += ["--rate", str(RATE), "--timeout", str(TIMEOUT_S), "--max-num-seqs", "16"]
    for key, value in SETTINGS.items():
        args += [f"--{key}", str(value)]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    return pd.read_csv(out / "requests.csv"), summary


def _saved(result: object, where: Path) -> pd.DataFrame:
    result.save(where)  # type: ignore[attr-defined]
    return pd.read_csv(where / "requests.csv")


def test_bench_regress_and_tune_run_the_same_workload_identically(tmp_path: Path) -> None:
    bench_requests, bench_summary = _bench(tmp_path)
    config = EngineConfig.from_dict(bench_summary["config"])
    assert bench_summary["stack"] == "eager"
    assert (bench_requests["error"] == "timeout").any()  # the client timeout took part

    suite = tmp_path / "suite.yaml"
    bench_def = {
        "name": "same",
        "backend": "sim",
        **{k: v for k, v in SETTINGS.items()},
        "timeout_s": TIMEOUT_S,
        "trace": "sharegpt-like",
        "num_requests": NUM_REQUESTS,
        "load": {"rate": RATE},
        "config": config.to_dict(),
        "slo": SLO,
        "tolerances": {"goodput": 0},
    }
    suite.write_text(yaml.safe_dump({"version": 1, "benchmarks": [bench_def]}))
    (bench,) = load_suite(suite).benchmarks
    regress_result = _start(bench, _prepare(bench))()

    options = TuneOptions(
        slo=SLO,
        trace="sharegpt-like",
        num_requests=NUM_REQUESTS,
        rate=RATE,
        request_timeout=TIMEOUT_S,
        **SETTINGS,  # type: ignore[arg-type]
    )
    prepared = prepare(options)
    tune_result = Evaluator(prepared.setup, prepared.trace).run(config)

    regress_requests = _saved(regress_result, tmp_path / "regress")
    tune_requests = _saved(tune_result, tmp_path / "tune")
    pd.testing.assert_frame_equal(regress_requests, bench_requests)
    pd.testing.assert_frame_equal(tune_requests, bench_requests)
    slo = parse_slo(SLO)
    as_text = [
        json.dumps(summarize(r, slo), sort_keys=True, default=str)
        for r in (regress_result, tune_result)
    ]
    assert as_text[0] == as_text[1]


def test_a_dropped_setting_changes_the_run(tmp_path: Path) -> None:
    """The identity above is not vacuous: without the stack the same run differs."""
    from slotune.workloads import load_trace
    from slotune.workloads.arrivals import ArrivalSpec
    from slotune.workloads.backends import run

    trace = load_trace("sharegpt-like", num_requests=NUM_REQUESTS, seed=3)
    config = EngineConfig(max_num_seqs=16, max_model_len=8192)
    with_stack = SimBackend("h100", "mixtral-8x7b", 2, 2, "fp8", "eager")
    default_stack = SimBackend("h100", "mixtral-8x7b", 2, 2, "fp8", None)
    arrivals = ArrivalSpec(rate=RATE)
    a = run(with_stack, trace, arrivals, config, seed=3)
    b = run(default_stack, trace, arrivals, config, seed=3)
    assert a.duration_s != b.duration_s


def test_make_backend_names_what_is_missing() -> None:
    import pytest

    with pytest.raises(ValueError, match="backend: 'gpu' is not one of sim, engine, http"):
        make_backend("gpu")
    with pytest.raises(ValueError, match="needs a url"):
        make_backend("http")
    with pytest.raises(ValueError, match="endpoint"):
        make_backend("http", url="http://127.0.0.1:1", endpoint="embeddings")
    assert make_backend("http", url="http://x:1", model="m") == HttpBackend("http://x:1", "m")
