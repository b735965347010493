"""A baseline records what it measured (backend, GPU, model, stack, trace) and is refused,
exit 2, when it measured something else, before the suite runs (issue 26)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import slotune.regress
from slotune.cli.app import app
from slotune.regress import compare, load_results, load_suite
from slotune.regress.identity import NotComparable, planned
from tests.regress.conftest import sim_suite, write

runner = CliRunner()


def invoke(*args: str | Path) -> tuple[int, str]:
    result = runner.invoke(app, ["regress", *map(str, args)])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.fixture()
def baseline(tmp_path: Path, tiny_trace: Path) -> Path:
    suite = write(tmp_path, "suite.yaml", sim_suite(tiny_trace))
    code, output = invoke("baseline", suite, "--out", tmp_path / "base.json")
    assert code == 0, output
    return tmp_path / "base.json"


@pytest.fixture()
def no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Running the suite fails the test: the refusal must come first."""

    def run_suite(*args: object, **kwargs: object) -> None:
        raise AssertionError("the suite ran before the baseline was refused")

    monkeypatch.setattr(slotune.regress, "run_suite", run_suite)


def test_a_baseline_records_what_it_measured(baseline: Path, tiny_trace: Path) -> None:
    benchmarks = json.loads(baseline.read_text())["benchmarks"]
    identity = benchmarks[0]["identity"]
    assert identity["backend"] == "sim" and identity["gpu"] == "h100"
    assert identity["model"] == "llama-3-8b" and identity["stack"] == "vllm-v1"
    assert identity["trace"].startswith("tiny.jsonl@sha256:")  # content, not path


def test_another_gpu_is_refused_before_running(
    tmp_path: Path, tiny_trace: Path, baseline: Path, no_run: None
) -> None:
    text = sim_suite(tiny_trace).replace("gpu: h100", "gpu: a100-80gb")
    suite = write(tmp_path, "other-gpu.yaml", text)
    code, output = invoke(suite, "--baseline", baseline, "--out", tmp_path / "cur")
    assert code == 2, output
    assert "gpu (baseline: h100; here: a100-80gb)" in output
    assert not (tmp_path / "cur").exists()


def test_another_suite_is_refused_before_running(
    tmp_path: Path, tiny_trace: Path, baseline: Path, no_run: None
) -> None:
    text = sim_suite(tiny_trace).replace("name: chat", "name: a").replace("name: burst", "name: b")
    suite = write(tmp_path, "other.yaml", text)
    code, output = invoke(suite, "--baseline", baseline, "--out", tmp_path / "cur")
    assert code == 2, output
    assert "the baseline is from another suite" in output and "chat, burst" in output


def test_another_trace_or_model_is_refused(
    tmp_path: Path, tiny_trace: Path, baseline: Path, no_run: None
) -> None:
    tiny_trace.write_text(tiny_trace.read_text().replace('"output_len": 4', '"output_len": 5'))
    suite = write(tmp_path, "suite.yaml", sim_suite(tiny_trace))
    code, output = invoke(suite, "--baseline", baseline)
    assert code == 2 and "trace (baseline: tiny.jsonl@sha256:" in output, output
    text = sim_suite(tiny_trace).replace("model: llama-3-8b", "model: qwen2.5-7b")
    code, output = invoke(write(tmp_path, "m.yaml", text), "--baseline", baseline)
    assert code == 2 and "model (baseline: llama-3-8b; here: qwen2.5-7b)" in output, output


def test_a_baseline_without_an_identity_is_refused(
    tmp_path: Path, tiny_trace: Path, baseline: Path, no_run: None
) -> None:
    data = json.loads(baseline.read_text())
    for bench in data["benchmarks"]:
        del bench["identity"]
    baseline.write_text(json.dumps(data))
    suite = write(tmp_path, "suite.yaml", sim_suite(tiny_trace))
    code, output = invoke(suite, "--baseline", baseline)
    assert code == 2 and "records no identity" in output, output


def test_compare_refuses_results_measured_on_another_gpu(
    tmp_path: Path, tiny_trace: Path, baseline: Path
) -> None:
    """What only the run finds out (an engine run's device) is checked after it."""
    base = load_results(baseline)
    engine_gpu = [
        replace(b, identity={**(b.identity or {}), "gpu": "NVIDIA H200"}) for b in base.benchmarks
    ]
    current = replace(base, benchmarks=engine_gpu)
    with pytest.raises(NotComparable, match=r"gpu \(baseline: h100; here: NVIDIA H200\)"):
        compare(base, current)
    current_file = tmp_path / "cur" / "results.json"
    current.save(current_file)
    code, output = invoke("compare", "--baseline", baseline, "--current", current_file)
    assert code == 2 and "--baseline: the baseline measured something else" in output, output


def test_the_identity_of_a_file_is_its_content_not_its_path(
    tmp_path: Path, tiny_trace: Path
) -> None:
    copy = tmp_path / "elsewhere" / tiny_trace.name
    copy.parent.mkdir()
    copy.write_bytes(tiny_trace.read_bytes())
    here = load_suite(write(tmp_path, "a.yaml", sim_suite(tiny_trace))).benchmarks[0]
    there = load_suite(write(tmp_path, "b.yaml", sim_suite(copy))).benchmarks[0]
    assert planned(here) == planned(there)
