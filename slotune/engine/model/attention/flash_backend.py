"""flash-attn's varlen kernel reading the paged cache through ``block_table``.

Mainline flash-attn only accepts paged KV with a block size that is a multiple of 256;
``select_backend`` checks that (and CUDA, and the package) before choosing this backend.
"""

from __future__ import annotations

import torch

from slotune.engine.model.attention.base import AttentionMetadata, plain_layers
from slotune.engine.model.kv_cache import KVLayer

FLASH_BLOCK_MULTIPLE = 256


def flash_unavailable_reason(
    device: torch.device, block_size: int, dtype: torch.dtype
) -> str | None:
    """Why flash-attn cannot run here, or None when it can."""
    if device.type != "cuda":
        return f"flash-attn needs a CUDA device (device is {device})"
    if block_size % FLASH_BLOCK_MULTIPLE:
        return (
            f"flash-attn's paged KV needs a block size that is a multiple of "
            f"{FLASH_BLOCK_MULTIPLE} (block_size is {block_size})"
        )
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn needs float16 or bfloat16 (dtype is {dtype})"
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "flash-attn is not installed (pip install 'slotune[gpu]')"
    return None


class FlashAttention:
    name = "flash"

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func

        self._varlen = flash_attn_varlen_func

    def forward(
        self,
        q: torch.Tensor,
        k_cache: KVLayer,
        v_cache: KVLayer,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        k_cache, v_cache = plain_layers(k_cache, v_cache)
        # With seqlen_q < seqlen_k flash-attn aligns the causal mask bottom-right, which is
        # exactly "each query sees its context up to its own position".
        return self._varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=meta.cu_seqlens_q,
            cu_seqlens_k=meta.cu_seqlens_k,
            max_seqlen_q=meta.max_seqlen_q,
            max_seqlen_k=meta.max_seqlen_k,
            softmax_scale=scale,
            causal=True,
            block_table=meta.block_tables,
        )
