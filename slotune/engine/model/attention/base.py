"""What every attention backend consumes: a flattened varlen batch over a paged KV cache.

A step's tokens from all requests are concatenated (prefill chunks and decodes mixed).
Request ``i`` owns query rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]``; its keys are the
first ``seq_lens_k[i]`` positions of its context (cached tokens plus this chunk), stored
in the blocks ``block_tables[i]``. Query row ``j`` of request ``i`` sits at absolute
position ``seq_lens_k[i] - q_len + j`` and attends to every key at or before it.

Slots past a context may be read (padded decode batches) but get zero weight, so the cache
must hold finite values everywhere: allocate it zeroed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from slotune.engine.model.kv_cache import KVLayer, QuantizedLayer


@dataclass(frozen=True)
class AttentionMetadata:
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32, device
    cu_seqlens_k: torch.Tensor  # [num_seqs + 1] int32, device
    seq_lens_k: torch.Tensor  # [num_seqs] int32, device
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, device, padded with 0
    slot_mapping: torch.Tensor  # [num_tokens] int64, device: cache slot of each new token
    max_seqlen_q: int
    max_seqlen_k: int
    query_lens: tuple[int, ...]  # host copies, for backends that loop on the host
    context_lens: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)


class AttentionBackend(Protocol):
    name: str

    def forward(
        self,
        q: torch.Tensor,
        k_cache: KVLayer,
        v_cache: KVLayer,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Attention of ``q`` [tokens, q_heads, head_dim] over one layer's cache
        [blocks, block_size, kv_heads, head_dim]; returns [tokens, q_heads, head_dim]."""
        ...


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: KVLayer,
    v_cache: KVLayer,
    slot_mapping: torch.Tensor,
) -> None:
    """Store this step's keys and values [tokens, kv_heads, head_dim] at their slots."""
    if isinstance(k_cache, QuantizedLayer) and isinstance(v_cache, QuantizedLayer):
        k_cache.write(k, slot_mapping)
        v_cache.write(v, slot_mapping)
        return
    k_cache, v_cache = plain_layers(k_cache, v_cache)
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    k_cache.view(num_blocks * block_size, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(num_blocks * block_size, kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def plain_layers(k_cache: KVLayer, v_cache: KVLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's keys and values as tensors, for the code that reads no quantized cache."""
    if isinstance(k_cache, torch.Tensor) and isinstance(v_cache, torch.Tensor):
        return k_cache, v_cache
    raise TypeError("this attention backend reads an unquantized KV cache only")
