"""Load a local Hugging Face checkpoint folder. Nothing is ever downloaded.

The folder holds ``config.json``, weights in ``*.safetensors`` (one file, or shards named
by ``model.safetensors.index.json``), and optionally ``tokenizer.json`` and
``generation_config.json`` (whose ``eos_token_id`` wins over config.json's).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from slotune.engine.hf_config import SUPPORTED_MODEL_TYPES, ModelConfig, MoEConfig
from slotune.engine.model.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    tokenizer: Tokenizer | None
    eos_token_ids: tuple[int, ...]
    path: Path


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine; use 'cpu'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` is bfloat16 on CUDA and float32 on the CPU (where bf16 matmuls are slow)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; choose auto or one of {list(_DTYPES)}")
    return _DTYPES[dtype]


def load_model(path: str | Path, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(
            f"model {str(folder)!r}: no config.json there; pass a local Hugging Face checkpoint "
            "folder (make one with `slotune init-model DIR`)"
        )
    config = ModelConfig.from_file(config_file)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{config_file}: the torch executor cannot run {config.model_type!r} models "
            f"(it runs {', '.join(SUPPORTED_MODEL_TYPES)}); simulate this model instead"
        )
    if config.quantization is not None:
        raise ValueError(
            f"{config_file}: weights quantized with {config.quantization!r} cannot be loaded by "
            "the torch executor, which runs float16/bfloat16/float32 checkpoints; simulate "
            "this model instead, or load its unquantized checkpoint"
        )
    if config.sliding_window is not None:
        logger.warning(
            "%s: sliding_window=%d is not applied; attention over contexts longer than that "
            "differs from the reference model",
            config_file,
            config.sliding_window,
        )
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(_read_weights(folder, config), assign=True, strict=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model = model.to(device=dev, dtype=torch_dtype).eval()
    return LoadedModel(
        model=model,
        config=config,
        tokenizer=_load_tokenizer(folder),
        eos_token_ids=_eos_token_ids(folder, config),
        path=folder,
    )


def _weight_files(folder: Path) -> list[Path]:
    index = folder / _INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({folder / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index}: names shard(s) that are not there: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model {str(folder)!r}: no *.safetensors weight files found")
    return files


def _read_weights(folder: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Checkpoint tensors renamed to our modules, with q/k/v and gate/up fused."""
    raw: dict[str, torch.Tensor] = {}
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                raw[name.removeprefix("model.")] = f.get_tensor(name)
    out: dict[str, torch.Tensor] = {}
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}."
        attn = p + "self_attn."
        out[attn + "qkv_proj.weight"] = _cat(raw, [attn + f"{x}_proj.weight" for x in "qkv"])
        if config.attention_bias:
            out[attn + "qkv_proj.bias"] = _cat(raw, [attn + f"{x}_proj.bias" for x in "qkv"])
        out[attn + "o_proj.weight"] = _take(raw, attn + "o_proj.weight")
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                out[attn + norm + ".weight"] = _take(raw, attn + norm + ".weight")
        if config.moe is not None and config.moe.is_moe_layer(i):
            out |= _moe_weights(raw, config.model_type, config.moe, i)
        else:
            out |= _mlp_weights(raw, p + "mlp.", p + "mlp.", bias=config.mlp_bias)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[p + norm + ".weight"] = _take(raw, p + norm + ".weight")
    out["embed_tokens.weight"] = _take(raw, "embed_tokens.weight")
    out["norm.weight"] = _take(raw, "norm.weight")
    if config.tie_word_embeddings:
        raw.pop("lm_head.weight", None)
        out["lm_head.weight"] = out["embed_tokens.weight"]
    else:
        out["lm_head.weight"] = _take(raw, "lm_head.weight")
    raw = {k: v for k, v in raw.items() if not k.endswith("rotary_emb.inv_freq")}
    if raw:
        raise ValueError(f"model {str(folder)!r}: unexpected weights {sorted(raw)[:5]}")
    return out


def _mlp_weights(
    raw: dict[str, torch.Tensor], src: str, dst: str, bias: bool = False
) -> dict[str, torch.Tensor]:
    """A SwiGLU MLP under ``src`` with its gate and up projections fused, renamed to ``dst``."""
    out = {
        dst + "gate_up_proj.weight": _cat(raw, [src + "gate_proj.weight", src + "up_proj.weight"]),
        dst + "down_proj.weight": _take(raw, src + "down_proj.weight"),
    }
    if bias:
        out[dst + "gate_up_proj.bias"] = _cat(raw, [src + "gate_proj.bias", src + "up_proj.bias"])
        out[dst + "down_proj.bias"] = _take(raw, src + "down_proj.bias")
    return out


# Each family's names, under a layer, for (router, expert prefix, gate, up, down).
_MOE_NAMES = {
    "mixtral": ("block_sparse_moe.gate", "block_sparse_moe.experts", "w1", "w3", "w2"),
    "qwen2_moe": ("mlp.gate", "mlp.experts", "gate_proj", "up_proj", "down_proj"),
    "qwen3_moe": ("mlp.gate", "mlp.experts", "gate_proj", "up_proj", "down_proj"),
}


def _moe_weights(
    raw: dict[str, torch.Tensor], model_type: str, moe: MoEConfig, layer: int
) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint matrices stacked into ``SparseMoE``'s [experts, out, in] tensors."""
    p = f"layers.{layer}."
    router, experts, gate, up, down = _MOE_NAMES[model_type]
    names = [f"{p}{experts}.{e}." for e in range(moe.num_experts)]
    out = {
        p + "mlp.gate.weight": _take(raw, p + router + ".weight"),
        p + "mlp.experts_gate_up": torch.stack(
            [_cat(raw, [n + gate + ".weight", n + up + ".weight"]) for n in names]
        ),
        p + "mlp.experts_down": torch.stack([_take(raw, n + down + ".weight") for n in names]),
    }
    if moe.shared_expert_intermediate_size:
        out |= _mlp_weights(raw, p + "mlp.shared_expert.", p + "mlp.shared_expert.")
        out[p + "mlp.shared_expert_gate.weight"] = _take(raw, p + "mlp.shared_expert_gate.weight")
    return out


def _take(raw: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in raw:
        raise ValueError(f"checkpoint: weight {'model.' + name!r} is missing")
    return raw.pop(name)


def _cat(raw: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([_take(raw, n) for n in names], dim=0)


def _load_tokenizer(folder: Path) -> Tokenizer | None:
    file = folder / "tokenizer.json"
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(file))


def _eos_token_ids(folder: Path, config: ModelConfig) -> tuple[int, ...]:
    gen = folder / "generation_config.json"
    if gen.is_file():
        value = json.loads(gen.read_text()).get("eos_token_id")
        if value is not None:
            return (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    return config.eos_token_ids
