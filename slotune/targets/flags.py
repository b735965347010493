"""The one mapping from ``EngineConfig`` fields to each target's launch flags.

``FLAGS[field][target]`` is a rule: the flags that make the target run the field's value
as measured. A value the target cannot run never reaches a rule: ``Target.problems``
refuses it first, so no rule substitutes a "nearest equivalent". ``launch_words`` builds
the whole launch line (model, parallelism, weights, every field).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.targets.base import ExportRefused, Target


@dataclass(frozen=True)
class Launch:
    """What a launch line needs beyond the configuration: the checkpoint to serve
    (``served``: a path or a Hugging Face id), and the simulated GPU, model, TP, EP and
    weight format the configuration was measured with."""

    served: str
    gpu: str | None = None
    model: str | None = None
    tp: int = 1
    ep: int = 1
    quantization: str | None = None
    served_given: bool = False  # the user named the checkpoint (--served-model)


Rule = Callable[[Any, EngineConfig, Launch], tuple[str, ...]]


def _value(flag: str) -> Rule:
    return lambda v, _c, _l: (flag, str(v))


def _none(_v: Any, _c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    return ()


def _if_set(flag: str) -> Rule:
    return lambda v, _c, _l: (flag, str(v)) if v else ()


def _vllm_prefix(v: str, _c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    return ("--no-enable-prefix-caching",) if v == "none" else ("--enable-prefix-caching",)


def _vllm_policy(_v: str, _c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    return ("--enable-chunked-prefill",)


def _kv(values: dict[str, str]) -> Rule:
    return lambda v, _c, _l: () if v == "auto" else ("--kv-cache-dtype", values[v])


def _draft_checkpoint(c: EngineConfig) -> str:
    """The draft to serve: a checkpoint path or Hugging Face id, not a catalogue name."""
    draft = c.speculative_model or ""
    if "/" not in draft:
        raise ExportRefused(
            f"speculative_model {draft!r} names a simulator catalogue model; the engine "
            "loads the draft's checkpoint: give its path or Hugging Face id"
        )
    return draft


def _vllm_speculation(k: int, c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    """Speculation as slotune runs it: vLLM's ``draft_model`` method with a draft model,
    else prompt lookup (its ``ngram`` method)."""
    if not k:
        return ()
    spec: dict[str, object]
    if c.speculative_model:
        spec = {
            "method": "draft_model",
            "model": _draft_checkpoint(c),
            "num_speculative_tokens": k,
        }
    else:
        spec = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": c.prompt_lookup_max,
            "prompt_lookup_min": c.prompt_lookup_min,
        }
    return ("--speculative-config", json.dumps(spec))


def _sglang_speculation(k: int, c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    """A draft model is SGLang's STANDALONE algorithm: ``k`` draft steps of one token
    each (top-k 1, a chain), verifying ``k + 1`` tokens."""
    if not k:
        return ()
    if not c.speculative_model:
        raise ExportRefused(
            "SGLang's NGRAM speculation drafts from a cache of every request's tokens, not "
            "by prompt lookup as slotune measured: tune for SGLang without speculation, "
            "or with a draft model (--speculative-model)"
        )
    return (
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-draft-model-path",
        _draft_checkpoint(c),
        "--speculative-num-steps",
        str(k),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(k + 1),
    )


def _vllm_scheduling(v: str, _c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    return ("--scheduling-policy", "priority") if v == "priority" else ()


def _sglang_scheduling(v: str, _c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    """SGLang orders its queue by priority, lower values first as vLLM and slotune do (its
    preemption of running requests by priority is off by default, as slotune's is not)."""
    if v != "priority":
        return ()
    return ("--enable-priority-scheduling", "--schedule-low-priority-values-first")


def _sglang_budget(v: int, c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    """``--chunked-prefill-size`` caps a whole step's prefill: the budget, or -1 (no
    chunks) for prefill-first; ``--max-prefill-tokens`` the same budget."""
    chunk = "-1" if c.policy == "prefill_first" else str(v)
    return ("--chunked-prefill-size", chunk, "--max-prefill-tokens", str(v))


def _sglang_prefix(v: str, _c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    return ("--disable-radix-cache",) if v == "none" else ()


def _sglang_policy(v: str, _c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    return ("--enable-mixed-chunk",) if v == "chunked" else ()


def _sglang_blocks(v: int | None, c: EngineConfig, _l: Launch) -> tuple[str, ...]:
    return ("--max-total-tokens", str(v * c.block_size)) if v else ()


def _sglang_memory(_v: float, c: EngineConfig, launch: Launch) -> tuple[str, ...]:
    return ("--mem-fraction-static", f"{sglang_mem_fraction(c, launch):.3f}")


def sglang_mem_fraction(config: EngineConfig, launch: Launch) -> float:
    """SGLang's ``--mem-fraction-static``: (weights + KV pool) / GPU memory, the pool being
    the one the simulator sized (from ``gpu_memory_utilization``, less activations and the
    runtime reserve, or ``num_gpu_blocks``). Rounded down, so SGLang's pool is no larger."""
    if not launch.gpu or not launch.model:
        raise ExportRefused(
            "SGLang's --mem-fraction-static counts weights and the KV pool only: slotune "
            "derives it from a simulated GPU, and this configuration names none"
        )
    from slotune.engine.sim.capacity import determine_capacity, kv_block_bytes
    from slotune.engine.sim.models import get_model
    from slotune.engine.sim.profile import load_profile

    profile = load_profile(launch.gpu)
    model = get_model(launch.model, launch.quantization)
    blocks = config.num_gpu_blocks
    if blocks is None:
        blocks = determine_capacity(profile, model, launch.tp, config).num_gpu_blocks
    pool = blocks * kv_block_bytes(model, launch.tp, config.block_size, config.kv_cache_dtype)
    used = model.weight_bytes_per_gpu(launch.tp) + pool
    return int(1000 * used / profile.gpu.memory_bytes) / 1000


_SLOTUNE_FLAG = {
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "block_size": "--block-size",
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
    "preemption_mode": "--preemption-mode",
    "swap_space_gb": "--swap-space",
    "prefix_caching": "--prefix-caching",
    "policy": "--policy",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "num_gpu_blocks": "--num-gpu-blocks",
    "kv_cache_dtype": "--kv-cache-dtype",
    "num_speculative_tokens": "--num-speculative-tokens",
    "prompt_lookup_min": "--prompt-lookup-min",
    "prompt_lookup_max": "--prompt-lookup-max",
    "speculative_model": "--speculative-model",
    "speculative_acceptance": "--speculative-acceptance",
    "scheduling_policy": "--scheduling-policy",
    "swap_threshold_tokens": "--swap-threshold-tokens",
    "top_tier_kv_share": "--top-tier-kv-share",
    "top_tier_token_share": "--top-tier-token-share",
    "decode_budget_ms": "--decode-budget-ms",
    "adaptive_chunk_ms": "--adaptive-chunk-ms",
}

V15, V34, SGL, SLO = "vllm==0.15", "vllm==0.34", "sglang==0.5.23", "slotune"

FLAGS: dict[str, dict[str, Rule]] = {
    "max_num_batched_tokens": {
        V15: _value("--max-num-batched-tokens"),
        V34: _value("--max-num-batched-tokens"),
        SGL: _sglang_budget,
        SLO: _value(_SLOTUNE_FLAG["max_num_batched_tokens"]),
    },
    "long_prefill_token_threshold": {
        V15: _if_set("--long-prefill-token-threshold"),
        V34: _if_set("--long-prefill-token-threshold"),
        SGL: _none,  # none exists: Target.problems refuses a threshold
        SLO: _value(_SLOTUNE_FLAG["long_prefill_token_threshold"]),
    },
    "block_size": {
        V15: _value("--block-size"),
        V34: _value("--block-size"),
        SGL: _value("--page-size"),
        SLO: _value(_SLOTUNE_FLAG["block_size"]),
    },
    "max_num_seqs": {
        V15: _value("--max-num-seqs"),
        V34: _value("--max-num-seqs"),
        SGL: _value("--max-running-requests"),
        SLO: _value(_SLOTUNE_FLAG["max_num_seqs"]),
    },
    "max_model_len": {  # the trace's longest request, not a serving limit
        V15: _none,
        V34: _none,
        SGL: _none,
        SLO: _value(_SLOTUNE_FLAG["max_model_len"]),
    },
    "preemption_mode": {  # recompute only, the engines' behaviour
        V15: _none,
        V34: _none,
        SGL: _none,
        SLO: _value(_SLOTUNE_FLAG["preemption_mode"]),
    },
    "swap_space_gb": {  # used by swap preemption only, which only slotune has
        V15: _none,
        V34: _none,
        SGL: _none,
        SLO: _value(_SLOTUNE_FLAG["swap_space_gb"]),
    },
    "prefix_caching": {
        V15: _vllm_prefix,
        V34: _vllm_prefix,
        SGL: _sglang_prefix,
        SLO: _value(_SLOTUNE_FLAG["prefix_caching"]),
    },
    "policy": {
        V15: _vllm_policy,
        V34: _vllm_policy,
        SGL: _sglang_policy,
        SLO: _value(_SLOTUNE_FLAG["policy"]),
    },
    "gpu_memory_utilization": {
        V15: _value("--gpu-memory-utilization"),
        V34: _value("--gpu-memory-utilization"),
        SGL: _sglang_memory,
        SLO: _value(_SLOTUNE_FLAG["gpu_memory_utilization"]),
    },
    "num_gpu_blocks": {
        V15: _if_set("--num-gpu-blocks-override"),
        V34: _if_set("--num-gpu-blocks-override"),
        SGL: _sglang_blocks,
        SLO: _if_set(_SLOTUNE_FLAG["num_gpu_blocks"]),
    },
    "kv_cache_dtype": {
        V15: _kv({"fp8": "fp8"}),
        V34: _kv({"fp8": "fp8", "int8": "int8_per_token_head", "int4": "int4_per_token_head"}),
        SGL: _kv({"fp8": "fp8_e4m3"}),
        SLO: _value(_SLOTUNE_FLAG["kv_cache_dtype"]),
    },
    "num_speculative_tokens": {
        V15: _vllm_speculation,
        V34: _vllm_speculation,
        SGL: _sglang_speculation,
        SLO: _value(_SLOTUNE_FLAG["num_speculative_tokens"]),
    },
    # vLLM carries them in num_speculative_tokens' JSON
    "prompt_lookup_min": {
        V15: _none,
        V34: _none,
        SGL: _none,
        SLO: _value(_SLOTUNE_FLAG["prompt_lookup_min"]),
    },
    "prompt_lookup_max": {
        V15: _none,
        V34: _none,
        SGL: _none,
        SLO: _value(_SLOTUNE_FLAG["prompt_lookup_max"]),
    },
    "speculative_model": {  # carried by num_speculative_tokens' flags
        V15: _none,
        V34: _none,
        SGL: _none,
        SLO: _if_set(_SLOTUNE_FLAG["speculative_model"]),
    },
    "speculative_acceptance": {  # the simulator's assumption: no engine takes it
        V15: _none,
        V34: _none,
        SGL: _none,
        SLO: _none,
    },
    "scheduling_policy": {
        V15: _vllm_scheduling,
        V34: _vllm_scheduling,
        SGL: _sglang_scheduling,
        SLO: _value(_SLOTUNE_FLAG["scheduling_policy"]),
    },
    # slotune's own policies: the engines' knob_values refuse any value but the off one
    **{
        name: {V15: _none, V34: _none, SGL: _none, SLO: _value(_SLOTUNE_FLAG[name])}
        for name in (
            "swap_threshold_tokens",
            "top_tier_kv_share",
            "top_tier_token_share",
            "decode_budget_ms",
            "adaptive_chunk_ms",
        )
    },
}
"""EngineConfig field -> target name -> rule."""


def expert_parallel_sizes(target: Target, tp: int) -> tuple[int, ...]:
    """The expert-parallel sizes the target's launch line can say on ``tp`` GPUs: vLLM's
    EP spans the whole TP group (``--enable-expert-parallel``), SGLang's ``--ep-size``
    any divisor of the TP size, slotune's engine none (1: experts split as TP)."""
    if target.family == "vllm":
        return (1, tp) if tp > 1 else (1,)
    if target.family == "sglang":
        return tuple(k for k in range(1, tp + 1) if tp % k == 0)
    return (1,)


def launch_head(target: Target, launch: Launch) -> list[str]:
    tp = launch.tp
    if target.family == "vllm":
        words = ["vllm", "serve", launch.served]
        words += ["--tensor-parallel-size", str(tp)] if tp > 1 else []
        if launch.ep > 1:
            if launch.ep not in expert_parallel_sizes(target, tp):
                raise ExportRefused(
                    f"vLLM's expert parallelism spans the whole tensor-parallel group "
                    f"(EP = TP = {tp}); slotune measured EP {launch.ep}: tune with --ep {tp} "
                    "or --ep 1"
                )
            words.append("--enable-expert-parallel")
        return words
    if target.family == "sglang":
        words = ["python", "-m", "sglang.launch_server", "--model-path", launch.served]
        words += ["--tp-size", str(tp)] if tp > 1 else []
        words += ["--ep-size", str(launch.ep)] if launch.ep > 1 else []
        return words
    if tp > 1 or launch.ep > 1:
        raise ExportRefused("slotune's embedded engine serves on one device (no TP or EP)")
    return ["slotune", "serve", "--model", launch.served]


def _weights(target: Target, launch: Launch) -> list[str]:
    """The weight flags: none for 16-bit weights and for a pre-quantized checkpoint (the
    engine reads its ``quant_method``); the online method otherwise. Refuses when the
    format needs a checkpoint that was not given or is of another kind."""
    serving = target.weight_serving(launch.quantization)
    if serving is None:
        return []
    method = checkpoint_method(launch.served)
    if method is not None:
        if method not in serving.methods:
            raise ExportRefused(
                f"{launch.served} holds {method} weights; {target.name} serves the measured "
                f"{launch.quantization} weights from {serving.checkpoint or 'a 16-bit checkpoint'}"
            )
        if method in serving.rename:
            return ["--quantization", serving.rename[method]]
        return []
    if serving.needs_checkpoint:
        if not launch.served_given:
            raise ExportRefused(
                f"{launch.quantization} weights: {target.name} needs {serving.checkpoint} "
                f"(quant_method {', '.join(serving.methods)}); give it with "
                "--served-model PATH_OR_ID"
            )
        return []  # a Hub id: the engine reads the method from its config.json
    return ["--quantization", serving.online or ""]


def checkpoint_method(served: str) -> str | None:
    """The ``quant_method`` of a local checkpoint folder (None: none, or not local)."""
    path = Path(served) / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ExportRefused(f"{path}: cannot read the checkpoint's config.json ({e})") from None
    from slotune.engine.hf_config import quantization_method

    return quantization_method(data)


def launch_words(config: EngineConfig, target: Target, launch: Launch) -> list[str]:
    """The launch line of ``config`` on ``target``, word by word; ``ExportRefused`` with
    every reason when the target cannot run it exactly."""
    problems = target.problems(config)
    if problems:
        raise ExportRefused("; ".join(problems))
    words = launch_head(target, launch) + _weights(target, launch)
    for name, rules in FLAGS.items():
        words.extend(rules[target.name](getattr(config, name), config, launch))
    return words
