"""The engine flags that several commands share (``bench``, ``serve``).

Each knob flag is the typer parameter of the ``slotune.engine.knobs.EngineKnobs`` field of
the same name; a command builds ``EngineKnobs(name=name, ...)`` from them explicitly.
Adding a knob: the field there, its flag here, and the parameter and keyword in each
command (``tests/test_cli_thin.py`` fails on any piece missing)."""

from __future__ import annotations

from typing import Annotated

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
    opt(
        "--num-speculative-tokens",
        "Draft tokens per step (0 = off): prompt lookup (n-gram), or --speculative-model's.",
    ),
]
PromptLookupMin = Annotated[
    int | None, opt("--prompt-lookup-min", "Shortest n-gram a draft is looked up by.")
]
PromptLookupMax = Annotated[
    int | None, opt("--prompt-lookup-max", "Longest n-gram a draft is looked up by.")
]
SpeculativeModel = Annotated[
    str | None,
    opt(
        "--speculative-model",
        "Draft model: a checkpoint folder of the model's vocabulary (the simulator reads its "
        "config.json, or takes a catalogue name).",
    ),
]
SpeculativeAcceptance = Annotated[
    float | None,
    opt(
        "--speculative-acceptance",
        "Simulator: the rate at which draft tokens are accepted (default: 0.76 with a draft "
        "model, 0.82 n-gram; measured, see docs/BENCHMARKS.md).",
    ),
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
AdaptiveChunk = Annotated[
    float | None,
    opt(
        "--adaptive-chunk-ms",
        "Adaptive chunking: each step's budget fits this TPOT target (ms; 0 off).",
    ),
]
ConfigJson = Annotated[
    str | None,
    opt(
        "--config",
        "EngineConfig as a JSON file (best.json works) or inline JSON; flags override it.",
    ),
]


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
