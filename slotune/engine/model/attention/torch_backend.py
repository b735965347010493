"""Reference attention: gather each request's blocks, run SDPA with a bottom-right causal mask."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slotune.engine.model.attention.base import AttentionMetadata


class TorchAttention:
    name = "torch"

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        block_size = k_cache.shape[1]
        groups = q.shape[1] // k_cache.shape[2]
        start = 0
        for i, (q_len, ctx_len) in enumerate(zip(meta.query_lens, meta.context_lens, strict=True)):
            num_blocks = -(-ctx_len // block_size)
            blocks = meta.block_tables[i, :num_blocks]
            k = _gather(k_cache, blocks, ctx_len, groups)
            v = _gather(v_cache, blocks, ctx_len, groups)
            q_i = q[start : start + q_len].transpose(0, 1)
            mask = _causal_mask(q_len, ctx_len, q.device)
            o = F.scaled_dot_product_attention(q_i, k, v, attn_mask=mask, scale=scale)
            out[start : start + q_len] = o.transpose(0, 1)
            start += q_len
        return out


def _gather(cache: torch.Tensor, blocks: torch.Tensor, ctx_len: int, groups: int) -> torch.Tensor:
    """[heads, ctx_len, head_dim] of one request, kv heads repeated for grouped-query attention."""
    _, _, kv_heads, head_dim = cache.shape
    x = cache[blocks].reshape(-1, kv_heads, head_dim)[:ctx_len].transpose(0, 1)
    return x.repeat_interleave(groups, dim=0) if groups > 1 else x


def _causal_mask(q_len: int, ctx_len: int, device: torch.device) -> torch.Tensor | None:
    if q_len == 1:
        return None
    q_pos = torch.arange(ctx_len - q_len, ctx_len, device=device)
    k_pos = torch.arange(ctx_len, device=device)
    return k_pos[None, :] <= q_pos[:, None]
