"""Weight precision in the simulator: bytes, compute rates and dequantize cost of each
format against hand-computed rooflines, the weight memory it frees for KV blocks, and where
the format comes from (flag or config.json)."""

import pytest

from slotune.engine.config import EngineConfig
from slotune.engine.sim import CostModel, determine_capacity, get_model, load_profile
from slotune.engine.sim.capacity import kv_block_bytes
from slotune.engine.sim.precision import DEQUANT_OVERHEAD, WEIGHT_ONLY_TILE
from tests.sim.unit_profile import BF16, BW, FP8, unit_profile

H, FFN = 4096, 14336  # Llama-3-8B
UP = (H, 2 * FFN)


def _mlp_up(quantization: str | None, m: int, fp8: bool = True) -> float:
    model = get_model("llama-3-8b", quantization)
    return CostModel(unit_profile(fp8), model).layer_ops(m)["mlp_up"]


def test_bf16_is_the_plain_roofline() -> None:
    k, n = UP
    assert _mlp_up(None, 1) == pytest.approx(2 * (k * n + k + n) / BW)
    assert _mlp_up(None, 8192) == pytest.approx(2 * 8192 * k * n / BF16)


def test_fp8_w8a8_reads_one_byte_and_computes_at_the_fp8_peak() -> None:
    k, n = UP
    quantize = 3 * 1 * k / BW  # the input row read in bf16, written as one-byte codes
    assert _mlp_up("fp8", 1) == pytest.approx((k * n + 2 * (k + n)) / BW + quantize)
    m = 8192
    assert _mlp_up("fp8", m) == pytest.approx(2 * m * k * n / FP8 + 3 * m * k / BW)
    assert _mlp_up("int8", m) == pytest.approx(2 * m * k * n / (2 * BF16) + 3 * m * k / BW)


def test_fp8_without_fp8_tensor_cores_is_weight_only() -> None:
    k, n = UP
    m = 8192
    expected = 2 * m * k * n / BF16 * (1 + DEQUANT_OVERHEAD)
    assert _mlp_up("fp8", m, fp8=False) == pytest.approx(expected)
    assert _mlp_up("fp8", 1, fp8=False) == pytest.approx((k * n + 2 * (k + n)) / BW)


def test_int4_gains_at_small_batch_and_not_at_large() -> None:
    k, n = UP
    bits = 4 + 20 / 128  # codes, fp16 scale and 4-bit zero per group of 128
    assert _mlp_up("int4", 1) == pytest.approx((k * n * bits / 8 + 2 * (k + n)) / BW)
    assert _mlp_up("int4", 1) < 0.3 * _mlp_up(None, 1)
    m = 8192
    assert _mlp_up("int4", m) == pytest.approx(2 * m * k * n / BF16 * (1 + DEQUANT_OVERHEAD))
    assert _mlp_up("int4", m) > _mlp_up(None, m)
    # on a real profile too: a whole decode step gains at batch 1, a long prefill loses
    profile = load_profile("h100")
    bf16, int4 = (CostModel(profile, get_model("llama-3-8b", q)) for q in (None, "int4"))
    assert int4.decode_step_seconds(1, 500) < 0.7 * bf16.decode_step_seconds(1, 500)
    prefill = [(8192, 0)]
    assert int4.step_seconds(8192, 1, 1, 0, 0, prefill) >= bf16.step_seconds(
        8192, 1, 1, 0, 0, prefill
    )
    assert WEIGHT_ONLY_TILE == 16


def test_weight_bytes_of_each_format_by_hand() -> None:
    model = get_model("llama-3-8b")
    attention = H * (32 + 2 * 8) * 128 + 32 * 128 * H
    linear = 32 * (attention + 3 * H * FFN)
    other = 32 * 2 * H + 2 * 128256 * H + H  # norms, embeddings, LM head, final norm
    assert model.weight_bytes == 2 * (linear + other)
    assert get_model("llama-3-8b", "fp8").weight_bytes == linear + 2 * other
    int4 = get_model("llama-3-8b", "awq").weight_bytes
    assert int4 == round(linear * (4 + 20 / 128) / 8) + 2 * other


def test_fp8_weights_free_kv_blocks() -> None:
    profile = load_profile("h100")
    config = EngineConfig()
    bf16 = determine_capacity(profile, get_model("llama-3-8b"), 1, config).num_gpu_blocks
    fp8 = determine_capacity(profile, get_model("llama-3-8b", "fp8"), 1, config).num_gpu_blocks
    freed = get_model("llama-3-8b").weight_bytes - get_model("llama-3-8b", "fp8").weight_bytes
    block = kv_block_bytes(get_model("llama-3-8b"), 1, 16)
    assert fp8 - bf16 == pytest.approx(freed / block, abs=1)


def test_quantization_names_and_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert get_model("llama-3-8b", "gptq").weight_dtype == "int4"
    assert get_model("llama-3-8b", "w8a8_int8").weight_dtype == "int8"
    assert get_model("gpt-oss-20b").expert_weight_format.name == "mxfp4"
    assert get_model("gpt-oss-20b", "bf16").expert_weight_format.name == "bf16"
    with pytest.raises(ValueError, match="--quantization: unknown weight quantization 'nf3'"):
        get_model("llama-3-8b", "nf3")
    with pytest.raises(ValueError, match="name the format with --quantization"):
        get_model("llama-3-8b", "compressed-tensors")
