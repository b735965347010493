"""KV-cache dtype in the simulator: blocks per GB and the bytes attention reads, by hand."""

import pytest

from slotune.engine.config import EngineConfig
from slotune.engine.sim import CostModel, determine_capacity, get_model, load_profile
from slotune.engine.sim.capacity import activation_workspace_bytes
from slotune.engine.sim.cost_model import KV_DEQUANT_BYTES
from tests.sim.unit_profile import BW, unit_profile

GIB = 1 << 30
LAYERS, KV_HEADS, DIM, BS = 32, 8, 128, 16  # Llama-3-8B, 16-token blocks

# One layer's block: K and V codes, plus float32 scales per (block, head) for fp8/int8; KIVI
# int4: keys with a (min, step) fp16 pair per (block, head, channel), values per (token, head).
BLOCK_LAYER = {
    "auto": 2 * BS * KV_HEADS * DIM * 2,
    "fp8": 2 * (BS * KV_HEADS * DIM + KV_HEADS * 4),
    "int8": 2 * (BS * KV_HEADS * DIM + KV_HEADS * 4),
    "int4": (BS * KV_HEADS * DIM // 2 + KV_HEADS * DIM * 4)
    + (BS * KV_HEADS * DIM // 2 + BS * KV_HEADS * 4),
}


@pytest.mark.parametrize("kv", ["auto", "fp8", "int8", "int4"])
def test_blocks_for_each_kv_dtype_match_the_hand_calculation(kv: str) -> None:
    profile, model = load_profile("h100"), get_model("llama-3-8b")
    config = EngineConfig(kv_cache_dtype=kv, swap_space_gb=2)
    block = LAYERS * BLOCK_LAYER[kv]
    free = (
        0.9 * 80 * GIB
        - model.weight_bytes
        - GIB
        - activation_workspace_bytes(model, 1, config.max_num_batched_tokens, config.max_num_seqs)
    )
    capacity = determine_capacity(profile, model, 1, config)
    assert capacity.num_gpu_blocks == int(free // block)
    assert capacity.num_cpu_blocks == 2 * GIB // block


def test_fp8_kv_nearly_doubles_the_blocks_and_int4_more() -> None:
    profile, model = load_profile("h100"), get_model("llama-3-8b")
    blocks = {
        kv: determine_capacity(profile, model, 1, EngineConfig(kv_cache_dtype=kv)).num_gpu_blocks
        for kv in ("auto", "fp8", "int4")
    }
    assert 1.95 < blocks["fp8"] / blocks["auto"] < 2.0
    assert 3.0 < blocks["int4"] / blocks["auto"] < 3.2


@pytest.mark.parametrize("kv", ["auto", "fp8", "int4"])
def test_decode_attention_reads_the_stored_bytes_plus_the_dequantize_cost(kv: str) -> None:
    cm = CostModel(unit_profile(), get_model("llama-3-8b"), 1, BS, kv_cache_dtype=kv)
    values = 2 * KV_HEADS * DIM
    per_token = BLOCK_LAYER[kv] / BS + (0 if kv == "auto" else KV_DEQUANT_BYTES * values)
    ctx = 8 * 3000
    attention = cm.decode_step_seconds(8, ctx) - cm.decode_step_seconds(8, 0)
    assert attention == pytest.approx(LAYERS * per_token * ctx / BW)
    assert cm.block_bytes == LAYERS * BLOCK_LAYER[kv]


def test_quantized_kv_speeds_up_long_context_decode_on_h100() -> None:
    profile, model = load_profile("h100"), get_model("llama-3-8b")
    step = {
        kv: CostModel(profile, model, kv_cache_dtype=kv).decode_step_seconds(64, 64 * 16000)
        for kv in ("auto", "fp8", "int4")
    }
    assert step["int4"] < step["fp8"] < 0.8 * step["auto"]


def test_the_simulated_engine_sizes_its_pool_by_the_kv_dtype() -> None:
    from slotune.engine.engine import Engine

    blocks = {
        kv: Engine.simulated(EngineConfig(kv_cache_dtype=kv)).capacity.num_gpu_blocks
        for kv in ("auto", "fp8")
    }
    profile, model = load_profile("h100"), get_model("llama-3-8b")
    assert (
        blocks["fp8"]
        == determine_capacity(profile, model, 1, EngineConfig(kv_cache_dtype="fp8")).num_gpu_blocks
    )
    assert blocks["fp8"] > 1.9 * blocks["auto"]
    engine = Engine.simulated(EngineConfig(kv_cache_dtype="int4"), quantization="fp8")
    assert engine.executor.cost_model.kv_cache_dtype == "int4"
    assert engine.executor.model.weight_dtype == "fp8"
