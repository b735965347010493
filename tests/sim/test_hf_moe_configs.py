"""HF config.json files of the MoE families, written by hand from the published files'
fields (``tests/sim/hf_configs``): what the simulator reads from them, against the
catalogue entries (transcribed apart) and hand-computed shapes."""

import json
from pathlib import Path

import pytest

from slotune.engine.config import EngineConfig
from slotune.engine.sim import CostModel, determine_capacity, get_model, load_profile
from slotune.engine.sim.capacity import kv_block_bytes
from slotune.engine.sim.moe import MoECost

CONFIGS = Path(__file__).parent / "hf_configs"
CATALOGUED = sorted(p.name for p in CONFIGS.iterdir() if p.name != "llama-4-scout-fp8")


def read(name: str):
    return get_model(str(CONFIGS / name / "config.json"))


@pytest.mark.parametrize("name", CATALOGUED)
def test_a_config_file_gives_its_catalogue_entry(name: str) -> None:
    m, c = read(name), get_model(name)
    for field in (
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "qkv_bias",
        "moe",
        "mla",
        "weight_dtype",
        "expert_weight_dtype",
        "num_sliding_layers",
        "sliding_window",
    ):
        assert getattr(m, field) == getattr(c, field), field
    assert m.num_params == c.num_params and m.kv_bytes_per_token == c.kv_bytes_per_token


def test_qwen3_moe_routes_every_layer_to_8_of_128_without_a_shared_expert() -> None:
    m = read("qwen3-30b-a3b")
    assert m.moe is not None and m.moe.moe_layers == tuple(range(48))
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn, m.moe.shared_ffn) == (
        128,
        8,
        768,
        0,
    )
    assert m.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2


def test_deepseek_layers_shared_experts_and_mla_kv_bytes() -> None:
    lite, v3 = read("deepseek-v2-lite"), read("deepseek-v3")
    assert lite.moe is not None and v3.moe is not None
    assert lite.moe.moe_layers == tuple(range(1, 27)) and lite.moe.shared_ffn == 2 * 1408
    assert v3.moe.moe_layers == tuple(range(3, 61)) and v3.moe.shared_ffn == 2048
    assert (v3.moe.num_experts, v3.moe.top_k) == (256, 8) and v3.weight_dtype == "fp8"
    # One latent of 512 + a 64-wide rotary key per token and layer, not 2 x heads x 128.
    assert lite.kv_bytes_per_token == 27 * 576 * 2
    assert v3.kv_bytes_per_token == 61 * 576 * 2
    # Replicated, not split, across tensor-parallel GPUs; fp8 halves it (plus its scales).
    assert kv_block_bytes(v3, 8, 16) == kv_block_bytes(v3, 1, 16) == 61 * 16 * 576 * 2
    assert kv_block_bytes(v3, 8, 16, "fp8") < 0.51 * kv_block_bytes(v3, 8, 16)


def test_mla_projection_weights_by_hand() -> None:
    lite = read("deepseek-v2-lite")
    h = 2048
    q = h * 16 * 192
    latent = h * 576
    up = 512 * 16 * (128 + 128)
    o = 16 * 128 * h
    assert lite.attention_widths(1) == ((q + latent + up) // h, 16 * 128)
    dense_mlp = 3 * h * 10944
    experts = 26 * (64 + 2) * 3 * h * 1408
    other = 27 * (2 * h + 512) + 2 * 102400 * h + h + 26 * 64 * h
    assert lite.num_params == 27 * (q + latent + up + o) + dense_mlp + experts + other


def test_mla_capacity_is_the_hand_calculation() -> None:
    """DeepSeek-V2-Lite on one H100: 576 cached values per token and layer."""
    profile, model = load_profile("h100"), read("deepseek-v2-lite")
    config = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=64, num_gpu_blocks=None)
    cap = determine_capacity(profile, model, 1, config)
    from slotune.engine.sim.capacity import activation_workspace_bytes

    usable = config.gpu_memory_utilization * profile.gpu.memory_bytes
    free = (
        usable
        - model.weight_bytes
        - profile.system.reserved_gib * (1 << 30)
        - activation_workspace_bytes(model, 1, 2048, 64)
    )
    assert cap.num_gpu_blocks == int(free // (27 * 16 * 576 * 2))


def test_gpt_oss_experts_are_mxfp4_and_attention_bf16() -> None:
    m = read("gpt-oss-20b")
    assert m.weight_dtype == "bf16" and m.expert_weight_dtype == "mxfp4"
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k) == (32, 4)
    experts = 24 * 32 * 3 * 2880 * 2880
    mxfp4 = 4.25 / 8  # 4-bit codes and one 8-bit scale per 32
    # gpt-oss-20b's checkpoint is 13.8 GB: MXFP4 experts and everything else in bf16.
    assert m.weight_bytes == round(experts * mxfp4 + (m.num_params - experts) * 2)
    assert m.weight_bytes / 1e9 == pytest.approx(13.8, rel=0.02)
    assert get_model("gpt-oss-20b", "bf16").expert_weight_dtype is None


def test_llama4_text_config_interleaving_and_fp8_experts() -> None:
    scout, maverick = read("llama-4-scout"), read("llama-4-maverick")
    assert scout.moe is not None and maverick.moe is not None
    assert scout.moe.moe_layers == tuple(range(48)) and scout.num_dense_layers == 0
    assert maverick.moe.moe_layers == tuple(range(1, 48, 2)) and maverick.num_dense_layers == 24
    assert maverick.intermediate_size == 16384 and maverick.moe.expert_ffn == 8192
    assert scout.moe.shared_ffn == 8192 and scout.moe.top_k == 1
    fp8 = read("llama-4-scout-fp8")  # compressed-tensors FP8, self_attn ignored
    assert fp8.weight_dtype == "bf16" and fp8.expert_weight_dtype == "fp8"
    experts = 48 * 17 * 3 * 5120 * 8192
    assert scout.weight_bytes - fp8.weight_bytes == experts  # one byte saved per weight


def test_fp8_experts_run_at_the_fp8_rate_beside_bf16_attention() -> None:
    scout, fp8 = read("llama-4-scout"), read("llama-4-scout-fp8")
    h100 = load_profile("h100")
    bf, f8 = CostModel(h100, scout, 4), CostModel(h100, fp8, 4)
    assert bf.layer_ops(2048)["qkv_proj"] == f8.layer_ops(2048)["qkv_proj"]
    for tokens in (1, 8192):  # half the bytes read at one token, the fp8 rate at many
        bf_moe, f8_moe = (
            MoECost(h100, scout, 4).layer_ops(tokens),
            MoECost(h100, fp8, 4).layer_ops(tokens),
        )
        assert f8_moe["moe_up"] < 0.7 * bf_moe["moe_up"]
        assert f8_moe["shared_expert"] < 0.75 * bf_moe["shared_expert"]


def _compressed(weights: dict, activations: dict | None) -> dict:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations}
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}


def test_compressed_tensors_schemes_name_the_weight_format(tmp_path: Path) -> None:
    base = json.loads((CONFIGS / "mixtral-8x7b" / "config.json").read_text())
    dynamic8 = {"num_bits": 8, "type": "int", "dynamic": True}
    cases = {
        "int8": _compressed({"num_bits": 8, "type": "int"}, dynamic8),
        "int4": _compressed({"num_bits": 4, "type": "int", "group_size": 128}, None),
        "fp8": _compressed({"num_bits": 8, "type": "float"}, {"num_bits": 8, "type": "float"}),
    }
    path = tmp_path / "config.json"
    for fmt, quant in cases.items():
        path.write_text(json.dumps(base | {"quantization_config": quant}))
        m = get_model(str(path))
        assert (m.weight_dtype, m.expert_weight_dtype) == (fmt, None)  # attention too
    nvfp4 = _compressed({"num_bits": 4, "type": "float"}, {"num_bits": 4, "type": "float"})
    path.write_text(json.dumps(base | {"quantization_config": nvfp4}))
    with pytest.raises(ValueError, match="name the format with --quantization"):
        get_model(str(path))


def test_a_family_without_its_fields_is_refused_by_name(tmp_path: Path) -> None:
    data = json.loads((CONFIGS / "deepseek-v2-lite" / "config.json").read_text())
    del data["kv_lora_rank"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'kv_lora_rank' is missing"):
        get_model(str(path))
    llama4 = json.loads((CONFIGS / "llama-4-scout" / "config.json").read_text())
    path.write_text(json.dumps({k: v for k, v in llama4.items() if k != "text_config"}))
    with pytest.raises(ValueError, match="needs its 'text_config'"):
        get_model(str(path))


def test_mla_rooflines_by_hand() -> None:
    """DeepSeek-V2-Lite on the datasheet-floor GPU: decode attention reads 576 bf16 values
    per context token and layer, replicated on each of 2 GPUs; one token's attention
    projections read all their weights; a prefill pair costs 2·(192 + 128) FLOPs a head."""
    from tests.sim.unit_profile import BF16, BW, unit_profile

    lite, h = read("deepseek-v2-lite"), 2048
    for tp in (1, 2):
        cm = CostModel(unit_profile(), lite, tp)
        assert cm.kv_bytes_per_token_layer == 576 * 2
        heads = 16 // tp
        weights = h * heads * 192 + h * 576 + 512 * heads * 256
        acts = 2 * (h + round(weights / h))
        assert cm.layer_ops(1)["qkv_proj"] == pytest.approx((2 * weights + acts) / BW, rel=1e-3)
        assert cm.layer_ops(1)["o_proj"] == pytest.approx(
            (2 * heads * 128 * h + 2 * (heads * 128 + h)) / BW
        )
    cm = CostModel(unit_profile(), lite)
    pair_flops = 16 * 2 * (192 + 128)
    chunk = 1000  # a causal chunk: half its pairs
    attention = cm.breakdown(chunk, 0, 0, 0).per_layer["attention"]
    assert attention == pytest.approx(0.5 * chunk * chunk * pair_flops / BF16, rel=0.01)
