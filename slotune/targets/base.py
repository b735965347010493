"""What a target engine runs: its knob values, constraints, defaults and weight formats.

A ``Target`` is one release of a serving engine (or slotune's own engine). The tuner's
search space is derived from it (``knob_values``), its defaults on a GPU are the baseline
every recommendation is compared against, and ``problems`` says why a configuration
cannot be launched on it. Its flags live in ``slotune.targets.flags`` (one table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slotune.engine.config import EngineConfig


class ExportRefused(ValueError):
    """A configuration the target cannot launch exactly as measured: one line saying why."""


@dataclass(frozen=True)
class WeightServing:
    """How a target serves one weight format: ``online`` is the ``--quantization`` value
    that quantizes a 16-bit checkpoint at load (None: it needs a pre-quantized
    checkpoint), ``checkpoint`` the kind of checkpoint it needs, ``methods`` the
    ``quant_method`` values such a checkpoint's config.json may name, ``rename`` those the
    engine does not take as named (SGLang registers ``gptq_marlin`` only, on CUDA)."""

    online: str | None = None
    checkpoint: str = ""
    methods: tuple[str, ...] = ()
    rename: Mapping[str, str] = field(default_factory=dict)  # method -> --quantization needed

    @property
    def needs_checkpoint(self) -> bool:
        return self.online is None


FULL_PRECISION = ("auto", "none", "bf16", "bfloat16", "fp16", "float16")


@dataclass(frozen=True)
class BatchDefaults:
    """The per-GPU part of a target's defaults."""

    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class Target:
    """One engine release the tuner can recommend for.

    ``knob_values`` are the values the engine runs for the categorical knobs;
    ``long_prefill_threshold`` whether it has a per-request long-prefill threshold;
    ``budget_ge_seqs`` whether it requires ``max_num_batched_tokens >= max_num_seqs``;
    ``max_num_seqs_high`` the top of the searched ``max_num_seqs`` range; ``batch``
    its token budget and sequence limit per GPU; ``fixed_defaults`` its other defaults.
    """

    name: str  # "vllm==0.34"
    family: str  # "vllm" | "sglang" | "slotune"
    version: str
    stack: str  # the simulator's stack profile for this release
    knob_values: Mapping[str, tuple[Any, ...]]
    long_prefill_threshold: bool
    budget_ge_seqs: bool
    batch: Callable[[Any], BatchDefaults]  # GpuSpec -> defaults
    weights: Mapping[str, WeightServing]
    fixed_defaults: Mapping[str, Any] = field(default_factory=dict)
    max_num_seqs_high: int = 1024
    gpu_kv_only: bool = True  # KV formats limited to what the GPU serves (GpuSpec)
    description: str = ""
    baseline_note: str = ""
    # the policies it runs draft-model speculation with (None: all; empty: none)
    draft_policies: tuple[str, ...] | None = None
    draft_note: str = ""  # why, where it runs fewer

    @property
    def label(self) -> str:
        return {"vllm": "vLLM", "sglang": "SGLang", "slotune": "slotune"}[self.family] + (
            f" {self.version}" if self.version else ""
        )

    def defaults(self, gpu: Any, *, max_model_len: int, **fixed: Any) -> EngineConfig:
        """The target's serving defaults on ``gpu`` (a ``GpuSpec``), with ``fixed`` fields
        (a ``--search`` file's) applied: the baseline."""
        batch = self.batch(gpu)
        values = {
            "max_num_batched_tokens": batch.max_num_batched_tokens,
            "max_num_seqs": batch.max_num_seqs,
            "long_prefill_token_threshold": 0,
            **self.fixed_defaults,
            "max_model_len": max_model_len,
            **fixed,
        }
        return EngineConfig(**values)

    def problems(self, config: EngineConfig) -> list[str]:
        """Why ``config`` cannot run on this target (empty when it can)."""
        out = []
        for knob, allowed in self.knob_values.items():
            value = getattr(config, knob)
            if value not in allowed:
                out.append(
                    f"{self.name} does not run {knob}={value} "
                    f"(it runs {', '.join(map(str, allowed))})"
                )
        drafts = bool(config.speculative_model and config.num_speculative_tokens)
        policies = self.draft_policies
        if drafts and policies is not None and config.policy not in policies:
            out.append(
                f"{self.name} does not run policy={config.policy} with a draft model: "
                f"{self.draft_note}"
            )
        threshold = config.long_prefill_token_threshold
        if threshold and not self.long_prefill_threshold:
            out.append(f"{self.name} has no per-request long-prefill threshold (tuned {threshold})")
        if threshold and threshold > config.max_model_len:
            out.append(
                f"long_prefill_token_threshold {threshold} exceeds max_model_len "
                f"{config.max_model_len}"
            )
        if self.budget_ge_seqs and config.max_num_batched_tokens < config.max_num_seqs:
            out.append(
                f"{self.name} needs max_num_batched_tokens >= max_num_seqs "
                f"({config.max_num_batched_tokens} < {config.max_num_seqs})"
            )
        return out

    def weight_serving(self, quantization: str | None) -> WeightServing | None:
        """How the target serves a weight format (None: full precision, no flag)."""
        if quantization is None or quantization.lower() in FULL_PRECISION:
            return None
        from slotune.engine.sim.precision import weight_format_name

        fmt = weight_format_name(quantization, "quantization")
        if fmt in ("bf16", "fp16"):
            return None
        if fmt not in self.weights:
            served = ", ".join(["bf16", *self.weights]) or "bf16"
            raise ExportRefused(f"{self.name} does not serve {fmt} weights (it serves {served})")
        return self.weights[fmt]
