"""SGLang 0.5 (0.5.23).

Its scheduler runs prefill in chunks of at most ``--chunked-prefill-size`` tokens, which
caps a whole step's prefill (not one request's), so SGLang has no per-request long-prefill
threshold. slotune's ``chunked`` policy (prefill chunks batched with decodes under one
budget) is SGLang's ``--enable-mixed-chunk`` with the budget as both
``--chunked-prefill-size`` and ``--max-prefill-tokens``; ``prefill_first`` (whole prompts,
prefill-only steps) is ``--chunked-prefill-size -1``. Prefix caching is the radix cache or
none; preemption retracts and recomputes. ``--mem-fraction-static`` counts weights and
the KV pool only (activations excluded), so it is derived from the simulated pool, not
copied from ``gpu_memory_utilization``.

Defaults (``memory_hook._handle_gpu_memory_settings``): a chunk of 2048 tokens below
20 GiB, 4096 below 60 GiB, 8192 below 160 GiB, else 16384; pages of 1 token; radix cache
on; ``max_running_requests`` from the pool (``clamp(pool / context × 512, 2048, 4096)``,
at most half the pool), which is 4096 wherever the pool holds eight full contexts.
"""

from __future__ import annotations

from typing import Any

from slotune.targets.base import BatchDefaults, Target, WeightServing

MAX_RUNNING_DEFAULT = 4096


def batch_0_5(gpu: Any) -> BatchDefaults:
    gib = gpu.memory_gib
    if gib < 20:
        chunk = 2048
    elif gib < 60:
        chunk = 4096
    elif gib < 160:
        chunk = 8192
    else:
        chunk = 16384
    return BatchDefaults(chunk, MAX_RUNNING_DEFAULT)


SGLANG_0_5 = Target(
    name="sglang==0.5.23",
    family="sglang",
    version="0.5.23",
    stack="sglang-0.5",
    draft_policies=("prefill_first",),
    draft_note="its STANDALONE speculation turns off --enable-mixed-chunk (prefill chunks "
    "and decodes never share a step)",
    knob_values={
        "block_size": (1, 16, 32, 64, 128),
        "preemption_mode": ("recompute",),
        "prefix_caching": ("none", "radix"),
        "policy": ("chunked", "prefill_first"),
        "kv_cache_dtype": ("auto", "fp8"),
        "scheduling_policy": ("fcfs", "priority"),
        "top_tier_kv_share": (0.0,),
        "top_tier_token_share": (0.0,),
        "decode_budget_ms": (0.0,),
        "adaptive_chunk_ms": (0.0,),
    },
    long_prefill_threshold=False,
    budget_ge_seqs=False,
    batch=batch_0_5,
    weights={
        "fp8": WeightServing(online="fp8", methods=("fp8", "compressed-tensors")),
        "int8": WeightServing(
            checkpoint="a W8A8 int8 checkpoint (w8a8_int8 or compressed-tensors)",
            methods=("w8a8_int8", "compressed-tensors"),
        ),
        "int4": WeightServing(
            checkpoint="a 4-bit weight-only AWQ or GPTQ checkpoint",
            methods=("awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors"),
            rename={"gptq": "gptq_marlin"},
        ),
        "mxfp4": WeightServing(checkpoint="an MXFP4 checkpoint (gpt-oss)", methods=("mxfp4",)),
    },
    fixed_defaults={
        "block_size": 1,
        "preemption_mode": "recompute",
        "prefix_caching": "radix",
        "policy": "chunked",
        "kv_cache_dtype": "auto",
    },
    max_num_seqs_high=4096,
    description="SGLang 0.5.23",
    baseline_note=(
        "SGLang runs prefill chunks in steps of their own by default; slotune simulates "
        "them mixed with decodes (--enable-mixed-chunk, which the baseline and every "
        "export set)"
    ),
)
