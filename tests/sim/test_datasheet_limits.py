"""No GPU of the catalogue prices a step faster than its datasheet allows: every step takes
at least its weight and KV bytes at peak bandwidth and its FLOPs at peak compute."""

import pytest

from slotune.engine.sim import GPUS, CostModel, get_model, load_profile

REQUIRED = ("h100", "h200", "b200", "mi300x", "l40s", "rtx4090")
STEPS = [  # (prefill tokens, decodes, context per decode)
    (0, 1, 1000),
    (0, 64, 2000),
    (512, 32, 4000),
    (8192, 0, 0),
]


def test_the_issue_gpus_are_listed_with_bandwidth_and_fp8_peaks() -> None:
    for name in REQUIRED:
        gpu = GPUS[name]
        assert gpu.hbm_gbps > 0 and gpu.bf16_tflops > 0
        assert gpu.fp8_tflops is not None and gpu.fp8_tflops >= gpu.bf16_tflops


def _floor(cm: CostModel, prefill: int, decodes: int, context: int, fp8: bool) -> float:
    """Bytes at peak bandwidth or FLOPs at peak compute, whichever is larger: the linear
    weights read once (for a MoE model at least ``top_k`` experts a layer), the LM head,
    the KV read by decodes; 2 FLOPs per active weight and token, the LM head's rows."""
    model, gpu = cm.model, cm.profile.gpu
    tokens, samples = prefill + decodes, (1 if prefill else 0) + decodes
    h = model.hidden_size
    linear_active = model.active_params - model.vocab_size * h * 2 - model.num_layers * 2 * h
    if model.moe is not None:
        linear_active -= model.moe.num_moe_layers * h * model.moe.num_experts  # routers
    lm_head = model.vocab_size * h
    experts = 0  # active expert weights, in their own format (gpt-oss: MXFP4)
    if model.moe is not None:
        moe = model.moe
        experts = moe.num_moe_layers * 3 * h * (moe.top_k * moe.expert_ffn + moe.shared_ffn)
    weight_bytes = (
        (linear_active - experts) * model.weight_format.bytes_per_weight
        + experts * model.expert_weight_format.bytes_per_weight
        + 2 * lm_head
    )
    kv = decodes * context * model.kv_bytes_per_token
    flops = 2 * tokens * linear_active + 2 * samples * lm_head
    peak = gpu.fp8_tflops * 1e12 if fp8 and gpu.fp8_tflops else gpu.flops_per_s
    return max((weight_bytes + kv) / gpu.hbm_bytes_per_s, flops / peak)


@pytest.mark.parametrize("gpu", sorted(GPUS))
@pytest.mark.parametrize(
    "model", ["llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "gpt-oss-20b"]
)
@pytest.mark.parametrize("quantization", [None, "fp8", "int4"])
def test_no_step_beats_the_datasheet(gpu: str, model: str, quantization: str | None) -> None:
    cm = CostModel(load_profile(gpu), get_model(model, quantization))
    for prefill, decodes, context in STEPS:
        t = cm.breakdown(prefill, 0, decodes, context).total
        assert t >= _floor(cm, prefill, decodes, context, quantization == "fp8"), (
            prefill,
            decodes,
        )
