"""benchmarks/kernel_reference.py's stack check: GEMM times written in Vidur's CSV format,
read back, priced as a stack runs them, and the graph overhead scale recovered."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from slotune.engine.sim.profile import load_profile
from slotune.engine.sim.stack import load_stack

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "kernel_reference.py"


@pytest.fixture(scope="module")
def kr():
    spec = importlib.util.spec_from_file_location("kernel_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernel_reference"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["kernel_reference"]


def replays_priced_at(kr, tmp_path: Path, scale: float, monkeypatch) -> list[Path]:
    """CSVs as ``measure_files`` writes them, every op timed at the stack's price under
    ``scale`` (what a card whose in-graph overhead is that scale would measure)."""
    stack = replace(load_stack("vllm-0.15"), graph_overhead_scale=scale)
    prices = {name: kr.stack_pricer(load_profile("h200"), name, stack) for name in kr.MODELS}
    current = {}

    def measure(device, name, tps, tokens, repeats):  # type: ignore[no-untyped-def]
        current["price"] = prices[name]
        return real_measure(device, name, tps, tokens, repeats)

    real_measure = kr.measure
    monkeypatch.setattr(kr, "measure", measure)

    def time_ms(device, m, k, n, repeats):  # type: ignore[no-untyped-def]
        return [1e3 * current["price"](m, k, n)] * repeats

    monkeypatch.setattr(kr, "time_ms", time_ms)
    monkeypatch.setattr(sys, "argv", ["kernel_reference.py", "--device", "cpu", "--out",
                                      str(tmp_path), "--tp", "1", "2", "8", "--tokens", "1", "8",
                                      "64", "256", "--repeats", "2"])  # fmt: skip
    kr.main()
    return sorted(tmp_path.glob("*_mlp.csv"))


def test_the_scale_the_replays_were_priced_at_is_the_one_found(kr, tmp_path, monkeypatch) -> None:
    files = replays_priced_at(kr, tmp_path, 0.25, monkeypatch)
    assert [f.name for f in files] == ["cpu_llama-2-7b_mlp.csv", "cpu_llama-3-8b_mlp.csv"]
    profile, stack, rows = load_profile("h200"), load_stack("vllm-0.15"), kr.layer_rows(files)
    assert kr.best_graph_scale(profile, rows, stack) == 0.25
    assert kr.rms(kr.graph_errors(profile, rows, stack, 0.25)) < 1e-9
    # a larger scale prices every op dearer than the replays, the smaller shards most
    medians = {
        tp: statistics.median(v) for tp, v in kr.graph_errors(profile, rows, stack, 0.4).items()
    }
    assert 0 < medians[1] < medians[2] < medians[8]


def test_the_cli_reads_written_csvs_without_measuring(kr, tmp_path, monkeypatch, capsys) -> None:
    replays_priced_at(kr, tmp_path, 0.1, monkeypatch)
    capsys.readouterr()
    monkeypatch.setattr(kr, "time_ms", None)  # reading must not time anything
    monkeypatch.setattr(sys, "argv", ["kernel_reference.py", "--from", str(tmp_path), "--check",
                                      "h200", "--stack", "vllm-0.15"])  # fmt: skip
    kr.main()
    out = capsys.readouterr().out
    assert "2 files from" in out and "profile h200 as stack vllm-0.15 runs it" in out
    assert "| 0.1 (best fit here) |" in out
