"""KV-cache precisions: how each ``kv_cache_dtype`` stores keys and values, and its bytes.

Torch-free, so that the real engine (which allocates these tensors) and the simulator
(which prices their capacity and bandwidth) size a block by the same rule.

- ``auto``: the model's dtype.
- ``fp8``: e4m3 codes, one float32 scale per (block, KV head), symmetric (amax / 448).
- ``int8``: int8 codes, one float32 scale per (block, KV head), symmetric (amax / 127).
- ``int4``: KIVI's layout, asymmetric 4-bit codes (min and step, both float16) packed two
  to a byte: keys with one scale per (block, KV head, channel), since outlier channels
  dominate keys; values with one scale per (token, KV head).

A block's scales cover the tokens written to it so far; a write that widens their range
re-encodes the block's earlier tokens with the wider scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KV_CACHE_DTYPES = ("auto", "fp8", "int8", "int4")
ScaleOver = Literal["block", "channel", "token"]


@dataclass(frozen=True)
class TensorQuant:
    """How one of K or V is quantized: code format, what one scale covers, zero point."""

    fmt: Literal["fp8", "int8", "int4"]
    scale_over: ScaleOver
    asymmetric: bool
    scale_bytes: int

    @property
    def bits(self) -> int:
        return 4 if self.fmt == "int4" else 8

    def num_scales(self, block_size: int, kv_heads: int, head_dim: int) -> int:
        """Scales per block of one layer."""
        return {
            "block": kv_heads,
            "channel": kv_heads * head_dim,
            "token": block_size * kv_heads,
        }[self.scale_over]

    def block_bytes(self, block_size: int, kv_heads: int, head_dim: int) -> int:
        """Codes and scales (and zero points) of one block of one layer."""
        codes = block_size * kv_heads * head_dim * self.bits // 8
        per_scale = self.scale_bytes * (2 if self.asymmetric else 1)
        return codes + self.num_scales(block_size, kv_heads, head_dim) * per_scale


_PER_BLOCK_FP8 = TensorQuant("fp8", "block", asymmetric=False, scale_bytes=4)
_PER_BLOCK_INT8 = TensorQuant("int8", "block", asymmetric=False, scale_bytes=4)
KV_SCHEMES: dict[str, tuple[TensorQuant, TensorQuant]] = {
    "fp8": (_PER_BLOCK_FP8, _PER_BLOCK_FP8),
    "int8": (_PER_BLOCK_INT8, _PER_BLOCK_INT8),
    "int4": (
        TensorQuant("int4", "channel", asymmetric=True, scale_bytes=2),
        TensorQuant("int4", "token", asymmetric=True, scale_bytes=2),
    ),
}
"""kv_cache_dtype -> (key scheme, value scheme); ``auto`` stores the model's dtype."""


def kv_block_bytes(
    kv_cache_dtype: str, block_size: int, kv_heads: int, head_dim: int, dtype_bytes: int
) -> int:
    """Bytes of one block's keys and values in one layer (``dtype_bytes``: the model's)."""
    if kv_cache_dtype == "auto":
        return 2 * block_size * kv_heads * head_dim * dtype_bytes
    if kv_cache_dtype not in KV_SCHEMES:
        raise ValueError(
            f"kv_cache_dtype {kv_cache_dtype!r} is unknown; choose one of {KV_CACHE_DTYPES}"
        )
    key, value = KV_SCHEMES[kv_cache_dtype]
    return key.block_bytes(block_size, kv_heads, head_dim) + value.block_bytes(
        block_size, kv_heads, head_dim
    )
