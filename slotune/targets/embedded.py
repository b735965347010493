"""slotune's own engine (``slotune serve --model``, ``--backend engine``): every knob.

It runs every block size, swap and recompute preemption, hash and radix prefix caching,
both policies and the four KV formats on any GPU (int8 and int4 are its own kernels);
its weights are the checkpoint's 16-bit ones. Its defaults are ``EngineConfig``'s.
"""

from __future__ import annotations

from typing import Any

from slotune.engine.config import EngineConfig
from slotune.engine.kv_dtype import KV_CACHE_DTYPES
from slotune.targets.base import BatchDefaults, Target


def batch(_gpu: Any) -> BatchDefaults:
    return BatchDefaults(EngineConfig.max_num_batched_tokens, EngineConfig.max_num_seqs)


SLOTUNE = Target(
    name="slotune",
    family="slotune",
    version="",
    stack="eager",
    knob_values={
        "block_size": (8, 16, 32, 64, 128, 256),
        "preemption_mode": ("recompute", "swap", "hybrid"),
        "prefix_caching": ("none", "hash", "radix"),
        "policy": ("chunked", "prefill_first"),
        "kv_cache_dtype": KV_CACHE_DTYPES,
        "scheduling_policy": ("fcfs", "priority"),
    },
    long_prefill_threshold=True,
    budget_ge_seqs=False,
    batch=batch,
    weights={},
    gpu_kv_only=False,
    description="slotune's embedded engine (every knob)",
)
