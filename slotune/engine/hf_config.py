"""The model's shape, read from a Hugging Face ``config.json``.

The real engine runs ``SUPPORTED_MODEL_TYPES`` (Llama 2/3, Mistral, Qwen2/3 and the
mixture-of-experts Mixtral, Qwen2-MoE and Qwen3-MoE). ``SHAPE_ONLY_MODEL_TYPES``
(DeepSeek-V2/V3 with MLA attention, gpt-oss, Llama 4) are read for their shapes only, for
the simulator: their rotary scaling is not parsed and the torch executor refuses them.

Torch-free: the real executor builds its model from it and the simulator's catalogue its
cost-model shapes, so both read a checkpoint by the same rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
)
SHAPE_ONLY_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "gpt_oss", "llama4", "llama4_text")
# the model_type of a file that names only its architecture
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "Llama4ForConditionalGeneration": "llama4",
    "Llama4ForCausalLM": "llama4_text",
}
_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """Rotary-frequency scaling. ``llama3`` is Llama 3.1's long-context rescaling."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class MoEConfig:
    """Routed experts: each token's ``num_experts_per_tok`` highest-scoring experts (softmax
    over the router's logits) run and are summed with those scores, renormalised to sum to
    one when ``norm_topk_prob``. A shared expert (Qwen2-MoE) runs on every token, scaled
    by ``sigmoid(shared_expert_gate(x))``. Layers not in ``moe_layers`` keep a dense MLP of
    the model's ``intermediate_size``.
    """

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int  # of each routed expert
    moe_layers: tuple[int, ...]
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0  # 0: no shared expert

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self.moe_layers


@dataclass(frozen=True)
class MLAConfig:
    """DeepSeek's multi-head latent attention: one cached latent of ``kv_lora_rank`` values
    plus a ``qk_rope_head_dim`` rotary key per token and layer, shared by every head and
    up-projected to keys (``qk_nope_head_dim + qk_rope_head_dim``) and values
    (``v_head_dim``) per head; queries through a rank-``q_lora_rank`` bottleneck (0: none)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0

    @property
    def cached_values(self) -> int:
        """Values cached per token and layer (DeepSeek-V2/V3: 512 + 64 = 576)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    # the layers layer_types marks "sliding_attention"; () without layer_types, where a
    # sliding_window (Mistral v0.1's) applies to every layer
    sliding_layers: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    moe: MoEConfig | None = None
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head of q and k before RoPE
    quantization: str | None = None  # quantization_config.quant_method, e.g. "fp8", "awq"
    quantization_scheme: str | None = None  # what it holds (compressed-tensors: fp8, …)
    quantization_skips_attention: bool = False  # attention left unquantized (gpt-oss, Llama 4)
    mla: MLAConfig | None = None  # DeepSeek-V2/V3 latent attention

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any], where: str = "config.json") -> ModelConfig:
        model_type = data.get("model_type") or next(
            (_ARCHITECTURES[a] for a in data.get("architectures") or () if a in _ARCHITECTURES),
            None,
        )
        if model_type not in SUPPORTED_MODEL_TYPES + SHAPE_ONLY_MODEL_TYPES:
            raise ValueError(
                f"{where}: model_type {model_type!r} is not supported; supported: "
                f"{', '.join(SUPPORTED_MODEL_TYPES + SHAPE_ONLY_MODEL_TYPES)}"
            )
        if model_type == "llama4":  # a multimodal file: the language model's text_config
            data = _llama4_text(data, where)
            model_type = "llama4_text"
        shape_only = model_type in SHAPE_ONLY_MODEL_TYPES
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{where}: hidden_act {act!r} is not supported; only 'silu' is")
        try:
            hidden = int(data["hidden_size"])
            heads = int(data["num_attention_heads"])
            config = cls(
                model_type=model_type,
                vocab_size=int(data["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=_dense_intermediate_size(model_type, data),
                num_hidden_layers=int(data["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(data.get("num_key_value_heads") or heads),
                head_dim=int(data.get("head_dim") or hidden // heads),
                rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
                rope_theta=_rope_theta(data),
                rope_scaling=RopeScaling() if shape_only else _rope_scaling(data, where),
                max_position_embeddings=int(data.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
                attention_bias=_attention_bias(model_type, data),
                mlp_bias=bool(data.get("mlp_bias", False)),
                sliding_window=_sliding_window(data),
                sliding_layers=_sliding_layers(data),
                bos_token_id=data.get("bos_token_id"),
                eos_token_ids=_token_ids(data.get("eos_token_id")),
                moe=_moe(model_type, data, where),
                qk_norm=model_type in ("qwen3", "qwen3_moe"),
                quantization=quantization_method(data),
                quantization_scheme=quantization_scheme(data),
                quantization_skips_attention=_quantization_skips_attention(data),
                mla=_mla(data) if model_type in ("deepseek_v2", "deepseek_v3") else None,
            )
        except KeyError as e:
            raise ValueError(f"{where}: required field {e.args[0]!r} is missing") from None
        if config.num_attention_heads % config.num_key_value_heads:
            raise ValueError(
                f"{where}: num_attention_heads ({config.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({config.num_key_value_heads})"
            )
        return config

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        return cls.from_hf_dict(json.loads(path.read_text()), where=str(path))


def _llama4_text(data: dict[str, Any], where: str) -> dict[str, Any]:
    text = data.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{where}: a llama4 config.json needs its 'text_config'")
    top = {k: data[k] for k in ("quantization_config", "tie_word_embeddings") if k in data}
    return {**top, **text, "model_type": "llama4_text"}


def _dense_intermediate_size(model_type: str, data: dict[str, Any]) -> int:
    """The dense MLP's width; Llama 4 names it apart from its experts' ``intermediate_size``."""
    if model_type == "llama4_text":
        return int(data.get("intermediate_size_mlp") or data["intermediate_size"])
    return int(data["intermediate_size"])


def _mla(data: dict[str, Any]) -> MLAConfig:
    return MLAConfig(
        kv_lora_rank=int(data["kv_lora_rank"]),
        qk_rope_head_dim=int(data["qk_rope_head_dim"]),
        qk_nope_head_dim=int(data["qk_nope_head_dim"]),
        v_head_dim=int(data["v_head_dim"]),
        q_lora_rank=int(data.get("q_lora_rank") or 0),
    )


def _attention_bias(model_type: str, data: dict[str, Any]) -> bool:
    if model_type == "qwen2":
        return True
    if model_type == "qwen2_moe":  # files before transformers 4.51 lack the key: biased then
        return bool(data.get("qkv_bias", True))
    return bool(data.get("attention_bias", False))


def _moe(model_type: str, data: dict[str, Any], where: str) -> MoEConfig | None:
    """Which layers route, and to what, by each family's rule (that of its transformers
    modelling file)."""
    reader = _MOE_READERS.get(model_type)
    return None if reader is None else _checked_moe(reader(data), where)


def _mixtral_moe(data: dict[str, Any]) -> MoEConfig:
    """Every layer routed, renormalised top-k."""
    return MoEConfig(
        num_experts=int(data.get("num_local_experts", 8)),
        num_experts_per_tok=int(data.get("num_experts_per_tok", 2)),
        moe_intermediate_size=int(data["intermediate_size"]),
        moe_layers=tuple(range(int(data["num_hidden_layers"]))),
    )


def _qwen_moe(data: dict[str, Any]) -> MoEConfig:
    """Layer ``i`` routed when ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is not in
    ``mlp_only_layers``; Qwen2-MoE adds a gated shared expert, Qwen3-MoE has none.
    transformers 5 writes Qwen3-MoE's ``num_experts`` as ``num_local_experts``."""
    experts = int(data.get("num_experts", data.get("num_local_experts", 60)))
    step = int(data.get("decoder_sparse_step", 1))
    dense = set(data.get("mlp_only_layers") or ())
    layers = int(data["num_hidden_layers"])
    return MoEConfig(
        num_experts=experts,
        num_experts_per_tok=int(data.get("num_experts_per_tok", 4)),
        moe_intermediate_size=int(data.get("moe_intermediate_size", 1408)),
        moe_layers=tuple(
            i for i in range(layers) if experts > 0 and (i + 1) % step == 0 and i not in dense
        ),
        norm_topk_prob=bool(data.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=int(data.get("shared_expert_intermediate_size", 0)),
    )


def _deepseek_moe(data: dict[str, Any]) -> MoEConfig:
    """Layer ``i`` routed when ``i >= first_k_dense_replace`` and ``i % moe_layer_freq ==
    0``; ``n_shared_experts`` always-on experts of the routed width."""
    first_dense = int(data.get("first_k_dense_replace", 0))
    freq = int(data.get("moe_layer_freq", 1))
    ffn = int(data["moe_intermediate_size"])
    return MoEConfig(
        num_experts=int(data["n_routed_experts"]),
        num_experts_per_tok=int(data["num_experts_per_tok"]),
        moe_intermediate_size=ffn,
        moe_layers=tuple(
            i for i in range(int(data["num_hidden_layers"])) if i >= first_dense and i % freq == 0
        ),
        norm_topk_prob=bool(data.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=int(data.get("n_shared_experts") or 0) * ffn,
    )


def _gpt_oss_moe(data: dict[str, Any]) -> MoEConfig:
    """Every layer routed; ``experts_per_token`` in the files OpenAI wrote."""
    top_k = data.get("num_experts_per_tok") or data.get("experts_per_token") or 4
    return MoEConfig(
        num_experts=int(data["num_local_experts"]),
        num_experts_per_tok=int(top_k),
        moe_intermediate_size=int(data["intermediate_size"]),
        moe_layers=tuple(range(int(data["num_hidden_layers"]))),
    )


def _llama4_moe(data: dict[str, Any]) -> MoEConfig:
    """Every ``interleave_moe_layer_step``-th layer routed (layers ``step-1, 2·step-1, …``
    unless ``moe_layers`` lists them), each with a shared expert of the routed width."""
    layers = int(data["num_hidden_layers"])
    step = int(data.get("interleave_moe_layer_step", 1))
    listed = data.get("moe_layers")
    ffn = int(data["intermediate_size"])
    return MoEConfig(
        num_experts=int(data["num_local_experts"]),
        num_experts_per_tok=int(data.get("num_experts_per_tok", 1)),
        moe_intermediate_size=ffn,
        moe_layers=tuple(int(i) for i in listed)
        if listed is not None
        else tuple(range(step - 1, layers, step)),
        shared_expert_intermediate_size=ffn,
    )


_MOE_READERS = {
    "mixtral": _mixtral_moe,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek_moe,
    "deepseek_v3": _deepseek_moe,
    "gpt_oss": _gpt_oss_moe,
    "llama4_text": _llama4_moe,
}


def _checked_moe(moe: MoEConfig, where: str) -> MoEConfig:
    if not 1 <= moe.num_experts_per_tok <= moe.num_experts:
        raise ValueError(
            f"{where}: num_experts_per_tok ({moe.num_experts_per_tok}) must be between 1 and "
            f"the number of experts ({moe.num_experts})"
        )
    return moe


def quantization_method(data: dict[str, Any]) -> str | None:
    """The ``quant_method`` of a config.json's ``quantization_config`` (fp8, awq, gptq,
    compressed-tensors, …): what a serving engine's ``--quantization`` names."""
    quant = data.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = quant.get("quant_method")
    return str(method) if method else None


def quantization_scheme(data: dict[str, Any]) -> str | None:
    """The weight scheme the checkpoint holds: its ``quant_method``, or for a
    compressed-tensors file the scheme its config groups name (fp8, int8, w4a16) where
    they name one slotune knows."""
    method = quantization_method(data)
    if method == "compressed-tensors":
        return _compressed_tensors_scheme(data["quantization_config"]) or method
    return method


def _compressed_tensors_scheme(quant: dict[str, Any]) -> str | None:
    """FP8 or INT8 weights with 8-bit activations (W8A8), or 4-bit integer weights with
    16-bit activations (W4A16); None for any other scheme."""
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        acts = group.get("input_activations")
        bits, kind = weights.get("num_bits"), weights.get("type")
        if bits == 8 and kind == "float":
            return "fp8"
        if bits == 8 and kind == "int" and acts:
            return "int8"
        if bits == 4 and kind == "int" and not acts:
            return "w4a16"
    return None


def _quantization_skips_attention(data: dict[str, Any]) -> bool:
    """Whether the quantized checkpoint leaves attention in 16 bits (gpt-oss's
    ``modules_to_not_convert``, compressed-tensors' ``ignore`` naming ``self_attn``)."""
    quant = data.get("quantization_config")
    if not isinstance(quant, dict):
        return False
    skipped = list(quant.get("modules_to_not_convert") or ()) + list(quant.get("ignore") or ())
    return any("self_attn" in str(name) for name in skipped)


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope_params(data: dict[str, Any]) -> dict[str, Any]:
    """transformers >= 5 writes ``rope_parameters``; older files ``rope_theta``/``rope_scaling``."""
    params = data.get("rope_parameters")
    return params if isinstance(params, dict) else {}


def _rope_theta(data: dict[str, Any]) -> float:
    return float(_rope_params(data).get("rope_theta", data.get("rope_theta", 10000.0)))


def _rope_scaling(data: dict[str, Any], where: str) -> RopeScaling:
    raw = _rope_params(data) or data.get("rope_scaling") or {}
    rope_type = raw.get("rope_type", raw.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ValueError(
            f"{where}: rope type {rope_type!r} is not supported; "
            f"supported: {', '.join(_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return RopeScaling()
    defaults = RopeScaling()
    return RopeScaling(
        rope_type=rope_type,
        factor=float(raw.get("factor", 1.0)),
        low_freq_factor=float(raw.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(raw.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position_embeddings=int(
            raw.get("original_max_position_embeddings", defaults.original_max_position_embeddings)
        ),
    )


def _sliding_window(data: dict[str, Any]) -> int | None:
    if data.get("model_type") in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not data.get(
        "use_sliding_window"
    ):
        return None
    window = data.get("sliding_window")
    return int(window) if window else None


def _sliding_layers(data: dict[str, Any]) -> tuple[int, ...]:
    """The layers ``layer_types`` names ``sliding_attention`` (gpt-oss: every even one),
    when the model has a ``sliding_window``."""
    if _sliding_window(data) is None:
        return ()
    kinds = data.get("layer_types") or ()
    return tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention")
