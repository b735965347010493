"""The model's shape, read from a Hugging Face ``config.json`` (Llama 2/3, Mistral, Qwen2, and the
mixture-of-experts Mixtral and Qwen2-MoE).

Torch-free: the real executor builds its model from it and the simulator's catalogue its
cost-model shapes, so both read a checkpoint by the same rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe")
# the model_type of a file that names only its architecture
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
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
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    moe: MoEConfig | None = None
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head of q and k before RoPE
    quantization: str | None = None  # quantization_config.quant_method, e.g. "fp8", "awq"

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any], where: str = "config.json") -> ModelConfig:
        model_type = data.get("model_type") or next(
            (_ARCHITECTURES[a] for a in data.get("architectures") or () if a in _ARCHITECTURES),
            None,
        )
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"{where}: model_type {model_type!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
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
                intermediate_size=int(data["intermediate_size"]),
                num_hidden_layers=int(data["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(data.get("num_key_value_heads") or heads),
                head_dim=int(data.get("head_dim") or hidden // heads),
                rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
                rope_theta=_rope_theta(data),
                rope_scaling=_rope_scaling(data, where),
                max_position_embeddings=int(data.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
                attention_bias=_attention_bias(model_type, data),
                mlp_bias=bool(data.get("mlp_bias", False)),
                sliding_window=_sliding_window(data),
                bos_token_id=data.get("bos_token_id"),
                eos_token_ids=_token_ids(data.get("eos_token_id")),
                moe=_moe(model_type, data, where),
                qk_norm=model_type == "qwen3",
                quantization=quantization_method(data),
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


def _attention_bias(model_type: str, data: dict[str, Any]) -> bool:
    if model_type == "qwen2":
        return True
    if model_type == "qwen2_moe":  # files before transformers 4.51 lack the key: biased then
        return bool(data.get("qkv_bias", True))
    return bool(data.get("attention_bias", False))


def _moe(model_type: str, data: dict[str, Any], where: str) -> MoEConfig | None:
    """Mixtral: every layer routed, renormalised top-k. Qwen2-MoE: layer ``i`` routed when
    ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is not in ``mlp_only_layers``."""
    if model_type == "mixtral":
        experts = int(data.get("num_local_experts", 8))
        return _checked_moe(
            MoEConfig(
                num_experts=experts,
                num_experts_per_tok=int(data.get("num_experts_per_tok", 2)),
                moe_intermediate_size=int(data["intermediate_size"]),
                moe_layers=tuple(range(int(data["num_hidden_layers"]))),
            ),
            where,
        )
    if model_type != "qwen2_moe":
        return None
    experts = int(data.get("num_experts", 60))
    step = int(data.get("decoder_sparse_step", 1))
    dense = set(data.get("mlp_only_layers") or ())
    layers = int(data["num_hidden_layers"])
    moe_layers = tuple(
        i for i in range(layers) if experts > 0 and (i + 1) % step == 0 and i not in dense
    )
    return _checked_moe(
        MoEConfig(
            num_experts=experts,
            num_experts_per_tok=int(data.get("num_experts_per_tok", 4)),
            moe_intermediate_size=int(data.get("moe_intermediate_size", 1408)),
            moe_layers=moe_layers,
            norm_topk_prob=bool(data.get("norm_topk_prob", False)),
            shared_expert_intermediate_size=int(data.get("shared_expert_intermediate_size", 0)),
        ),
        where,
    )


def _checked_moe(moe: MoEConfig, where: str) -> MoEConfig:
    if not 1 <= moe.num_experts_per_tok <= moe.num_experts:
        raise ValueError(
            f"{where}: num_experts_per_tok ({moe.num_experts_per_tok}) must be between 1 and "
            f"the number of experts ({moe.num_experts})"
        )
    return moe


def quantization_method(data: dict[str, Any]) -> str | None:
    """The ``quant_method`` of a config.json's ``quantization_config`` (fp8, awq, gptq, …)."""
    quant = data.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = quant.get("quant_method")
    return str(method) if method else None


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
    if data.get("model_type") in ("qwen2", "qwen3", "qwen2_moe") and not data.get(
        "use_sliding_window"
    ):
        return None
    window = data.get("sliding_window")
    return int(window) if window else None
