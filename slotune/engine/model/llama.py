"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2; Mixtral and Qwen2-MoE with routed-expert
feed-forward layers) over a paged KV cache.

``forward`` runs on the flattened tokens of one step, prefill chunks and decodes mixed,
writes their keys and values through the slot mapping, and returns logits only at the
rows named by ``logits_indices`` (each sampling request's last scheduled token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from slotune.engine.hf_config import ModelConfig
from slotune.engine.model.attention import AttentionBackend, AttentionMetadata, write_kv_cache
from slotune.engine.model.kv_cache import KVCache, KVLayer
from slotune.engine.model.mlp import MLP, SparseMoE
from slotune.engine.model.rope import RotaryEmbedding, apply_rotary


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [tokens] int64
    positions: torch.Tensor  # [tokens] int64
    attention: AttentionMetadata
    logits_indices: torch.Tensor  # [rows] int64


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        bias = config.attention_bias
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        k_cache: KVLayer,
        v_cache: KVLayer,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q, *cos_sin)
        k = apply_rotary(k, *cos_sin)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = backend.forward(q.contiguous(), k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(tokens, self.q_size))


def feed_forward(config: ModelConfig, layer: int) -> nn.Module:
    if config.moe is not None and config.moe.is_moe_layer(layer):
        return SparseMoE(config.hidden_size, config.moe)
    return MLP(config.hidden_size, config.intermediate_size, config.mlp_bias)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = feed_forward(config, layer)

    def forward(self, x: torch.Tensor, *attn_args: object) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), *attn_args)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """Built with uninitialised weights: ``loader.load_model`` fills them from a checkpoint."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # Given a weight, Embedding skips its random init, whose first call imports dynamo.
        weight = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        layers = range(config.num_hidden_layers)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        k_cache: KVCache,
        v_cache: KVCache,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """Logits [len(logits_indices), vocab] in float32.

        ``k_cache`` / ``v_cache`` are [layers, blocks, block_size, kv_heads, head_dim], plain
        or quantized (``kv_cache.QuantizedCache``).
        """
        x = self.embed_tokens(batch.input_ids)
        cos_sin = self.rotary.cos_sin(batch.positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos_sin, k_cache[i], v_cache[i], batch.attention, backend)
        x = self.norm(x[batch.logits_indices])
        return self.lm_head(x).float()
