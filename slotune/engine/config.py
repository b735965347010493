"""Engine configuration: one frozen, validated dataclass."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from slotune.engine.kv_dtype import KV_CACHE_DTYPES

PreemptionMode = Literal["recompute", "swap", "hybrid"]
PrefixCaching = Literal["none", "hash", "radix"]
Policy = Literal["chunked", "prefill_first"]
KVCacheDtype = Literal["auto", "fp8", "int8", "int4"]
SchedulingPolicy = Literal["fcfs", "priority"]

_PREEMPTION_MODES = ("recompute", "swap", "hybrid")
_SCHEDULING_POLICIES = ("fcfs", "priority")
_PREFIX_CACHING = ("none", "hash", "radix")
_POLICIES = ("chunked", "prefill_first")


def _fail(field: str, rule: str, value: Any) -> None:
    raise ValueError(f"EngineConfig.{field}: {rule} (got {value!r})")


@dataclass(frozen=True)
class EngineConfig:
    """The scheduling and KV-cache knobs of the engine, named as in vLLM.

    ``long_prefill_token_threshold`` 0 means off. ``num_gpu_blocks`` overrides the pool
    size the executor would derive from ``gpu_memory_utilization``. ``kv_cache_dtype``
    stores the KV cache in the model's dtype (``auto``) or quantized (see ``kv_dtype``).
    ``num_speculative_tokens`` > 0 turns on n-gram speculation (prompt lookup of
    ``prompt_lookup_min``..``prompt_lookup_max`` tokens, vLLM's defaults; see
    ``slotune.engine.spec_decode``); 0 is off. With ``speculative_model`` (a local HF
    checkpoint of the target's vocabulary) a draft model drafts instead
    (``slotune.engine.model.draft``; the simulator prices its passes, reading its
    ``config.json``, or a catalogue model of that name). ``speculative_acceptance`` is the
    rate at which the simulator accepts draft tokens (None: the measured default of the
    kind, ``sim.speculative``); the real engine verifies and ignores it.

    ``scheduling_policy="priority"`` is vLLM's ``--scheduling-policy priority``: the
    waiting queue in (priority, arrival) order, the lowest-priority (highest value),
    latest-arrived running request preempted first. ``preemption_mode="hybrid"`` swaps a
    victim holding at least ``swap_threshold_tokens`` computed tokens and recomputes a
    shorter one (or any when the CPU pool is full); the threshold matters only there.

    ``top_tier_kv_share`` and ``top_tier_token_share`` reserve that share of the GPU KV
    blocks and of each step's token budget for tier-0 requests (a static reservation:
    the lower tiers together never hold more than the rest, even while no tier-0 request
    is there). With either on (``tiered``), tiers order both queues: tier 0 is admitted
    first and the highest tier value preempted first.

    ``decode_budget_ms`` (0: off) is a decode budget: a preempted request that has waited
    longer than this (its TPOT target) since it was preempted earns priority: it goes
    ahead of every request without it in both queues (admitted first, preempted last)
    until it finishes.

    ``adaptive_chunk_ms`` (0: off) is SLO-aware adaptive chunking: each step's token budget
    is what the step-time model lets the step take within this TPOT target, given the
    decodes running (``max_num_batched_tokens`` is the ceiling, taken when nobody decodes;
    see ``slotune.engine.chunking``).
    """

    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    block_size: int = 16
    max_num_seqs: int = 256
    max_model_len: int = 8192
    preemption_mode: PreemptionMode = "recompute"
    swap_space_gb: float = 4.0
    prefix_caching: PrefixCaching = "hash"
    policy: Policy = "chunked"
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks: int | None = None
    kv_cache_dtype: KVCacheDtype = "auto"
    num_speculative_tokens: int = 0
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    speculative_model: str | None = None
    speculative_acceptance: float | None = None
    scheduling_policy: SchedulingPolicy = "fcfs"
    swap_threshold_tokens: int = 2048
    top_tier_kv_share: float = 0.0
    top_tier_token_share: float = 0.0
    decode_budget_ms: float = 0.0
    adaptive_chunk_ms: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _OPTIONAL_FIELDS and value is None:
                continue
            if f.name in _INT_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
                _fail(f.name, "must be an integer", value)
        if self.max_num_batched_tokens < 1:
            _fail("max_num_batched_tokens", "must be at least 1", self.max_num_batched_tokens)
        if self.long_prefill_token_threshold < 0:
            _fail(
                "long_prefill_token_threshold",
                "must be 0 (off) or a positive token count",
                self.long_prefill_token_threshold,
            )
        bs = self.block_size
        if bs < 1 or bs & (bs - 1):
            _fail("block_size", "must be a power of two", bs)
        if self.max_num_seqs < 1:
            _fail("max_num_seqs", "must be at least 1", self.max_num_seqs)
        if self.max_model_len < 1:
            _fail("max_model_len", "must be at least 1", self.max_model_len)
        if self.preemption_mode not in _PREEMPTION_MODES:
            _fail("preemption_mode", f"must be one of {_PREEMPTION_MODES}", self.preemption_mode)
        if self.prefix_caching not in _PREFIX_CACHING:
            _fail("prefix_caching", f"must be one of {_PREFIX_CACHING}", self.prefix_caching)
        if self.policy not in _POLICIES:
            _fail("policy", f"must be one of {_POLICIES}", self.policy)
        if not isinstance(self.swap_space_gb, (int, float)) or self.swap_space_gb < 0:
            _fail("swap_space_gb", "must be a non-negative number of GB", self.swap_space_gb)
        if self.preemption_mode != "recompute" and self.swap_space_gb <= 0:
            _fail(
                "swap_space_gb",
                f"must be positive when preemption_mode={self.preemption_mode!r}",
                self.swap_space_gb,
            )
        if self.swap_threshold_tokens < 1:
            _fail("swap_threshold_tokens", "must be at least 1 token", self.swap_threshold_tokens)
        for name in ("top_tier_kv_share", "top_tier_token_share"):
            share = getattr(self, name)
            if isinstance(share, bool) or not isinstance(share, (int, float)):
                _fail(name, "must be a number in [0, 1)", share)
            if not 0 <= share < 1:
                _fail(name, "must be in [0, 1): the share reserved for tier 0", share)
        budget = self.decode_budget_ms
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 0:
            _fail("decode_budget_ms", "must be 0 (off) or a positive number of ms", budget)
        chunk_ms = self.adaptive_chunk_ms
        if (
            isinstance(chunk_ms, bool)
            or not isinstance(chunk_ms, (int, float))
            or not chunk_ms >= 0
        ):
            _fail("adaptive_chunk_ms", "must be 0 (off) or a positive TPOT target in ms", chunk_ms)
        if chunk_ms and self.policy == "prefill_first":
            _fail(
                "adaptive_chunk_ms",
                "must be 0 with policy='prefill_first', which never splits prompts",
                chunk_ms,
            )
        if self.tiered and self.lower_tier_token_budget < 1:
            _fail(
                "top_tier_token_share",
                f"leaves the lower tiers no token of max_num_batched_tokens="
                f"{self.max_num_batched_tokens}",
                self.top_tier_token_share,
            )
        if (
            self.tiered
            and self.policy == "prefill_first"
            and self.lower_tier_token_budget < self.max_model_len
        ):
            _fail(
                "top_tier_token_share",
                "must leave the lower tiers at least max_model_len tokens per step with "
                "policy='prefill_first', which never splits prompts",
                self.top_tier_token_share,
            )
        if self.scheduling_policy not in _SCHEDULING_POLICIES:
            _fail(
                "scheduling_policy",
                f"must be one of {_SCHEDULING_POLICIES}",
                self.scheduling_policy,
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            _fail("gpu_memory_utilization", "must be in (0, 1]", self.gpu_memory_utilization)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            _fail("kv_cache_dtype", f"must be one of {KV_CACHE_DTYPES}", self.kv_cache_dtype)
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            _fail("num_gpu_blocks", "must be at least 1 when set", self.num_gpu_blocks)
        if self.num_speculative_tokens < 0:
            _fail(
                "num_speculative_tokens", "must be 0 (off) or positive", self.num_speculative_tokens
            )
        draft = self.speculative_model
        if draft is not None and (not isinstance(draft, str) or not draft.strip()):
            _fail("speculative_model", "must be the path of a draft checkpoint, or None", draft)
        alpha = self.speculative_acceptance
        if alpha is not None and (
            isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1
        ):
            _fail("speculative_acceptance", "must be in [0, 1], or None (the default)", alpha)
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            _fail(
                "prompt_lookup_min",
                f"must be at least 1 and at most prompt_lookup_max={self.prompt_lookup_max}",
                self.prompt_lookup_min,
            )
        if self.policy == "prefill_first" and self.long_prefill_token_threshold:
            _fail(
                "long_prefill_token_threshold",
                "must be 0 with policy='prefill_first', which never splits prompts",
                self.long_prefill_token_threshold,
            )
        if self.policy == "prefill_first" and self.max_num_batched_tokens < self.max_model_len:
            _fail(
                "max_num_batched_tokens",
                "must be at least max_model_len with policy='prefill_first', "
                f"or a prompt of max_model_len={self.max_model_len} tokens could never run",
                self.max_num_batched_tokens,
            )

    @property
    def chunk_cap(self) -> int:
        """The most tokens one request computes in a step: ``long_prefill_token_threshold``,
        or the whole budget where it is 0 (off)."""
        return self.long_prefill_token_threshold or self.max_num_batched_tokens

    @property
    def tiered(self) -> bool:
        """Whether tier 0 has a reserved share (tiers then order the queues)."""
        return self.top_tier_kv_share > 0 or self.top_tier_token_share > 0

    @property
    def lower_tier_token_budget(self) -> int:
        """The tokens the lower tiers may take together in a step."""
        return int(self.max_num_batched_tokens * (1 - self.top_tier_token_share))

    def lower_tier_blocks(self, num_gpu_blocks: int) -> int:
        """The GPU blocks the lower tiers may hold together."""
        return int(num_gpu_blocks * (1 - self.top_tier_kv_share))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"EngineConfig: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


_OPTIONAL_FIELDS = ("num_gpu_blocks", "speculative_model", "speculative_acceptance")
_INT_FIELDS = frozenset(
    {
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
        "block_size",
        "max_num_seqs",
        "max_model_len",
        "num_gpu_blocks",
        "num_speculative_tokens",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "swap_threshold_tokens",
    }
)
