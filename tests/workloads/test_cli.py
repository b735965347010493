"""`slotune traces` and `slotune bench`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.workloads import load_trace

runner = CliRunner()


def test_traces_list_shows_every_bundled_trace() -> None:
    res = runner.invoke(app, ["traces", "list"])
    assert res.exit_code == 0, res.output
    names = {
        "sharegpt-like",
        "agent",
        "shared-prefix",
        "long-context",
        "reasoning",
        "shared-prefix-chat",
        "agent-tiers",
    }
    for name in names:
        assert name in res.output
    data = json.loads(runner.invoke(app, ["traces", "list", "--json"]).output)
    assert {d["name"] for d in data} == names


def test_traces_show_and_convert(tmp_path: Path) -> None:
    csv = tmp_path / "burst.csv"
    csv.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "1,ChatGPT,100,20,120,Conversation log\n2,ChatGPT,50,0,50,API log\n"
        "4,GPT-4,70,30,100,API log\n"
    )
    res = runner.invoke(app, ["traces", "show", str(csv)])
    assert res.exit_code == 0, res.output
    assert "dropped 1 rows: 1 failed (Response tokens = 0)" in res.output
    stats = json.loads(runner.invoke(app, ["traces", "show", str(csv), "--json"]).output)
    assert stats["requests"] == 2 and stats["has_timestamps"]
    out = tmp_path / "burst.jsonl"
    res = runner.invoke(app, ["traces", "convert", str(csv), str(out)])
    assert res.exit_code == 0, res.output
    assert load_trace(out).requests == load_trace(csv).requests


def test_traces_show_bad_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt_len": 3, "output_len": 2}\n{"id": "b", "prompt_len": 3}\n')
    res = runner.invoke(app, ["traces", "show", str(bad)])
    assert res.exit_code == 2
    assert f"{bad}:line 2: missing field 'output_len'" in res.output


def test_bench_simulated_writes_summary_requests_and_steps(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "bench",
            "--gpu",
            "h100",
            "--model",
            "llama-3-8b",
            "--trace",
            "sharegpt-like",
            "--num-requests",
            "40",
            "--rate",
            "10",
            "--slo",
            "ttft=300ms,tpot=50ms",
            "--max-num-batched-tokens",
            "1024",
            "--kv-cache-dtype",
            "fp8",
            "--seed",
            "1",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "num_requests",
        "completed",
        "failed",
        "duration_s",
        "request_throughput",
        "output_throughput",
        "ttft_ms",
        "tpot_ms",
        "itl_ms",
        "e2el_ms",
        "slo_attainment",
        "goodput",
        "num_preemptions",
        "prefix_cache_hit_rate",
        "config",
    ):
        assert key in summary, key
    assert set(summary["ttft_ms"]) >= {"mean", "p50", "p90", "p99"}
    assert summary["num_requests"] == summary["completed"] == 40
    assert summary["config"]["max_num_batched_tokens"] == 1024
    assert summary["config"]["kv_cache_dtype"] == "fp8"
    requests = pd.read_csv(out / "requests.csv")
    steps = pd.read_csv(out / "steps.csv")
    assert len(requests) == 40 and len(steps) > 40
    assert json.loads(requests["token_times"][0])
    printed = json.loads(res.stdout[res.stdout.index("{") :])
    assert printed["completed"] == 40


def test_bench_memory_flags_size_the_kv_pool_as_vllm_does(tmp_path: Path) -> None:
    """--gpu-memory-utilization moves the simulated pool by the memory it gives; a bad
    value is refused naming the field."""
    blocks = {}
    for util in (0.9, 0.5):
        out = tmp_path / f"u{util}"
        args = ["--gpu", "h100", "--model", "llama-3-8b", "--trace", "sharegpt-like"]
        args += ["--num-requests", "5", "--gpu-memory-utilization", str(util)]
        args += ["--swap-space", "2", "--out", str(out)]
        res = runner.invoke(app, ["bench", *args])
        assert res.exit_code == 0, res.output
        config = json.loads((out / "summary.json").read_text())["config"]
        assert config["gpu_memory_utilization"] == util and config["swap_space_gb"] == 2
        blocks[util] = json.loads((out / "summary.json").read_text())["engine_stats"]
    # the 0.4 of the card's memory between the two, in Llama-3-8B's 16-token bf16 blocks
    # (32 layers, 8 KV heads of 128, K and V): 2 MiB each
    block_bytes = 32 * 8 * 128 * 2 * 2 * 16
    expected = 0.4 * 80 * 2**30 / block_bytes
    diff = blocks[0.9]["num_total_blocks"] - blocks[0.5]["num_total_blocks"]
    assert diff == pytest.approx(expected, rel=0.01)
    res = runner.invoke(app, ["bench", "--gpu", "h100", "--gpu-memory-utilization", "1.5"])
    assert res.exit_code == 2 and "gpu_memory_utilization" in res.output


def test_bench_table_output_and_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "best.json"
    cfg.write_text(json.dumps({"config": {"max_num_batched_tokens": 512, "block_size": 32}}))
    res = runner.invoke(
        app,
        [
            "bench",
            "--trace",
            "agent",
            "--num-requests",
            "30",
            "--concurrency",
            "4",
            "--config",
            str(cfg),
            "--block-size",
            "16",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "TTFT" in res.output and "prefix-cache hit rate" in res.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--slo", "ttft=fast"], "--slo: SLO part 'ttft=fast'"),
        (["--trace", "nope"], "not a bundled trace"),
        (["--burstiness", "2"], "burstiness: needs a rate"),
        (["--timestamps"], "has no timestamps"),
        (["--block-size", "24"], "block_size: must be a power of two"),
        (["--kv-cache-dtype", "fp4"], "kv_cache_dtype: must be one of"),
        (["--backend", "http"], "needs --url"),
        (["--backend", "grpc"], "not one of sim, engine, http"),
        (["--timeout", "0"], "--timeout: must be a positive number of seconds"),
        (["--stages", "5"], "expected RATE:SECONDS"),
        (["--stages", "5:10", "--rate", "3"], "give stages or --rate"),
        (["--duration", "10"], "--duration: needs --rate"),
        (["--stages", "5:10", "--num-requests", "9"], "the load stages"),
        (["--rate", "5", "--duration", "4", "--warmup", "5"], "leave nothing of the"),
        (["--gpu", "abacus", "--num-requests", "5"], "abacus"),
    ],
)
def test_bench_bad_input_exits_2(args: list[str], fragment: str) -> None:
    res = runner.invoke(app, ["bench", *args])
    assert res.exit_code == 2, res.output
    assert fragment in res.output


def test_bench_timeout_fails_requests_of_an_overloaded_run(tmp_path: Path) -> None:
    args = ["bench", "--num-requests", "150", "--rate", "80", "--max-num-seqs", "8", "--json"]
    res = runner.invoke(app, [*args, "--timeout", "1.5", "--slo", "ttft=10s"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["timeout_s"] == 1.5
    assert summary["errors"] == {"timeout": summary["failed"]} and summary["failed"] > 0
    assert summary["slo_attainment"] <= summary["completed"] / summary["num_requests"]


def test_bench_stages_warmup_and_steady_state(tmp_path: Path) -> None:
    args = ["bench", "--stages", "2:10,4:10", "--warmup", "5", "--cooldown", "2", "--json"]
    res = runner.invoke(app, [*args, "--slo", "ttft=1s"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["arrivals"] == "Poisson stages: 2 req/s for 10 s, 4 req/s for 10 s"
    window = s["scoring_window"]
    assert (window["warmup_s"], window["cooldown_s"]) == (5, 2)
    assert s["num_requests"] == window["requests"] < 60  # 60 sent, the ends not scored
    assert s["steady_state"]["steady"] is True
    overloaded = runner.invoke(
        app, ["bench", "--rate", "200", "--duration", "5", "--max-num-seqs", "4"]
    )
    assert overloaded.exit_code == 0, overloaded.output
    assert "not in steady state" in overloaded.output
