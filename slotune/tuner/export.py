"""Export a configuration as a vLLM or SGLang command line, or as a YAML/JSON file.

``FLAGS`` is the one table from ``EngineConfig`` fields to each engine's flags. A rule
returns the flags for a value and, where the engine cannot express the choice, a comment
saying so and which nearest equivalent it used. ``QUANTIZATION`` does the same for the
model's weight precision, which is given (by ``best.json`` or the checkpoint), not tuned.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.engine.hf_config import quantization_method

FORMATS = ("vllm", "sglang", "yaml", "json")
VLLM_BLOCK_SIZES = (16, 32, 64, 128)
"""Block sizes vLLM serves on CUDA: ``--block-size`` takes 1 to 128, and its FlashAttention
backend needs a multiple of 16."""

Rule = Callable[[Any, EngineConfig], "Flags"]


@dataclass(frozen=True)
class Flags:
    args: tuple[str, ...] = ()
    comment: str | None = None


def _value(flag: str) -> Rule:
    return lambda v, _c: Flags((flag, str(v)))


def _vllm_threshold(v: int, _c: EngineConfig) -> Flags:
    return Flags(("--long-prefill-token-threshold", str(v))) if v else Flags()


def _sglang_chunk(v: int, c: EngineConfig) -> Flags:
    if c.policy == "prefill_first":
        return Flags(("--chunked-prefill-size", "-1", "--max-prefill-tokens", str(v)))
    chunk = c.long_prefill_token_threshold or v
    comment = None
    if c.long_prefill_token_threshold:
        comment = (
            f"SGLang has no per-request long-prefill threshold: chunks of "
            f"{chunk} tokens (--chunked-prefill-size) are the nearest equivalent"
        )
    return Flags(("--chunked-prefill-size", str(chunk), "--max-prefill-tokens", str(v)), comment)


def _vllm_block(v: int, _c: EngineConfig) -> Flags:
    if v in VLLM_BLOCK_SIZES:
        return Flags(("--block-size", str(v)))
    near = min(VLLM_BLOCK_SIZES, key=lambda b: abs(b - v))
    return Flags(
        ("--block-size", str(near)),
        f"vLLM serves block sizes {', '.join(map(str, VLLM_BLOCK_SIZES))} on CUDA: "
        f"{near} is the nearest to the tuned {v}",
    )


def _vllm_preemption(v: str, _c: EngineConfig) -> Flags:
    if v != "recompute":
        return Flags(
            (),
            f"vLLM V1 has no {v} preemption: it recomputes preempted requests "
            "(the nearest equivalent, used here)",
        )
    return Flags()


def _sglang_preemption(v: str, _c: EngineConfig) -> Flags:
    if v != "recompute":
        return Flags(
            (),
            f"SGLang has no {v} preemption: it retracts and recomputes "
            "requests (the nearest equivalent, used here)",
        )
    return Flags()


def _no_tiers(engine: str) -> Rule:
    def rule(v: float, _c: EngineConfig) -> Flags:
        if not v:
            return Flags()
        return Flags(
            (),
            f"{engine} reserves no share for a service tier: the tier quotas run on "
            "slotune's embedded engine only (left out here)",
        )

    return rule


def _no_budget(engine: str) -> Rule:
    def rule(v: float, _c: EngineConfig) -> Flags:
        if not v:
            return Flags()
        return Flags(
            (),
            f"{engine} has no decode budget for preempted requests: it runs on slotune's "
            "embedded engine only (left out here)",
        )

    return rule


def _vllm_scheduling(v: str, _c: EngineConfig) -> Flags:
    return Flags(("--scheduling-policy", "priority")) if v == "priority" else Flags()


def _sglang_scheduling(v: str, _c: EngineConfig) -> Flags:
    if v != "priority":
        return Flags()
    return Flags(
        ("--enable-priority-scheduling", "--schedule-low-priority-values-first"),
        "SGLang's priority scheduling preempts a running request only past its "
        "--priority-scheduling-preemption-threshold; slotune modeled vLLM's rule",
    )


def _vllm_prefix(v: str, _c: EngineConfig) -> Flags:
    if v == "none":
        return Flags(("--no-enable-prefix-caching",))
    comment = None
    if v == "radix":
        comment = (
            "vLLM has no radix prefix cache: its hash-based prefix caching is the "
            "nearest equivalent"
        )
    return Flags(("--enable-prefix-caching",), comment)


def _sglang_prefix(v: str, _c: EngineConfig) -> Flags:
    if v == "none":
        return Flags(("--disable-radix-cache",))
    if v == "hash":
        return Flags(
            (),
            "SGLang has no hash prefix cache: its radix cache (on by default) is "
            "the nearest equivalent",
        )
    return Flags()


def _vllm_policy(v: str, c: EngineConfig) -> Flags:
    if v == "prefill_first":
        return Flags(
            ("--no-enable-chunked-prefill", "--max-model-len", str(c.max_model_len)),
            "vLLM V1 never runs prefill-only steps: without chunked prefill it keeps "
            "prompts whole (the nearest equivalent); --max-model-len must not exceed "
            "the budget",
        )
    return Flags()


def _sglang_policy(v: str, _c: EngineConfig) -> Flags:
    if v == "chunked":
        return Flags(("--enable-mixed-chunk",))
    return Flags()


def _vllm_blocks(v: int | None, _c: EngineConfig) -> Flags:
    return Flags(("--num-gpu-blocks-override", str(v))) if v else Flags()


def _sglang_blocks(v: int | None, c: EngineConfig) -> Flags:
    if not v:
        return Flags()
    return Flags(("--max-total-tokens", str(v * c.block_size)))


def _none(_v: Any, _c: EngineConfig) -> Flags:
    return Flags()


def _kv_dtype(engine: str, flag_value: dict[str, str], int4_note: str = "") -> Rule:
    """``--kv-cache-dtype``: auto is the default; a precision the engine lacks maps to the
    value in ``flag_value`` with a comment."""
    missing = {
        "int8": f"{engine} has no int8 KV cache: {flag_value['int8']} (the same bytes per "
        "element) is the nearest equivalent",
        "int4": f"{engine} has no 4-bit KIVI KV cache: {flag_value['int4']}, the smallest it "
        f"offers on every GPU (twice int4's bytes), is the nearest equivalent{int4_note}",
    }

    def rule(v: str, _c: EngineConfig) -> Flags:
        if v == "auto":
            return Flags()
        return Flags(("--kv-cache-dtype", flag_value[v]), missing.get(v))

    return rule


_VLLM_KV = {"fp8": "fp8", "int8": "fp8", "int4": "fp8"}
_SGLANG_KV = {"fp8": "fp8_e4m3", "int8": "fp8_e4m3", "int4": "fp8_e4m3"}


FLAGS: dict[str, dict[str, Rule]] = {
    "max_num_batched_tokens": {"vllm": _value("--max-num-batched-tokens"), "sglang": _sglang_chunk},
    "long_prefill_token_threshold": {"vllm": _vllm_threshold, "sglang": _none},
    "block_size": {"vllm": _vllm_block, "sglang": _value("--page-size")},
    "max_num_seqs": {"vllm": _value("--max-num-seqs"), "sglang": _value("--max-running-requests")},
    "preemption_mode": {"vllm": _vllm_preemption, "sglang": _sglang_preemption},
    "prefix_caching": {"vllm": _vllm_prefix, "sglang": _sglang_prefix},
    "policy": {"vllm": _vllm_policy, "sglang": _sglang_policy},
    "gpu_memory_utilization": {
        "vllm": _value("--gpu-memory-utilization"),
        "sglang": _value("--mem-fraction-static"),
    },
    "num_gpu_blocks": {"vllm": _vllm_blocks, "sglang": _sglang_blocks},
    "max_model_len": {"vllm": _none, "sglang": _none},
    "swap_space_gb": {"vllm": _none, "sglang": _none},
    "scheduling_policy": {"vllm": _vllm_scheduling, "sglang": _sglang_scheduling},
    "swap_threshold_tokens": {"vllm": _none, "sglang": _none},
    "top_tier_kv_share": {"vllm": _no_tiers("vLLM"), "sglang": _no_tiers("SGLang")},
    "top_tier_token_share": {"vllm": _no_tiers("vLLM"), "sglang": _no_tiers("SGLang")},
    "decode_budget_ms": {"vllm": _no_budget("vLLM"), "sglang": _no_budget("SGLang")},
    "kv_cache_dtype": {
        "vllm": _kv_dtype("vLLM", _VLLM_KV),
        "sglang": _kv_dtype(
            "SGLang", _SGLANG_KV, "; its 4-bit fp4_e2m1 runs on Blackwell-class GPUs only"
        ),
    },
}
"""EngineConfig field -> engine -> rule. ``max_model_len`` is the trace's longest request,
not a serving limit, so it is not exported (except where prefill-first needs it)."""

_LAUNCH = {
    "vllm": lambda model, tp: (
        ["vllm", "serve", model] + (["--tensor-parallel-size", str(tp)] if tp > 1 else [])
    ),
    "sglang": lambda model, tp: (
        ["python", "-m", "sglang.launch_server", "--model-path", model]
        + (["--tp-size", str(tp)] if tp > 1 else [])
    ),
}


_PREQUANTIZED = (
    "awq",
    "gptq",
    "awq_marlin",
    "gptq_marlin",
    "compressed-tensors",
    "bitsandbytes",
    "mxfp4",
)
_FULL_PRECISION = ("auto", "none", "bf16", "bfloat16", "fp16", "float16")
_INT4_COMMENT = (
    "4-bit weight-only quantization needs an AWQ or GPTQ checkpoint: --quantization awq "
    "assumed (use gptq for a GPTQ checkpoint)"
)
QUANTIZATION: dict[str, dict[str, Flags]] = {
    "fp8": {
        "vllm": Flags(("--quantization", "fp8")),
        "sglang": Flags(("--quantization", "fp8")),
    },
    "int8": {
        "vllm": Flags(
            (),
            "vLLM runs int8 (W8A8) weights only from a pre-quantized compressed-tensors "
            "checkpoint, whose config.json names the method: serve such a checkpoint",
        ),
        "sglang": Flags(("--quantization", "w8a8_int8")),
    },
    "int4": {
        "vllm": Flags(("--quantization", "awq"), _INT4_COMMENT),
        "sglang": Flags(("--quantization", "awq"), _INT4_COMMENT),
    },
    **{m: {e: Flags(("--quantization", m)) for e in ("vllm", "sglang")} for m in _PREQUANTIZED},
}
"""The model's weight precision (slotune's name, or a checkpoint's ``quant_method``) ->
engine -> ``--quantization`` flags and comment. Full precision adds no flag."""


def quantization_args(quantization: str | None, engine: str) -> Flags:
    if quantization is None or quantization.lower() in _FULL_PRECISION:
        return Flags()
    key = {"w8a8_int8": "int8", "w4a16": "int4"}.get(quantization.lower(), quantization.lower())
    if key not in QUANTIZATION:
        known = ", ".join([*_FULL_PRECISION, *QUANTIZATION])
        raise ValueError(f"model quantization {quantization!r} is unknown; known: {known}")
    return QUANTIZATION[key][engine]


def engine_args(
    config: EngineConfig, engine: str, quantization: str | None = None
) -> tuple[list[str], list[str]]:
    """The flags and the comments for ``engine`` (``vllm`` or ``sglang``); ``quantization``
    is the model's weight precision, given rather than tuned."""
    args: list[str] = []
    comments: list[str] = []
    rules = [rules[engine](getattr(config, name), config) for name, rules in FLAGS.items()]
    for flags in [*rules, quantization_args(quantization, engine)]:
        args.extend(flags.args)
        if flags.comment:
            comments.append(flags.comment)
    return args, comments


def command_line(
    config: EngineConfig,
    engine: str,
    *,
    model: str,
    tp: int = 1,
    quantization: str | None = None,
    ep: int = 1,
) -> str:
    """A ready shell command, comments first (``# ...``), then the launch line."""
    args, comments = engine_args(config, engine, quantization)
    ep_args, ep_comment = expert_parallel_args(engine, tp, ep)
    if ep_comment:
        comments.append(ep_comment)
    words = _LAUNCH[engine](model, tp) + ep_args + args
    line = " ".join(shlex.quote(w) for w in words)
    return "\n".join([*(f"# {c}" for c in comments), line])


def expert_parallel_args(engine: str, tp: int, ep: int) -> tuple[list[str], str | None]:
    """vLLM's expert parallelism spans the whole tensor-parallel group (EP size = TP);
    SGLang takes the size."""
    if ep <= 1:
        return [], None
    if engine == "sglang":
        return ["--ep-size", str(ep)], None
    comment = None
    if ep != tp:
        comment = f"vLLM's expert parallelism spans all {tp} GPUs, not the {ep} simulated"
    return ["--enable-expert-parallel"], comment


def export(best: dict[str, Any], fmt: str) -> str:
    """Render a ``best.json`` (or any mapping with ``config``, ``model``, ``tp``) in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    config = EngineConfig.from_dict(best["config"])
    model = hf_model_name(str(best.get("model", "MODEL")))
    tp = int(best.get("tp", 1))
    if fmt in ("vllm", "sglang"):
        quantization = model_quantization(best)
        ep = int(best.get("ep") or 1)
        return command_line(config, fmt, model=model, tp=tp, quantization=quantization, ep=ep)
    if fmt == "json":
        return json.dumps(config.to_dict(), indent=2)
    import yaml

    header = "# slotune EngineConfig (slotune bench --config accepts the JSON form)\n"
    return header + yaml.safe_dump(config.to_dict(), sort_keys=False)


HF_NAMES = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-Instruct-v0.1",
    "qwen1.5-moe-a2.7b": "Qwen/Qwen1.5-MoE-A2.7B-Chat",
    "qwen2-moe-57b-a14b": "Qwen/Qwen2-57B-A14B-Instruct",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite-Chat",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "llama-4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
}
"""Catalogue names -> the Hugging Face repository a production engine would load."""


def hf_model_name(model: str) -> str:
    return HF_NAMES.get(model.lower(), model)


def model_quantization(best: dict[str, Any]) -> str | None:
    """``best["quantization"]`` when set, else the ``quant_method`` of the model's
    ``config.json`` when ``model`` is a local checkpoint folder or file."""
    if best.get("quantization"):
        return str(best["quantization"])
    path = Path(str(best.get("model", "")))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the model's config.json ({e})") from None
    return quantization_method(data)
