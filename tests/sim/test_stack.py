"""The serving-stack model: host overlap, CUDA-graph padding, per-request costs, TP,
and the bandwidth/compute balance of GEMMs on other cards."""

import math

import pytest

from slotune.engine.config import EngineConfig
from slotune.engine.sim import CostModel, get_model, load_profile
from slotune.engine.sim.cost_model import allreduce_seconds
from slotune.engine.sim.hardware import UnknownNameError
from slotune.engine.sim.stack import (
    StackProfile,
    graph_capture_sizes,
    load_stack,
    stack_from_dict,
)
from slotune.workloads.runner.engine_loop import run_simulated
from slotune.workloads.trace import Trace, TraceRequest

PROFILE = load_profile("h100")
MODEL = get_model("llama-2-7b")


def _cm(**stack: object) -> CostModel:
    return CostModel(PROFILE, MODEL, stack=StackProfile(name="t", **stack))  # type: ignore[arg-type]


def test_host_overlap_hides_the_shorter_of_host_and_gpu_work() -> None:
    gpu_only = _cm(host_step_us=0.0, host_per_request_us=0.0).decode_step_seconds(10, 10_000)
    for host_us in (800.0, 50_000.0):  # shorter than the GPU's step, then longer
        host = (host_us + 20 * 10) * 1e-6
        for overlap in (0.0, 0.25, 1.0):
            cm = _cm(host_step_us=host_us, host_per_request_us=20.0, host_overlap=overlap)
            t = cm.decode_step_seconds(10, 10_000)
            expected = gpu_only + host - overlap * min(gpu_only, host)
            assert t == pytest.approx(expected, rel=1e-12)
        # async scheduling: the step lasts as long as the busier side
        full = _cm(host_step_us=host_us, host_per_request_us=20.0, host_overlap=1.0)
        assert full.decode_step_seconds(10, 10_000) == pytest.approx(max(gpu_only, host))


def test_graph_steps_pad_to_captured_sizes_and_shrink_kernel_overheads() -> None:
    assert graph_capture_sizes(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert graph_capture_sizes(512)[-3:] == (480, 496, 512)
    eager = _cm()
    graphs = _cm(cuda_graphs=True, graph_max_tokens=64, graph_overhead_scale=1.0)
    # 5 tokens run as the captured batch of 8: the dense ops of 8 tokens, eagerly priced
    assert graphs.padded_tokens(5) == 8
    assert graphs.dense_seconds(5) == eager.dense_seconds(8)
    assert graphs.padded_tokens(65) == 65 and not graphs.is_graph(65)
    # with overheads scaled to zero only bandwidth and compute remain in a graph step
    bare = _cm(cuda_graphs=True, graph_max_tokens=64, graph_overhead_scale=0.0)
    launch = eager.dense_seconds(8) - bare.dense_seconds(8)
    lin, ew = PROFILE.linear, PROFILE.elementwise
    per_layer = 4 * lin.overhead_us + ew["rope"].overhead_us + ew["act"].overhead_us
    per_layer += 2 * ew["norm"].overhead_us + 2 * ew["add"].overhead_us
    expected = MODEL.num_layers * per_layer + ew["embed"].overhead_us + ew["norm"].overhead_us
    assert launch == pytest.approx(expected * 1e-6, rel=1e-9)
    # a step above the largest graph is eager: same as without graphs
    assert bare.dense_seconds(100) == eager.dense_seconds(100)


def test_graph_limit_follows_max_num_seqs_like_vllm() -> None:
    stack = StackProfile(name="g", cuda_graphs=True)
    assert CostModel(PROFILE, MODEL, stack=stack, max_num_seqs=128).graph_max_tokens == 256
    assert CostModel(PROFILE, MODEL, stack=stack, max_num_seqs=1024).graph_max_tokens == 512


def _trace() -> Trace:
    reqs = [
        TraceRequest(f"r{i}", prompt_len=300, output_len=20, arrival_time=2.0 * i) for i in range(5)
    ]
    return Trace(name="spaced", requests=tuple(reqs))


def test_request_costs_delay_every_client_time_by_in_plus_out() -> None:
    config = EngineConfig(max_model_len=1024)
    base = StackProfile(name="a")
    slow = StackProfile(name="b", request_in_us=4000.0, request_out_us=1000.0)
    a = run_simulated(config, _trace(), gpu="h100", model="llama-2-7b", stack=base).requests
    b = run_simulated(config, _trace(), gpu="h100", model="llama-2-7b", stack=slow).requests
    assert list(b["arrival_time"]) == list(a["arrival_time"])
    assert (b["first_token_time"] - a["first_token_time"]).to_numpy() == pytest.approx(0.005)
    assert (b["finish_time"] - a["finish_time"]).to_numpy() == pytest.approx(0.005)
    later = slow.request_latency_s
    for times_a, times_b in zip(a["token_times"], b["token_times"], strict=True):
        assert times_b == [t + later for t in times_a]  # every token, to the bit
    assert (b["first_token_time"] == [ts[0] for ts in b["token_times"]]).all()
    fast = run_simulated(config, _trace(), gpu="h100", model="llama-2-7b", stack=base)
    result = run_simulated(config, _trace(), gpu="h100", model="llama-2-7b", stack=slow)
    assert result.engine_stats["stack"] == "b"
    assert result.duration_s == fast.duration_s + later


def test_tensor_parallel_allreduce_uses_the_stack_latency() -> None:
    model = get_model("llama-2-70b")
    fast = CostModel(PROFILE, model, tp=4, stack=StackProfile(name="f", allreduce_latency_us=0))
    slow = CostModel(PROFILE, model, tp=4, stack=StackProfile(name="s", allreduce_latency_us=20))
    diff = slow.layer_ops(16)["allreduce"] - fast.layer_ops(16)["allreduce"]
    assert diff == pytest.approx(2 * 2 * (4 - 1) * 20e-6)  # two per layer, 2 (tp-1) hops each


def _allreduce_us(gpu: str, tp: int, nbytes: float, kind: str) -> float:
    stack = StackProfile(name=kind, allreduce=kind, allreduce_latency_us=5.0, allreduce_eff=0.5)
    return allreduce_seconds(load_profile(gpu), tp, nbytes, stack) * 1e6


def test_custom_allreduce_pays_one_stage_latency_whatever_the_gpu_count() -> None:
    """vLLM's custom all-reduce on NVLink: one stage below the one-stage limit (every rank
    reads its tp-1 peers' buffers), two stages above it, NCCL's ring above its buffer;
    H100 SXM's NVLink at 900 GB/s both ways, so 225 GB/s a direction at efficiency 0.5."""
    per_dir_us = 1e6 / (900e9 / 2 * 0.5)  # µs per byte over one direction
    small = 8 * 1024  # one token of a 4096-wide model in bf16
    for tp in (2, 4, 8):
        expected = 5.0 + (tp - 1) * small * per_dir_us
        assert _allreduce_us("h100", tp, small, "custom") == pytest.approx(expected)
        ring = 2 * (tp - 1) * 5.0 + 2 * (tp - 1) / tp * small * per_dir_us
        assert _allreduce_us("h100", tp, small, "ring") == pytest.approx(ring)
    mid = 1024 * 1024  # above the one-stage limit of 4 GPUs, within the 8 MiB buffer
    assert _allreduce_us("h100", 4, mid, "custom") == pytest.approx(
        2 * 5.0 + 2 * 3 / 4 * mid * per_dir_us
    )
    assert _allreduce_us("h100", 2, mid, "custom") == pytest.approx(5.0 + mid * per_dir_us)
    large = 16 * 1024 * 1024
    assert _allreduce_us("h100", 4, large, "custom") == _allreduce_us("h100", 4, large, "ring")


def test_custom_allreduce_needs_a_gpu_fabric_between_all_the_gpus() -> None:
    small = 8 * 1024
    for gpu in ("l40s", "rtx4090"):  # PCIe only: NCCL's ring
        assert _allreduce_us(gpu, 2, small, "custom") == _allreduce_us(gpu, 2, small, "ring")
    # An NVLink bridge joins two cards: custom at TP2, the ring at TP4.
    assert _allreduce_us("h100-pcie", 2, small, "custom") < _allreduce_us(
        "h100-pcie", 2, small, "ring"
    )
    assert _allreduce_us("h100-pcie", 4, small, "custom") == _allreduce_us(
        "h100-pcie", 4, small, "ring"
    )
    with pytest.raises(ValueError, match="allreduce must be one of ring, custom"):
        StackProfile(name="x", allreduce="tree")


def test_small_batch_gemms_scale_with_bandwidth_on_another_card() -> None:
    """H200 has H100's FLOP/s and 43 % more bandwidth: a weight-bound decode step must come
    out faster (measured on real cards: about 16 %), but by no more than the bandwidth
    ratio; a compute-bound prefill no faster."""
    h100, h200 = load_profile("h100"), load_profile("h200")
    eager = StackProfile(name="e", host_step_us=0.0, host_per_request_us=0.0)
    a = CostModel(h100, MODEL, stack=eager)
    b = CostModel(h200, MODEL, stack=eager)
    bw_ratio = h200.gpu.hbm_bytes_per_s / h100.gpu.hbm_bytes_per_s
    small = a.dense_seconds(1) / b.dense_seconds(1)
    assert 1.10 < small <= bw_ratio + 1e-9
    large = a.dense_seconds(8192) / b.dense_seconds(8192)
    assert large == pytest.approx(1.0, abs=0.05)


def test_the_default_stack_is_vllm_v1_and_named_stacks_load() -> None:
    assert load_stack(None).name == "vllm-v1"
    assert load_stack("eager") == StackProfile()
    with pytest.raises(UnknownNameError, match="known stacks: eager"):
        load_stack("tgi-9")


def test_bad_stack_files_say_what_is_wrong(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown field"):
        stack_from_dict({"host_step": 3}, "x.json")
    with pytest.raises(ValueError, match="host_overlap must be in"):
        stack_from_dict({"host_overlap": 1.5}, "x.json")
    bad = tmp_path / "s.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="cannot read a stack profile"):
        load_stack(str(bad))
    assert math.isclose(
        StackProfile(request_in_us=1500, request_out_us=500).request_latency_s, 0.002
    )


def test_exposed_host_work_is_paid_on_top_of_the_overlapped_step() -> None:
    gpu_only = _cm(host_step_us=0.0, host_per_request_us=0.0).decode_step_seconds(10, 10_000)
    for hidden_us in (500.0, 40_000.0):
        cm = _cm(
            host_step_us=hidden_us,
            host_per_request_us=0.0,
            host_per_token_us=1.5,
            host_exposed_us=900.0,
            host_overlap=1.0,
        )
        host = (hidden_us + 1.5 * 10) * 1e-6
        assert cm.decode_step_seconds(10, 10_000) == pytest.approx(
            max(gpu_only, host) + 900e-6, rel=1e-12
        )


def test_graph_capture_is_capped_by_the_token_budget_and_max_num_seqs() -> None:
    def cap(seqs: int, budget: int) -> int:
        stack = StackProfile(name="g", cuda_graphs=True)
        return CostModel(
            PROFILE, MODEL, stack=stack, max_num_seqs=seqs, max_num_batched_tokens=budget
        ).graph_max_tokens

    assert cap(128, 2048) == 256 and cap(128, 1024) == 256  # 2 x max_num_seqs
    assert cap(512, 8192) == 512  # capped at 512
    assert cap(128, 128) == 128 and cap(512, 256) == 256  # never above the budget


def test_the_old_stack_name_is_an_alias_of_the_measured_version() -> None:
    old, new = load_stack("vllm-v1"), load_stack("vllm-0.15")
    assert old.name == "vllm-v1" and new.name == "vllm-0.15"
    assert old.with_values(name="vllm-0.15", source=new.source) == new


@pytest.mark.parametrize("name", ["vllm-0.15", "vllm-0.34", "vllm-0.11", "sglang-0.5"])
def test_shipped_stacks_say_where_they_come_from_and_stay_in_range(name: str) -> None:
    from slotune.engine.sim.stack import PARAMETER_RANGES

    s = load_stack(name)
    assert s.engine and s.provenance
    for field, (low, high, meaning) in PARAMETER_RANGES.items():
        v = getattr(s, field)
        assert v is None or low <= v <= high, (field, v, meaning)


def test_no_host_floor_a_small_model_steps_faster_on_two_gpus() -> None:
    """The shipped stack prices Llama-3-8B decode steps cheaper at TP2 than at TP1 (vLLM
    0.15.1 on H100: 5.4 ms steps at TP2, E2E -37 %): host work is not a floor."""
    stack = load_stack(None)
    model = get_model("llama-3-8b")
    tp1 = CostModel(PROFILE, model, 1, stack=stack, max_num_seqs=128)
    tp2 = CostModel(PROFILE, model, 2, stack=stack, max_num_seqs=128)
    for batch in (4, 16, 64):
        assert tp2.decode_step_seconds(batch, batch * 700) < 0.8 * tp1.decode_step_seconds(
            batch, batch * 700
        )


def test_vllm_0_11_schedules_synchronously_the_host_work_adds_to_every_step() -> None:
    """vLLM 0.10 - 0.11 ran without async scheduling by default: the step the derived
    stack prices is 0.15's GPU and critical-path work plus the host's whole share, which
    0.15 hides behind a longer GPU step."""
    model = get_model("llama-3-8b")
    sync = CostModel(PROFILE, model, 1, stack=load_stack("vllm-0.11"), max_num_seqs=256)
    overlapped = CostModel(PROFILE, model, 1, stack=load_stack("vllm-0.15"), max_num_seqs=256)
    assert not sync.stack.schedule_ahead and overlapped.stack.schedule_ahead
    for batch in (8, 64, 256):
        host = sync.host_seconds(batch, batch)
        gpu = overlapped.decode_step_seconds(batch, batch * 700)
        assert host > 0 and host < gpu  # 0.15 hides it all
        assert sync.decode_step_seconds(batch, batch * 700) == pytest.approx(gpu + host)
