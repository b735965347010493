"""Reference attention: gather each request's blocks, run SDPA with a bottom-right causal mask.

Decoding requests (one query token each) go through batched SDPA calls, grouped by context
length and padded to the longest of their group (masked); each prefill chunk gets its own.
A quantized cache (``kv_cache.QuantizedLayer``) is read the same way: gathering its blocks
dequantizes them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slotune.engine.model.attention.base import AttentionMetadata
from slotune.engine.model.kv_cache import KVLayer


class TorchAttention:
    name = "torch"

    def forward(
        self,
        q: torch.Tensor,
        k_cache: KVLayer,
        v_cache: KVLayer,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        starts = [0]
        for q_len in meta.query_lens:
            starts.append(starts[-1] + q_len)
        decodes = [i for i, q_len in enumerate(meta.query_lens) if q_len == 1]
        for group in _by_context(decodes, meta.context_lens):
            rows = [starts[i] for i in group]
            out[rows] = _decode(q[rows], k_cache, v_cache, meta, group, scale)
        for i, (q_len, ctx_len) in enumerate(zip(meta.query_lens, meta.context_lens, strict=True)):
            if q_len > 1:
                s = slice(starts[i], starts[i] + q_len)
                out[s] = _prefill(q[s], k_cache, v_cache, meta.block_tables[i], ctx_len, scale)
        return out


PAD_RATIO = 1.5


def _by_context(seqs: list[int], context_lens: tuple[int, ...]) -> list[list[int]]:
    """Decodes in groups of similar context, padding no group beyond ``PAD_RATIO`` × its
    shortest context, so that padded work stays proportional to the tokens read."""
    groups: list[list[int]] = []
    shortest = 0
    for i in sorted(seqs, key=context_lens.__getitem__):
        if groups and context_lens[i] <= PAD_RATIO * shortest:
            groups[-1].append(i)
        else:
            groups.append([i])
            shortest = context_lens[i]
    return groups


def _decode(
    q: torch.Tensor,
    k_cache: KVLayer,
    v_cache: KVLayer,
    meta: AttentionMetadata,
    seqs: list[int],
    scale: float,
) -> torch.Tensor:
    """q [seqs, heads, dim] of one-token requests, each attending to its whole context."""
    block_size = k_cache.shape[1]
    ctx = [meta.context_lens[i] for i in seqs]
    num_blocks = -(-max(ctx) // block_size)
    tables = meta.block_tables[seqs, :num_blocks]
    k, v = _gather(k_cache, tables), _gather(v_cache, tables)
    ctx_lens = torch.tensor(ctx, device=q.device)
    mask = torch.arange(k.shape[2], device=q.device)[None, :] < ctx_lens[:, None]
    # The query heads sharing a KV head act as that head's query rows: no KV repeat needed.
    num, heads, dim = q.shape
    grouped = q.view(num, k.shape[1], heads // k.shape[1], dim)
    o = F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask[:, None, None, :], scale=scale)
    return o.reshape(num, heads, dim)


def _prefill(
    q: torch.Tensor,
    k_cache: KVLayer,
    v_cache: KVLayer,
    table: torch.Tensor,
    ctx_len: int,
    scale: float,
) -> torch.Tensor:
    """q [chunk, heads, dim] at the last ``chunk`` positions of a ``ctx_len`` context."""
    q_len = q.shape[0]
    blocks = table[None, : -(-ctx_len // k_cache.shape[1])]
    k = _gather(k_cache, blocks)[0, :, :ctx_len]
    v = _gather(v_cache, blocks)[0, :, :ctx_len]
    q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
    mask = torch.arange(ctx_len, device=q.device)[None, :] <= q_pos[:, None]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return o.transpose(0, 1)


def _gather(cache: KVLayer, tables: torch.Tensor) -> torch.Tensor:
    """[seqs, kv_heads, blocks·block_size, head_dim] from block tables [seqs, blocks]."""
    seqs, blocks = tables.shape
    _, block_size, kv_heads, head_dim = cache.shape
    x = cache.index_select(0, tables.reshape(-1))
    return x.view(seqs, blocks * block_size, kv_heads, head_dim).transpose(1, 2)
