"""Write a random-weight Llama checkpoint with a freshly trained BPE tokenizer.

The folder looks like any Hugging Face checkpoint (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json), so our loader and
transformers both read it, offline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from slotune.engine.model.corpus import corpus

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


@dataclass(frozen=True)
class Preset:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int


PRESETS = {
    "tiny": Preset(64, 128, 2, 4, 2, 512, 4096),
    "small": Preset(256, 688, 4, 8, 4, 2048, 8192),
}


def hf_config(preset: Preset) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": preset.hidden_size,
        "intermediate_size": preset.intermediate_size,
        "num_hidden_layers": preset.num_hidden_layers,
        "num_attention_heads": preset.num_attention_heads,
        "num_key_value_heads": preset.num_key_value_heads,
        "head_dim": preset.hidden_size // preset.num_attention_heads,
        "vocab_size": preset.vocab_size,
        "max_position_embeddings": preset.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "float32",
    }


def random_weights(preset: Preset, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Weights named as transformers names Llama's, normal(0, std); norms at one."""
    gen = torch.Generator().manual_seed(seed)
    h, f, v = preset.hidden_size, preset.intermediate_size, preset.vocab_size
    d = h // preset.num_attention_heads
    q, kv = preset.num_attention_heads * d, preset.num_key_value_heads * d

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * std

    weights = {"model.embed_tokens.weight": normal(v, h), "model.norm.weight": torch.ones(h)}
    for i in range(preset.num_hidden_layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": normal(q, h),
            p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.weight": normal(kv, h),
            p + "self_attn.o_proj.weight": normal(h, q),
            p + "mlp.gate_proj.weight": normal(f, h),
            p + "mlp.up_proj.weight": normal(f, h),
            p + "mlp.down_proj.weight": normal(h, f),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        }
    weights["lm_head.weight"] = normal(v, h)
    return weights


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer trained on the built-in corpus (round-trips any text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def init_model(out: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is unknown; choose one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(p.vocab_size)
    tokenizer.save(str(folder / "tokenizer.json"))
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    config = hf_config(p) | {"bos_token_id": bos, "eos_token_id": eos}
    _write_json(folder / "config.json", config)
    _write_json(folder / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos})
    _write_json(
        folder / "tokenizer_config.json",
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS},
    )
    save_file(random_weights(p, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _write_json(path: Path, data: dict[str, object]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
