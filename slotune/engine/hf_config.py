"""The model's shape, read from a Hugging Face ``config.json`` (Llama 2/3, Mistral, Qwen2).

Torch-free: the real executor builds its model from it and the simulator's catalogue its
cost-model shapes, so both read a checkpoint by the same rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# the model_type of a file that names only its architecture
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
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
                attention_bias=model_type == "qwen2" or bool(data.get("attention_bias", False)),
                mlp_bias=bool(data.get("mlp_bias", False)),
                sliding_window=_sliding_window(data),
                bos_token_id=data.get("bos_token_id"),
                eos_token_ids=_token_ids(data.get("eos_token_id")),
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
    if data.get("model_type") == "qwen2" and not data.get("use_sliding_window", False):
        return None
    window = data.get("sliding_window")
    return int(window) if window else None
