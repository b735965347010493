"""The model catalogue: the shapes that decide weights, KV bytes and FLOPs per token.

Figures are those of each model's Hugging Face ``config.json``. Any such file of the Llama,
Mistral or Qwen2 families can be given by path instead of a catalogue name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from slotune.engine.hf_config import ModelConfig
from slotune.engine.sim.hardware import UnknownNameError


@dataclass(frozen=True)
class ModelSpec:
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

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer: ``2 × layers × kv_heads × head_dim × dtype bytes``."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def layer_params(self) -> int:
        h, hd = self.hidden_size, self.head_dim
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * hd
        bias = qkv_out if self.qkv_bias else 0
        return h * qkv_out + bias + self.num_heads * hd * h + 3 * h * self.intermediate_size + 2 * h

    @property
    def num_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return self.num_layers * self.layer_params + embeddings + lm_head + self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def check_tp(self, tp: int) -> None:
        if tp < 1 or self.num_heads % tp:
            raise ValueError(
                f"tensor parallel size {tp} must divide {self.name}'s {self.num_heads} "
                "attention heads"
            )

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads are split across GPUs, and replicated when there are fewer than GPUs."""
        return max(1, self.num_kv_heads // tp)

    def weight_bytes_per_gpu(self, tp: int) -> int:
        h, hd = self.hidden_size, self.head_dim
        qkv_out = (self.num_heads // tp + 2 * self.kv_heads_per_gpu(tp)) * hd
        per_layer = (
            h * qkv_out
            + (qkv_out if self.qkv_bias else 0)
            + self.num_heads // tp * hd * h
            + 3 * h * self.intermediate_size // tp
            + 2 * h
        )
        vocab = -(-self.vocab_size // tp) * h * (1 if self.tie_word_embeddings else 2)
        return (self.num_layers * per_layer + vocab + h) * self.dtype_bytes


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
    **kw: object,
) -> ModelSpec:
    return ModelSpec(
        name,
        h,
        layers,
        heads,
        kv,
        h // heads,
        ffn,
        vocab,
        max_position_embeddings=max_pos,
        eos_token_ids=eos,
        **kw,
    )  # type: ignore[arg-type]


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
    )
}


def get_model(name_or_path: str) -> ModelSpec:
    """A catalogue model by name, or the model described by an HF ``config.json`` path."""
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
    config = ModelConfig.from_hf_dict(data, where=str(path))
    return ModelSpec(
        name=str(path.parent.name or path.stem),
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        tie_word_embeddings=config.tie_word_embeddings,
        qkv_bias=config.attention_bias,
        max_position_embeddings=config.max_position_embeddings,
        eos_token_ids=config.eos_token_ids,
    )
