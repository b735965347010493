"""vLLM V1 releases: 0.15 (the release the shipped stack profile was fitted on) and 0.34.

Both run chunked prefill only (no prefill-only steps), recompute preemption only (no swap
in V1), hash prefix caching or none, blocks of 16 to 128 on CUDA (the FlashAttention
backend needs a multiple of 16), and require ``max_num_batched_tokens >= max_num_seqs``.
Their serving defaults (``EngineArgs.get_batch_defaults``, API-server usage context):

- 0.15: a card with at least 70 GiB that is not an A100 gets a budget of 8192 and 1024
  sequences, any other 2048 and 256.
- 0.34: the same, except that a card with at least 160 GiB (B200, B300) gets 16384 and
  1024, and GB10 stays on the small tier.

KV caches: ``auto`` and ``fp8`` (e4m3) on both; 0.34 adds ``int8_per_token_head`` and
``int4_per_token_head`` (Triton attention backend). Online FP8 weights are
``--quantization fp8`` on 0.15 and ``fp8_per_tensor`` on 0.34 (plain ``fp8`` is deprecated
there for 16-bit checkpoints); int8 (W8A8), 4-bit and MXFP4 weights need a pre-quantized
checkpoint, whose config.json names the method (vLLM reads it, no flag).
"""

from __future__ import annotations

from typing import Any

from slotune.targets.base import BatchDefaults, Target, WeightServing

GIB_LARGE = 70.0
GIB_HUGE = 160.0

_COMMON_KNOBS = {
    "block_size": (16, 32, 64, 128),
    "preemption_mode": ("recompute",),
    "prefix_caching": ("none", "hash"),
    "policy": ("chunked",),
    "scheduling_policy": ("fcfs", "priority"),
    "top_tier_kv_share": (0.0,),  # no tier quotas, no decode budget: slotune's only
    "top_tier_token_share": (0.0,),
    "decode_budget_ms": (0.0,),
    "adaptive_chunk_ms": (0.0,),
}
_FIXED = {
    "block_size": 16,
    "preemption_mode": "recompute",
    "prefix_caching": "hash",
    "policy": "chunked",
    "kv_cache_dtype": "auto",
}

_INT8 = WeightServing(
    checkpoint="a W8A8 int8 compressed-tensors checkpoint",
    methods=("compressed-tensors",),
)
_INT4 = WeightServing(
    checkpoint="a 4-bit weight-only AWQ or GPTQ checkpoint",
    methods=("awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors"),
)
_MXFP4 = WeightServing(checkpoint="an MXFP4 checkpoint (gpt-oss)", methods=("mxfp4",))


def _large(gpu: Any) -> bool:
    return bool(gpu.memory_gib >= GIB_LARGE and "a100" not in gpu.name.lower())


def batch_0_15(gpu: Any) -> BatchDefaults:
    return BatchDefaults(8192, 1024) if _large(gpu) else BatchDefaults(2048, 256)


def batch_0_34(gpu: Any) -> BatchDefaults:
    if gpu.memory_gib >= GIB_HUGE:
        return BatchDefaults(16384, 1024)
    if _large(gpu) and "gb10" not in gpu.name.lower():
        return BatchDefaults(8192, 1024)
    return BatchDefaults(2048, 256)


VLLM_0_15 = Target(
    name="vllm==0.15",
    family="vllm",
    version="0.15",
    stack="vllm-0.15",
    knob_values={**_COMMON_KNOBS, "kv_cache_dtype": ("auto", "fp8")},
    long_prefill_threshold=True,
    budget_ge_seqs=True,
    batch=batch_0_15,
    weights={
        "fp8": WeightServing(online="fp8", methods=("fp8", "compressed-tensors")),
        "int8": _INT8,
        "int4": _INT4,
        "mxfp4": _MXFP4,
    },
    fixed_defaults=_FIXED,
    description="vLLM 0.15 (V1 engine), the release the reference runs measured",
    draft_policies=(),
    draft_note="slotune checked its draft-model export against vLLM 0.34's parser only",
)

VLLM_0_34 = Target(
    name="vllm==0.34",
    family="vllm",
    version="0.34",
    stack="vllm-0.34",
    knob_values={**_COMMON_KNOBS, "kv_cache_dtype": ("auto", "fp8", "int8", "int4")},
    long_prefill_threshold=True,
    budget_ge_seqs=True,
    batch=batch_0_34,
    weights={
        "fp8": WeightServing(online="fp8_per_tensor", methods=("fp8", "compressed-tensors")),
        "int8": _INT8,
        "int4": _INT4,
        "mxfp4": _MXFP4,
    },
    fixed_defaults=_FIXED,
    description="vLLM 0.34 (V1 engine), the newest release supported",
)
