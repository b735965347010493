"""Our paged-attention kernel in Triton, for mixed prefill and decode batches.

One program handles one request, one KV head and a tile of that request's query tokens.
Its rows are (token, query head of the KV group) pairs, so the K/V blocks of a KV head
are read once for all the query heads that share them (grouped-query attention), which
is what makes decode bandwidth-bound rather than read-amplified. Keys are visited in
tiles of ``KV_TILE`` slots with an online softmax (running max and sum), whatever the block
size: a tile spans several small blocks (each key's block looked up on its own) or part of
a large one, so any power-of-two block size of at least 16 works and contexts may end
mid-block. (One tile per block read 16-slot blocks at 55 % of an H200's bandwidth, and a
whole 256-slot block of K and V in bfloat16 needs more shared memory than the H200 has.)

On a machine without CUDA the kernel runs under Triton's interpreter, which
``TRITON_INTERPRET=1`` switches on; it must be set before this module is imported,
because ``triton.jit`` reads it when the kernel is defined.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from slotune.engine.model.attention.base import AttentionMetadata, plain_layers
from slotune.engine.model.kv_cache import KVLayer


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    cu_seqlens_q_ptr,
    seq_lens_k_ptr,
    block_tables_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if tile * BLOCK_Q < q_len:
        ctx_len = tl.load(seq_lens_k_ptr + seq)
        rows = tl.arange(0, BLOCK_M)
        tok = tile * BLOCK_Q + rows // QUERIES_PER_KV
        head = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
        row_ok = (rows < BLOCK_Q * QUERIES_PER_KV) & (tok < q_len)
        dims = tl.arange(0, HEAD_DIM_PAD)
        dim_ok = dims < HEAD_DIM
        q_off = (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
        q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        q_pos = ctx_len - q_len + tok

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
        kv_end = tl.minimum(ctx_len, ctx_len - q_len + (tile + 1) * BLOCK_Q)
        lanes = tl.arange(0, TILE_N)
        for t in range(0, tl.cdiv(kv_end, TILE_N)):
            k_pos = t * TILE_N + lanes
            k_ok = k_pos < ctx_len
            if BLOCK_SIZE >= TILE_N:  # the tile lies in one block: one table entry
                entry = tl.load(block_tables_ptr + seq * stride_bt + t * TILE_N // BLOCK_SIZE)
                block = entry.to(tl.int64)
                slots = (t * TILE_N) % BLOCK_SIZE + lanes
            else:  # the tile spans several blocks: each key's own entry
                entries = tl.load(block_tables_ptr + seq * stride_bt + k_pos // BLOCK_SIZE, k_ok)
                block = entries.to(tl.int64)[:, None]
                slots = k_pos % BLOCK_SIZE
            kv_mask = k_ok[:, None] & dim_ok[None, :]
            k_off = block * stride_kb + slots[:, None] * stride_ks + kv_head * stride_kh
            k = tl.load(k_cache_ptr + k_off + dims[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            s = tl.where(k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None]), s, float("-inf"))
            # Tile 0 always holds key 0, visible to every row, so m_new is finite.
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v_off = block * stride_vb + slots[:, None] * stride_vs + kv_head * stride_vh
            v = tl.load(v_cache_ptr + v_off + dims[None, :], mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        acc = acc / l_i[:, None]
        o_off = (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(
            out_ptr + o_off,
            acc.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )


KV_TILE = 64  # keys per tile: K and V tiles of 16 KiB each at head dim 128 in bfloat16


def _next_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


class TritonAttention:
    name = "triton"

    def forward(
        self,
        q: torch.Tensor,
        k_cache: KVLayer,
        v_cache: KVLayer,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        k_cache, v_cache = plain_layers(k_cache, v_cache)
        q_heads, head_dim = q.shape[1:]
        _, block_size, kv_heads, _ = k_cache.shape
        if block_size < 16 or block_size & (block_size - 1):
            raise ValueError(
                f"triton attention: block_size must be a power of two >= 16 (got {block_size})"
            )
        per_kv = q_heads // kv_heads
        rows = 16 if meta.max_seqlen_q == 1 else 64
        block_m = max(rows, _next_pow2(per_kv))
        block_q = block_m // per_kv
        out = torch.empty_like(q)
        if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
            raise ValueError("triton attention: head_dim must be the contiguous dimension")
        grid = (meta.num_seqs, kv_heads, triton.cdiv(meta.max_seqlen_q, block_q))
        _paged_attention_kernel[grid](
            q,
            k_cache,
            v_cache,
            out,
            meta.cu_seqlens_q,
            meta.seq_lens_k,
            meta.block_tables,
            scale,
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            v_cache.stride(0),
            v_cache.stride(1),
            v_cache.stride(2),
            meta.block_tables.stride(0),
            QUERIES_PER_KV=per_kv,
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=max(16, _next_pow2(head_dim)),
            BLOCK_SIZE=block_size,
            TILE_N=KV_TILE,
            BLOCK_M=block_m,
            BLOCK_Q=block_q,
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        )
        return out
