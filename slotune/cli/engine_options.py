"""The engine flags that several commands share (``bench``, ``serve``), and the one place
that turns them, with an optional ``--config`` JSON, into an ``EngineConfig``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from slotune.cli.common import opt

MaxNumBatchedTokens = Annotated[
    int | None, opt("--max-num-batched-tokens", "Token budget per step.")
]
LongPrefillTokenThreshold = Annotated[
    int | None, opt("--long-prefill-token-threshold", "Chunk cap (0 = off).")
]
BlockSize = Annotated[int | None, opt("--block-size", "KV block size.")]
MaxNumSeqs = Annotated[int | None, opt("--max-num-seqs", "Max running requests.")]
PreemptionMode = Annotated[str | None, opt("--preemption-mode", "recompute | swap | hybrid.")]
PrefixCaching = Annotated[str | None, opt("--prefix-caching", "none | hash | radix.")]
Policy = Annotated[str | None, opt("--policy", "chunked | prefill_first.")]
NumGpuBlocks = Annotated[int | None, opt("--num-gpu-blocks", "Override the KV pool size.")]
GpuMemoryUtilization = Annotated[
    float | None,
    opt("--gpu-memory-utilization", "Share of GPU memory for weights + KV pool (default 0.9)."),
]
SwapSpace = Annotated[
    float | None, opt("--swap-space", "CPU swap space per GPU for preempted KV, in GiB.")
]
KVCacheDtype = Annotated[
    str | None, opt("--kv-cache-dtype", "auto | fp8 | int8 | int4 (quantized: torch attention).")
]
Quantization = Annotated[
    str | None,
    opt(
        "--quantization",
        "Weight format of the simulated model: bf16 | fp8 | int8 | int4 (awq/gptq) | mxfp4 "
        "(default: the config.json's quantization_config, else bf16).",
    ),
]
ExpertParallel = Annotated[
    int, opt("--ep", "Expert-parallel GPUs among --tp for a MoE model (sim; 1 = experts TP).")
]
NumSpeculativeTokens = Annotated[
    int | None,
    opt("--num-speculative-tokens", "Prompt-lookup (n-gram) draft tokens per step (0 = off)."),
]
PromptLookupMin = Annotated[
    int | None, opt("--prompt-lookup-min", "Shortest n-gram a draft is looked up by.")
]
PromptLookupMax = Annotated[
    int | None, opt("--prompt-lookup-max", "Longest n-gram a draft is looked up by.")
]
SchedulingPolicy = Annotated[
    str | None, opt("--scheduling-policy", "fcfs | priority (the trace's per-request priority).")
]
SwapThreshold = Annotated[
    int | None,
    opt("--swap-threshold-tokens", "With --preemption-mode hybrid: swap victims this long."),
]
TopTierKVShare = Annotated[
    float | None, opt("--top-tier-kv-share", "Share of the KV pool reserved for tier 0.")
]
TopTierTokenShare = Annotated[
    float | None, opt("--top-tier-token-share", "Share of each step's budget for tier 0.")
]
DecodeBudget = Annotated[
    float | None,
    opt("--decode-budget-ms", "A preempted request waiting longer than this goes first."),
]
ConfigJson = Annotated[
    str | None,
    opt(
        "--config",
        "EngineConfig as a JSON file (best.json works) or inline JSON; flags override it.",
    ),
]


ENGINE_FLAGS = (
    "max_num_batched_tokens",
    "long_prefill_token_threshold",
    "block_size",
    "max_num_seqs",
    "max_model_len",
    "preemption_mode",
    "prefix_caching",
    "policy",
    "num_gpu_blocks",
    "gpu_memory_utilization",
    "swap_space_gb",
    "kv_cache_dtype",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "scheduling_policy",
    "swap_threshold_tokens",
    "top_tier_kv_share",
    "top_tier_token_share",
    "decode_budget_ms",
)


def flag_overrides(values: dict[str, Any]) -> dict[str, Any]:
    """The engine flags among a command's parameters (pass its ``locals()``)."""
    return {name: values[name] for name in ENGINE_FLAGS}


def build_engine_config(
    config: str | None, overrides: dict[str, Any], default_max_model_len: Callable[[], int]
) -> Any:
    """``EngineConfig`` from ``--config`` (a file or inline JSON; best.json and summary.json
    work), then the flags that were given; ``max_model_len`` from the default when neither
    sets it. Raises ``ValueError`` with a message for the user."""
    from slotune.engine.config import EngineConfig

    data: Any = {}
    if config:
        try:
            text = config if config.lstrip().startswith("{") else Path(config).read_text()
            data = json.loads(text)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"--config: cannot read {config}: {exc}") from None
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            data = data["config"]  # best.json or summary.json
        if not isinstance(data, dict):
            raise ValueError("--config: expected a JSON object of EngineConfig fields")
    data.update({k: v for k, v in overrides.items() if v is not None})
    if "max_model_len" not in data:
        data["max_model_len"] = default_max_model_len()
    try:
        return EngineConfig.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"engine config: {exc}") from None


TargetName = Annotated[
    str | None,
    opt(
        "--target",
        "Engine the configuration is for: vllm (newest supported, 0.34) | vllm==0.15 | sglang "
        "| slotune (its own engine, every knob); sets the simulator's stack.",
    ),
]
Stack = Annotated[
    str | None,
    opt(
        "--stack",
        "Serving stack the simulator models: a name or JSON (default: --target's, else vllm-v1).",
    ),
]


def resolve_stack(stack: str | None, target: str | None) -> str | None:
    """``--stack`` when given, else ``--target``'s stack profile, else None (the default)."""
    if stack is not None or target is None:
        return stack
    from slotune.targets import get_target

    return get_target(target).stack
