"""The model catalogue: the shapes that decide weights, KV bytes and FLOPs per token.

Figures are those of each model's Hugging Face ``config.json``. Any such file of a family
``hf_config`` reads (Llama, Mistral, Qwen2/3, Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3,
gpt-oss, Llama 4) can be given by path instead of a catalogue name; hand-written copies
of the MoE models' published files are in ``tests/sim/hf_configs``, and a test holds each
catalogue entry equal to what its file gives. Mixture-of-experts models
carry a ``MoESpec``, DeepSeek's latent attention an ``MLASpec``; every model a weight
format (``precision.WEIGHT_FORMATS``) for its linear layers, bf16 unless quantized, and
optionally another for its experts (gpt-oss's MXFP4 experts beside bf16 attention).

A model's sliding-window layers (gpt-oss's every other layer, attending to the last 128
tokens; ``num_sliding_layers`` and ``sliding_window``, from a config.json's ``layer_types``)
keep only their window's KV, as vLLM V1's hybrid KV cache manager frees the blocks behind
it: ``capacity`` sizes the pool by the full-attention layers and sets the sliding layers'
pages aside, and ``cost_model`` reads at most the window in them. Not modelled: Llama 4's
chunked attention is priced (KV bytes and attention reads) as full attention, which
overstates its KV use at long contexts; so is a window a config.json sets for every layer
without ``layer_types`` (Mistral v0.1's 4096).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from slotune.engine.hf_config import MLAConfig, ModelConfig
from slotune.engine.sim.hardware import UnknownNameError
from slotune.engine.sim.precision import WEIGHT_FORMATS, WeightFormat, weight_format_name


@dataclass(frozen=True)
class MoESpec:
    """Routed experts: each token runs ``top_k`` of ``num_experts`` SwiGLU experts of width
    ``expert_ffn``, plus a shared expert of width ``shared_ffn`` (0: none) on every token.
    Layers outside ``moe_layers`` keep the model's dense MLP (``intermediate_size``)."""

    num_experts: int
    top_k: int
    expert_ffn: int
    moe_layers: tuple[int, ...]
    shared_ffn: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"MoE top_k ({self.top_k}) must be between 1 and the number of experts "
                f"({self.num_experts})"
            )

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)


MLASpec = MLAConfig
"""DeepSeek's multi-head latent attention (``hf_config.MLAConfig``)."""


@dataclass(frozen=True)
class ModelSpec:
    """A model's shapes. ``num_heads × head_dim`` prices attention's FLOPs per query-key
    pair (``4 · heads · head_dim``); for an MLA model ``head_dim`` is the mean of its key
    and value head widths, which makes that product MLA's, and ``num_kv_heads`` is 1."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    dtype_bytes: int = 2
    moe: MoESpec | None = None
    weight_dtype: str = "bf16"
    expert_weight_dtype: str | None = None  # None: the experts are in weight_dtype
    mla: MLASpec | None = None
    num_sliding_layers: int = 0  # of num_layers, attending to the last sliding_window tokens
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.num_sliding_layers < self.num_layers:
            raise ValueError(
                f"{self.name}: {self.num_sliding_layers} sliding-window layers of "
                f"{self.num_layers}; at least one layer must attend to the full context"
            )
        if self.num_sliding_layers and not (self.sliding_window and self.sliding_window >= 1):
            raise ValueError(f"{self.name}: sliding-window layers need a sliding_window >= 1")
        for field, value in (
            ("weight_dtype", self.weight_dtype),
            ("expert_weight_dtype", self.expert_weight_dtype or self.weight_dtype),
        ):
            if value not in WEIGHT_FORMATS:
                raise ValueError(
                    f"{self.name}: {field} {value!r} is unknown; known: {', '.join(WEIGHT_FORMATS)}"
                )

    @property
    def weight_format(self) -> WeightFormat:
        return WEIGHT_FORMATS[self.weight_dtype]

    @property
    def expert_weight_format(self) -> WeightFormat:
        """The format of a MoE layer's routed and shared experts."""
        return WEIGHT_FORMATS[self.expert_weight_dtype or self.weight_dtype]

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - (self.moe.num_moe_layers if self.moe else 0)

    @property
    def num_full_layers(self) -> int:
        """Layers attending to the whole context (every layer but the sliding-window ones)."""
        return self.num_layers - self.num_sliding_layers

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer: ``2 × layers × kv_heads × head_dim × dtype bytes``; an MLA
        model's one latent per layer (``layers × (kv_lora_rank + qk_rope_head_dim) × bytes``).
        Sliding-window layers included: a token's KV until it leaves their window (the pool
        holds the full-attention layers': ``capacity``)."""
        heads, dim = self.kv_cache_shape(1)
        return 2 * self.num_layers * heads * dim * self.dtype_bytes

    def kv_cache_shape(self, tp: int) -> tuple[int, int]:
        """(heads, head dim) of the K and of the V that one of ``tp`` GPUs caches per token
        and layer. MLA caches one latent, shared by the heads and replicated on every GPU,
        as K and V halves of one head (576 values: two halves of 288) — its bytes, the only
        thing KV pricing uses."""
        if self.mla is not None:
            return 1, -(-self.mla.cached_values // 2)
        return self.kv_heads_per_gpu(tp), self.head_dim

    def attention_widths(self, tp: int) -> tuple[int, int]:
        """(QKV projection output width, output projection input width) on one of ``tp``
        GPUs: an ``[h, qkv] @`` and a ``[attn, h]`` GEMM price attention's projections. For
        MLA the first is the width with the weights (and FLOPs) of all its down- and
        up-projections together, rounded to a whole column."""
        q_heads, mla = self.num_heads // tp, self.mla
        if mla is None:
            qkv = (q_heads + 2 * self.kv_heads_per_gpu(tp)) * self.head_dim
            return qkv, q_heads * self.head_dim
        projections = _mla_projection_params(mla, self.hidden_size, q_heads)
        return round(projections / self.hidden_size), q_heads * mla.v_head_dim

    @property
    def num_params(self) -> int:
        return sum(self._params_split(1))

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: ``top_k`` experts of each MoE layer."""
        if self.moe is None:
            return self.num_params
        unused = self.moe.num_moe_layers * (self.moe.num_experts - self.moe.top_k)
        return self.num_params - unused * 3 * self.hidden_size * self.moe.expert_ffn

    @property
    def weight_bytes(self) -> int:
        return self.weight_bytes_per_gpu(1)

    def check_tp(self, tp: int) -> None:
        if tp < 1 or self.num_heads % tp:
            raise ValueError(
                f"tensor parallel size {tp} must divide {self.name}'s {self.num_heads} "
                "attention heads"
            )

    def check_ep(self, tp: int, ep: int) -> None:
        """Expert parallelism splits the experts over ``ep`` of the ``tp`` GPUs (each holds
        ``num_experts / ep`` whole experts, sharded ``tp / ep`` ways)."""
        if ep == 1:
            return
        if self.moe is None:
            raise ValueError(f"expert parallel size {ep} needs a MoE model; {self.name} is dense")
        if ep < 1 or tp % ep or self.moe.num_experts % ep:
            raise ValueError(
                f"expert parallel size {ep} must divide the tensor parallel size ({tp}) and "
                f"{self.name}'s {self.moe.num_experts} experts"
            )

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads are split across GPUs, and replicated when there are fewer than GPUs."""
        return max(1, self.num_kv_heads // tp)

    def weight_bytes_per_gpu(self, tp: int) -> int:
        """Linear layers in the weight format (experts in theirs); embeddings, LM head,
        norms, biases and MoE routers in the model's 16-bit dtype. Every expert is
        resident, used or not."""
        linear, experts, other = self._params_split(tp)
        return round(
            linear * self._bytes(self.weight_format)
            + experts * self._bytes(self.expert_weight_format)
            + other * self.dtype_bytes
        )

    def _bytes(self, fmt: WeightFormat) -> float:
        return self.dtype_bytes if fmt.bits_per_weight >= 16 else fmt.bytes_per_weight

    def _params_split(self, tp: int) -> tuple[int, int, int]:
        """(attention and dense-MLP weights, routed and shared expert weights, everything
        else) on one of ``tp`` GPUs. The experts come to ``num_experts · 3·h·F / tp`` per
        GPU whatever ``ep`` is."""
        h = self.hidden_size
        qkv_out, attn_dim = self.attention_widths(tp)
        mla = self.mla
        projections = (
            h * qkv_out if mla is None else _mla_projection_params(mla, h, self.num_heads // tp)
        )
        attention = projections + attn_dim * h
        per_layer_other = (qkv_out if self.qkv_bias else 0) + 2 * h
        if mla is not None:  # the latent's and the query bottleneck's RMSNorms
            per_layer_other += mla.kv_lora_rank + mla.q_lora_rank
        linear = self.num_layers * attention + self.num_dense_layers * (
            3 * h * self.intermediate_size // tp
        )
        vocab = -(-self.vocab_size // tp) * h * (1 if self.tie_word_embeddings else 2)
        other = self.num_layers * per_layer_other + vocab + h
        experts = 0
        if self.moe is not None:
            moe = self.moe
            routed = moe.num_experts * 3 * h * moe.expert_ffn // tp
            experts = moe.num_moe_layers * (routed + 3 * h * moe.shared_ffn // tp)
            other += moe.num_moe_layers * h * moe.num_experts  # the router
        return linear, experts, other


def _mla_projection_params(mla: MLASpec, h: int, q_heads: int) -> int:
    """MLA's weights on a GPU with ``q_heads`` of its heads, the output projection aside:
    queries (through the ``q_lora_rank`` bottleneck if any), the latent down-projection
    (replicated on every GPU), and the latent's up-projection to each head's key and value."""
    q_out = q_heads * mla.qk_head_dim
    queries = h * mla.q_lora_rank + mla.q_lora_rank * q_out if mla.q_lora_rank else h * q_out
    latent = h * mla.cached_values
    up = mla.kv_lora_rank * q_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return queries + latent + up


def _llama(
    name: str,
    h: int,
    layers: int,
    heads: int,
    kv: int,
    ffn: int,
    vocab: int,
    max_pos: int,
    eos: tuple[int, ...],
    *,
    head_dim: int | None = None,
    qkv_bias: bool = False,
    moe: MoESpec | None = None,
    weight_dtype: str = "bf16",
    expert_weight_dtype: str | None = None,
    mla: MLASpec | None = None,
    sliding: tuple[int, int] = (0, 0),  # (sliding-window layers, window)
) -> ModelSpec:
    return ModelSpec(
        name,
        h,
        layers,
        heads,
        kv,
        head_dim or h // heads,
        ffn,
        vocab,
        qkv_bias=qkv_bias,
        max_position_embeddings=max_pos,
        eos_token_ids=eos,
        moe=moe,
        weight_dtype=weight_dtype,
        expert_weight_dtype=expert_weight_dtype,
        mla=mla,
        num_sliding_layers=sliding[0],
        sliding_window=sliding[1] or None,
    )


def _experts(
    layers: int, experts: int, top_k: int, ffn: int, shared: int = 0, first_dense: int = 0
) -> MoESpec:
    return MoESpec(experts, top_k, ffn, tuple(range(first_dense, layers)), shared)


_QWEN_EOS = (151643, 151645)
_MOE_MODELS = (
    _llama(
        "mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, 32768, (2,), moe=_experts(32, 8, 2, 14336)
    ),
    _llama(
        "mixtral-8x22b", 6144, 56, 48, 8, 16384, 32000, 65536, (2,), moe=_experts(56, 8, 2, 16384)
    ),
    _llama(
        "qwen1.5-moe-a2.7b",
        2048,
        24,
        16,
        16,
        5632,
        151936,
        8192,
        _QWEN_EOS,
        qkv_bias=True,
        moe=_experts(24, 60, 4, 1408, shared=5632),
    ),
    _llama(
        "qwen2-moe-57b-a14b",
        3584,
        28,
        28,
        4,
        18944,
        151936,
        32768,
        _QWEN_EOS,
        qkv_bias=True,
        moe=_experts(28, 64, 8, 2560, shared=20480),
    ),
    # Qwen3's per-head q/k RMSNorms are too small to price.
    _llama(
        "qwen3-30b-a3b",
        2048,
        48,
        32,
        4,
        6144,
        151936,
        40960,
        _QWEN_EOS,
        head_dim=128,
        moe=_experts(48, 128, 8, 768),
    ),
    # DeepSeek's MLA: 576 cached values per token and layer; head_dim (192 + 128) / 2.
    _llama(
        "deepseek-v2-lite",
        2048,
        27,
        16,
        1,
        10944,
        102400,
        163840,
        (100001,),
        head_dim=160,
        mla=MLASpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128),
        moe=_experts(27, 64, 6, 1408, shared=2 * 1408, first_dense=1),
    ),
    # Shipped in block-scaled FP8; its multi-token-prediction layer is not counted.
    _llama(
        "deepseek-v3",
        7168,
        61,
        128,
        1,
        18432,
        129280,
        163840,
        (1,),
        head_dim=160,
        weight_dtype="fp8",
        mla=MLASpec(
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            q_lora_rank=1536,
        ),
        moe=_experts(61, 256, 8, 2048, shared=2048, first_dense=3),
    ),
    # gpt-oss ships its experts in MXFP4, attention and routers in bf16; every other layer
    # (from the first) attends to the last 128 tokens.
    _llama(
        "gpt-oss-20b",
        2880,
        24,
        64,
        8,
        2880,
        201088,
        131072,
        (200002, 199999),
        head_dim=64,
        qkv_bias=True,
        expert_weight_dtype="mxfp4",
        moe=_experts(24, 32, 4, 2880),
        sliding=(12, 128),
    ),
    _llama(
        "gpt-oss-120b",
        2880,
        36,
        64,
        8,
        2880,
        201088,
        131072,
        (200002, 199999),
        head_dim=64,
        qkv_bias=True,
        expert_weight_dtype="mxfp4",
        moe=_experts(36, 128, 4, 2880),
        sliding=(18, 128),
    ),
    # Llama 4 (17B active): routed to 1 expert plus a shared one, in every layer (Scout) or
    # every second one (Maverick, whose other layers have a dense MLP of 16384).
    _llama(
        "llama-4-scout",
        5120,
        48,
        40,
        8,
        16384,
        202048,
        10485760,
        (200001, 200007, 200008),
        head_dim=128,
        moe=_experts(48, 16, 1, 8192, shared=8192),
    ),
    _llama(
        "llama-4-maverick",
        5120,
        48,
        40,
        8,
        16384,
        202048,
        1048576,
        (200001, 200007, 200008),
        head_dim=128,
        moe=MoESpec(128, 1, 8192, tuple(range(1, 48, 2)), shared_ffn=8192),
    ),
)

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama("llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, (2,)),
        _llama("llama-2-13b", 5120, 40, 40, 40, 13824, 32000, 4096, (2,)),
        _llama("llama-2-70b", 8192, 80, 64, 8, 28672, 32000, 4096, (2,)),
        _llama("llama-3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, (128001, 128009)),
        _llama("llama-3-70b", 8192, 80, 64, 8, 28672, 128256, 8192, (128001, 128009)),
        _llama("mistral-7b", 4096, 32, 32, 8, 14336, 32000, 32768, (2,)),  # v0.1
        _llama(
            "qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, 32768, (151643, 151645), qkv_bias=True
        ),
        _llama(
            "qwen2.5-32b", 5120, 64, 40, 8, 27648, 152064, 32768, (151643, 151645), qkv_bias=True
        ),
        _llama(
            "qwen2.5-72b", 8192, 80, 64, 8, 29568, 152064, 32768, (151643, 151645), qkv_bias=True
        ),
        *_MOE_MODELS,
    )
}


def get_model(name_or_path: str, quantization: str | None = None) -> ModelSpec:
    """A catalogue model by name, or the model described by an HF ``config.json`` path;
    ``quantization`` (a ``--quantization`` value) overrides its weight format, experts
    included."""
    model = _find_model(name_or_path)
    if quantization is None:
        return model
    fmt = weight_format_name(quantization, "--quantization")
    return replace(model, weight_dtype=fmt, expert_weight_dtype=None)


def _find_model(name_or_path: str) -> ModelSpec:
    key = name_or_path.lower()
    if key in MODELS:
        return MODELS[key]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return model_from_hf_config(path)
    raise UnknownNameError(
        f"unknown model {name_or_path!r}; known models: {', '.join(MODELS)} "
        "(or give the path of a Hugging Face config.json)"
    )


def model_from_hf_config(path: Path) -> ModelSpec:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read a model config.json ({e})") from None
    return model_from_hf_dict(data, str(path.parent.name or path.stem), str(path))


def model_from_hf_dict(data: dict[str, Any], name: str, where: str = "config.json") -> ModelSpec:
    """The model a Hugging Face ``config.json``'s contents describe, named ``name``."""
    config = ModelConfig.from_hf_dict(data, where=where)
    weights = weight_format_name(config.quantization_scheme, f"{where}: quantization_config")
    # A checkpoint that leaves attention in 16 bits quantizes the MoE layers' experts.
    experts_only = config.quantization_skips_attention and config.moe is not None
    mla = config.mla
    return ModelSpec(
        name=name,
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=1 if mla else config.num_key_value_heads,
        head_dim=(mla.qk_head_dim + mla.v_head_dim) // 2 if mla else config.head_dim,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        tie_word_embeddings=config.tie_word_embeddings,
        qkv_bias=config.attention_bias,
        max_position_embeddings=config.max_position_embeddings,
        eos_token_ids=config.eos_token_ids,
        moe=_moe_spec(config),
        weight_dtype="bf16" if experts_only else weights,
        expert_weight_dtype=weights if experts_only else None,
        mla=mla,
        **_sliding(config),
    )


def _sliding(config: ModelConfig) -> dict[str, Any]:
    """``ModelSpec``'s sliding-window fields: the layers ``layer_types`` marks, unless it
    marks every one (no full-attention layer to size the pool by: priced as full)."""
    layers = len(config.sliding_layers)
    if not layers or layers >= config.num_hidden_layers:
        return {}
    return {"num_sliding_layers": layers, "sliding_window": config.sliding_window}


def _moe_spec(config: ModelConfig) -> MoESpec | None:
    moe = config.moe
    if moe is None:
        return None
    return MoESpec(
        num_experts=moe.num_experts,
        top_k=moe.num_experts_per_tok,
        expert_ffn=moe.moe_intermediate_size,
        moe_layers=tuple(moe.moe_layers),
        shared_ffn=moe.shared_expert_intermediate_size,
    )
