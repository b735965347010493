import dataclasses
import json
from pathlib import Path

import pytest

from slotune.engine.sim import CostModel, get_model, load_profile
from slotune.engine.sim.cost_model import DTYPE_BYTES
from slotune.engine.sim.profile import PROFILE_DIR, profile_from_dict

TOKENS = [1, 2, 7, 16, 63, 64, 65, 127, 128, 129, 256, 500, 512, 1000, 2048, 4096, 8192]


@pytest.fixture(params=["h100", "a100-80g", "l4", "mi300x"])
def cm(request: pytest.FixtureRequest) -> CostModel:
    return CostModel(load_profile(request.param), get_model("llama-3-8b"))


def _floors(cm: CostModel, m: int) -> dict[str, float]:
    """Datasheet bandwidth/compute floor of each op of one layer for ``m`` tokens."""
    bw, peak, h, b = cm.bw, cm.peak, cm.hidden, DTYPE_BYTES

    def gemm(k: int, n: int) -> float:
        return max(b * (k * n + m * k + m * n) / bw, 2 * m * k * n / peak)

    return {
        "qkv_proj": gemm(h, cm.qkv_out),
        "o_proj": gemm(cm.attn_dim, h),
        "mlp_up": gemm(h, 2 * cm.ffn),
        "mlp_down": gemm(cm.ffn, h),
        "mlp_act": 3 * m * cm.ffn * b / bw,
        "norms": (2 * 2 + 2 * 3) * m * h * b / bw,
    }


def test_each_op_grows_with_tokens_and_stays_above_its_floor(cm: CostModel) -> None:
    previous: dict[str, float] = {}
    for m in TOKENS:
        ops = cm.layer_ops(m)
        for op, floor in _floors(cm, m).items():
            assert ops[op] >= floor, (op, m)
            assert ops[op] >= previous.get(op, 0.0), (op, m)
        previous = ops


def test_gemm_time_steps_at_the_tile_in_the_compute_bound_range() -> None:
    cm = CostModel(load_profile("h100"), get_model("llama-2-7b"))
    tile = cm.profile.linear.tile_tokens
    m = 32 * tile  # well past the memory-bound knee
    inside = cm.layer_ops(m)["mlp_up"]
    assert cm.layer_ops(m - tile // 2)["mlp_up"] == pytest.approx(inside, rel=0.02)
    assert cm.layer_ops(m + 1)["mlp_up"] > inside * (1 + 0.5 / 33)


def test_attention_floors_and_growth(cm: CostModel) -> None:
    per_token = cm.kv_bytes_per_token_layer * cm.model.num_layers / cm.bw
    for ctx in (100, 1000, 10000):
        decode = cm.decode_step_seconds(8, 8 * ctx) - cm.decode_step_seconds(8, 0)
        assert decode >= per_token * 8 * ctx
    flops = 4 * cm.q_heads * cm.model.head_dim * cm.model.num_layers
    for chunk, prior in ((128, 0), (512, 2048), (2048, 0), (2048, 6000)):
        t = cm.prefill_chunk_seconds(chunk, prior)
        assert t >= flops * chunk * (prior + chunk / 2) / cm.peak
        assert cm.prefill_chunk_seconds(chunk, prior + 256) > t
        assert cm.prefill_chunk_seconds(chunk + 256, prior) > t


def test_small_blocks_make_decode_attention_slower() -> None:
    profile, model = load_profile("a100-80g"), get_model("llama-2-7b")
    times = [
        CostModel(profile, model, block_size=b).decode_step_seconds(64, 64 * 2000)
        for b in (1, 8, 16, 32, 128)
    ]
    assert times == sorted(times, reverse=True)
    assert times[0] > 1.5 * times[2]


def test_tensor_parallel_adds_allreduce_and_splits_work() -> None:
    profile, model = load_profile("h100"), get_model("llama-2-70b")
    tp2, tp8 = CostModel(profile, model, tp=2), CostModel(profile, model, tp=8)
    assert tp2.layer_ops(512)["allreduce"] > 0
    assert tp8.layer_ops(512)["mlp_up"] < tp2.layer_ops(512)["mlp_up"]
    assert CostModel(profile, get_model("llama-2-7b")).layer_ops(512)["allreduce"] == 0


def test_swap_copy_on_write_and_cpu_overheads_add_time() -> None:
    cm = CostModel(load_profile("h100"), get_model("llama-2-7b"))
    base = cm.step_seconds(64, 64, 64, 64, 64 * 500)
    swapped = cm.step_seconds(64, 64, 64, 64, 64 * 500, num_swapped_blocks=10)
    block_bytes = 16 * get_model("llama-2-7b").kv_bytes_per_token
    assert swapped - base >= 10 * block_bytes / (cm.profile.gpu.host_link_gbps * 1e9)
    assert cm.step_seconds(64, 64, 64, 64, 64 * 500, num_cow_blocks=3) > base
    assert cm.step_seconds(64, 64, 128, 64, 64 * 500) > base  # more requests, more CPU


def test_breakdown_total_is_the_step_time() -> None:
    cm = CostModel(load_profile("h100"), get_model("llama-2-7b"))
    b = cm.breakdown(512, 1000, 32, 800)
    assert b.total == cm.step_seconds(544, 33, 33, 32, 32 * 800, [(512, 1000)])
    assert b.total == pytest.approx(sum(b.per_step.values()))


def test_profile_efficiency_above_one_is_refused() -> None:
    data = json.loads((PROFILE_DIR / "h100.json").read_text())
    data["linear"]["compute_eff"] = 1.2
    with pytest.raises(ValueError, match=r"linear\.compute_eff"):
        profile_from_dict(data, "bad.json")


def test_a_profile_file_with_its_own_spec_loads(tmp_path: Path) -> None:
    base = load_profile("h100")
    custom = dataclasses.replace(
        base, gpu=dataclasses.replace(base.gpu, name="h100-slow", hbm_gbps=1000.0)
    )
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(custom.to_dict()))
    loaded = load_profile(str(path))
    assert loaded.gpu.name == "h100-slow" and loaded.gpu.hbm_gbps == 1000.0
    slow = CostModel(loaded, get_model("llama-2-7b")).decode_step_seconds(1, 100)
    assert slow > CostModel(base, get_model("llama-2-7b")).decode_step_seconds(1, 100)
