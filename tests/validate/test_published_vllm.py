"""benchmarks/published_vllm.py: the transcribed GPUStack vLLM 0.11 results hold together,
its workloads send exactly what the pages say was sent, and its Qwen3 shapes are the
public models'. (How close the simulator comes is a check reported in docs/BENCHMARKS.md,
not asserted here.)"""

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "published_vllm.py"


@pytest.fixture(scope="module")
def pv():
    spec = importlib.util.spec_from_file_location("published_vllm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_vllm"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["published_vllm"]


def test_each_transcribed_block_is_consistent_with_itself(pv) -> None:
    # vllm bench serve prints total throughput = (input + generated tokens) / duration:
    # a mistyped figure breaks that (the printed values are rounded to 0.01)
    labels = [r.label for r in pv.PUBLISHED]
    assert len(labels) == len(set(labels)) == 32
    for r in pv.PUBLISHED:
        tokens = r.total_input + r.total_output
        slowest, fastest = tokens / (r.duration_s + 0.005), tokens / (r.duration_s - 0.005)
        assert slowest - 0.005 <= r.total_tps <= fastest + 0.005, r.label
        assert r.ttft_median_ms < r.duration_s * 1e3 and r.ttft_mean_ms < r.duration_s * 1e3
        assert r.total_input <= r.num_prompts * r.input_len, r.label
        assert r.total_output <= r.num_prompts * r.output_len, r.label
        assert r.page == f"docs/performance-lab/{r.model}/{r.gpu.split('-')[0]}.md"


@pytest.mark.parametrize("index", range(32))
def test_workload_sends_the_pages_requests(pv, index) -> None:
    row = pv.PUBLISHED[index]
    reqs = pv.workload(row).requests
    prompts = np.array([r.prompt_len for r in reqs])
    outputs = np.array([r.output_len for r in reqs])
    assert len(reqs) == row.num_prompts
    assert all(r.arrival_time == 0.0 for r in reqs)
    assert prompts.sum() == row.total_input and outputs.sum() == row.total_output
    assert prompts.max() - prompts.min() <= 1 and outputs.max() - outputs.min() <= 1
    assert prompts.max() <= row.input_len and outputs.max() <= row.output_len


def test_random_prompts_share_no_cached_block(pv) -> None:
    row = next(r for r in pv.PUBLISHED if r.case == "128/4")
    trace = pv.workload(row)
    firsts = {tuple(p[:16]) for p in trace.own_prompt_token_ids()}
    assert len(firsts) == row.num_prompts


def test_spread_rejects_too_few_tokens(pv) -> None:
    assert pv.spread(10, 4) == [3, 3, 2, 2]
    with pytest.raises(ValueError, match="3 tokens over 4 requests"):
        pv.spread(3, 4)


@pytest.mark.parametrize("name", ["qwen3-14b", "qwen3-32b"])
def test_qwen3_shapes_have_the_public_parameter_counts(pv, name) -> None:
    spec = pv.model_spec(name)
    assert spec.num_params == pytest.approx(pv.PUBLIC_PARAMS[name], rel=0.01)
    # 8 KV heads of 128 in bf16, K and V, every layer
    assert spec.kv_bytes_per_token == 2 * spec.num_layers * 8 * 128 * 2
    assert spec.max_position_embeddings == 40960


def test_engine_runs_vllms_defaults_of_the_card(pv) -> None:
    h100 = pv.engine_config(next(r for r in pv.PUBLISHED if r.gpu == "h100"))
    a100 = pv.engine_config(next(r for r in pv.PUBLISHED if r.gpu == "a100-80g"))
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    for c in (h100, a100):
        assert c.prefix_caching == "hash" and c.block_size == 16
        assert c.gpu_memory_utilization == 0.9 and c.max_model_len == 40960  # Qwen3's
    oss = pv.engine_config(next(r for r in pv.PUBLISHED if r.model == "gpt-oss-20b"))
    assert oss.max_model_len == 131072
    big = pv.engine_config(next(r for r in pv.PUBLISHED if r.model == "gpt-oss-120b"))
    assert big.max_model_len == 32768  # the page's --max-model-len


def test_peak_output_counts_tokens_per_whole_second(pv) -> None:
    times = [[0.2, 0.9, 1.1], [0.5, 1.5, 1.7, 1.99], [2.0]]
    assert pv.peak_output_tps(times) == 4.0  # second 1: 1.1, 1.5, 1.7, 1.99


def test_simulated_metrics_follow_vllm_bench(pv, tmp_path) -> None:
    """TPOT per request from its own token times, means over requests, throughput over
    the span to the last finish: a small cut of the A100 short-prompt case."""
    from slotune.workloads.arrivals import ArrivalSpec
    from slotune.workloads.runner.engine_loop import run_simulated

    row = next(r for r in pv.PUBLISHED if r.label == "14b-a100 128/4")
    row = replace(row, num_prompts=60, total_input=60 * 127, total_output=60 * 4)
    path = pv.write_configs(tmp_path)[row.model]
    sim = pv.simulate(row, path)
    result = run_simulated(
        pv.engine_config(row),
        pv.workload(row),
        gpu=row.gpu,
        model=path,
        stack=pv.STACK,
        arrivals=ArrivalSpec(timestamps=True),
    )
    token_times = result.requests["token_times"]
    tpot = [(t[-1] - t[0]) / (len(t) - 1) for t in token_times]
    ttft = [t[0] for t in token_times]
    finish = result.requests["finish_time"].max()
    assert sim["tpot_mean_ms"] == pytest.approx(np.mean(tpot) * 1e3, rel=1e-9)
    assert sim["ttft_median_ms"] == pytest.approx(np.median(ttft) * 1e3, rel=1e-9)
    assert sim["total_tps"] == pytest.approx(60 * 131 / finish, rel=1e-9)
    assert sim["peak_output_tps"] >= 60 * 4 / np.ceil(finish)
