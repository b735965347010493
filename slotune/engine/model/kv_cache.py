"""The paged KV cache's tensors: plain (the model's dtype) or quantized (``kv_dtype``).

A plain cache is one tensor [layers, blocks, block_size, kv_heads, head_dim] each for keys
and values. A quantized one is a ``QuantizedCache`` of codes plus scales (and zero points),
every tensor with the block index on axis 1, so that swapping and copying blocks moves the
same indices of every tensor (``cache_tensors``). Indexing it by layer gives a
``QuantizedLayer``, which the torch backend reads like a plain layer tensor: ``shape`` and
``index_select(0, blocks)`` return the blocks dequantized to the model's dtype.
"""

from __future__ import annotations

import torch

from slotune.engine.kv_dtype import KV_SCHEMES, TensorQuant

FP8_MAX = 448.0  # largest finite float8 e4m3fn
_QMAX = {"fp8": FP8_MAX, "int8": 127.0, "int4": 15.0}
_SCALE_DTYPES = {4: torch.float32, 2: torch.float16}


def _scale_shape(quant: TensorQuant, block_size: int, heads: int, dim: int) -> tuple[int, ...]:
    """A scale's shape within a block [block_size, heads, dim], its reduced axes kept as 1."""
    return {
        "block": (1, heads, 1),
        "channel": (1, heads, dim),
        "token": (block_size, heads, 1),
    }[quant.scale_over]


def _reduced_axes(quant: TensorQuant) -> tuple[int, ...]:
    """Axes of a batch of blocks [n, block_size, heads, dim] that one scale spans."""
    return {"block": (1, 3), "channel": (1,), "token": (3,)}[quant.scale_over]


def encode(
    x: torch.Tensor, valid: torch.Tensor, quant: TensorQuant
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Blocks ``x`` [n, block_size, heads, dim] (float32) to codes, scales, zero points.

    ``valid`` [n, block_size] marks the written slots: only they set a scale.
    """
    axes = _reduced_axes(quant)
    scale_dtype = _SCALE_DTYPES[quant.scale_bytes]
    qmax = _QMAX[quant.fmt]
    mask = valid[:, :, None, None]
    zero = None
    if quant.asymmetric:
        low = torch.where(mask, x, torch.inf).amin(axes, keepdim=True)
        high = torch.where(mask, x, -torch.inf).amax(axes, keepdim=True)
        low, high = low.nan_to_num(0, 0, 0), high.nan_to_num(0, 0, 0)
        zero = low.to(scale_dtype)
        span = high - zero.float()
    else:
        span = torch.where(mask, x.abs(), 0).amax(axes, keepdim=True)
    scale = torch.where(span > 0, span / qmax, 1.0).to(scale_dtype)
    q = (x - (0 if zero is None else zero.float())) / scale.float()
    if quant.fmt == "fp8":
        codes = q.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    elif quant.fmt == "int8":
        codes = q.round().clamp(-qmax, qmax).to(torch.int8)
    else:
        nibbles = q.round().clamp(0, qmax).to(torch.uint8)
        codes = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    return codes, scale, zero


def decode(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, quant: TensorQuant
) -> torch.Tensor:
    """Codes back to float32 values, the inverse of ``encode`` up to its rounding."""
    if quant.fmt == "fp8":
        q = codes.view(torch.float8_e4m3fn).float()
    elif quant.fmt == "int8":
        q = codes.float()
    else:
        q = torch.stack([codes & 15, codes >> 4], dim=-1).flatten(-2).float()
    x = q * scale.float()
    return x if zero is None else x + zero.float()


class QuantizedLayer:
    """One layer's keys or values: codes [blocks, block_size, heads, dim or dim/2] + scales."""

    def __init__(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor | None,
        quant: TensorQuant,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        self.codes, self.scale, self.zero = codes, scale, zero
        self.quant = quant
        self.dtype = dtype
        self.shape = torch.Size((*codes.shape[:3], head_dim))

    def _blocks(self, blocks: torch.Tensor) -> torch.Tensor:
        zero = None if self.zero is None else self.zero[blocks]
        return decode(self.codes[blocks], self.scale[blocks], zero, self.quant)

    def index_select(self, dim: int, blocks: torch.Tensor) -> torch.Tensor:
        """Blocks [n, block_size, heads, head_dim] dequantized, as ``Tensor.index_select``."""
        if dim != 0:
            raise ValueError(f"QuantizedLayer.index_select: blocks are axis 0 (got dim={dim})")
        return self._blocks(blocks).to(self.dtype)

    def write(self, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store tokens ``x`` [tokens, heads, dim] at their slots, re-encoding each touched
        block over all its written slots: those before this write's first slot in the block
        (its tokens are written in order) and this write's; later slots are stale."""
        block_size = self.shape[1]
        blocks = slot_mapping // block_size
        offsets = slot_mapping % block_size
        touched, which = torch.unique(blocks, return_inverse=True)
        last = torch.zeros_like(touched).scatter_reduce(0, which, offsets, "amax")
        values = self._blocks(touched)
        values[which, offsets] = x.float()
        valid = torch.arange(block_size, device=x.device)[None, :] <= last[:, None]
        values *= valid[:, :, None, None]
        codes, scale, zero = encode(values, valid, self.quant)
        self.codes[touched] = codes
        self.scale[touched] = scale
        if self.zero is not None and zero is not None:
            self.zero[touched] = zero


KVLayer = torch.Tensor | QuantizedLayer


class QuantizedCache:
    """Keys or values of every layer: codes [layers, blocks, block_size, heads, dim'],
    scales and zero points [layers, blocks, *scale shape]."""

    def __init__(
        self,
        quant: TensorQuant,
        shape: tuple[int, int, int, int, int],
        dtype: torch.dtype,
        device: torch.device | str,
        pin_memory: bool = False,
        zeroed: bool = True,
    ) -> None:
        layers, blocks, block_size, heads, dim = shape
        if quant.fmt == "int4" and dim % 2:
            raise ValueError(
                f"kv_cache_dtype int4 packs two channels a byte: head_dim {dim} is odd"
            )
        self.quant, self.head_dim, self.dtype = quant, dim, dtype
        code_dtype = torch.int8 if quant.fmt == "int8" else torch.uint8
        code_dim = dim // 2 if quant.fmt == "int4" else dim
        new = torch.zeros if zeroed else torch.empty

        def alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return new(shape, dtype=dtype, device=device, pin_memory=pin_memory)

        self.codes = alloc((layers, blocks, block_size, heads, code_dim), code_dtype)
        scale_shape = (layers, blocks, *_scale_shape(quant, block_size, heads, dim))
        scale_dtype = _SCALE_DTYPES[quant.scale_bytes]
        self.scale = alloc(scale_shape, scale_dtype)
        self.zero = alloc(scale_shape, scale_dtype) if quant.asymmetric else None

    def __getitem__(self, layer: int) -> QuantizedLayer:
        zero = None if self.zero is None else self.zero[layer]
        return QuantizedLayer(
            self.codes[layer], self.scale[layer], zero, self.quant, self.head_dim, self.dtype
        )

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.codes, self.scale, self.zero) if t is not None]


KVCache = torch.Tensor | QuantizedCache


def allocate_kv_cache(
    kv_cache_dtype: str,
    shape: tuple[int, int, int, int, int],
    dtype: torch.dtype,
    device: torch.device | str,
    pin_memory: bool = False,
    zeroed: bool = True,
) -> tuple[KVCache, KVCache]:
    """Keys and values caches of ``shape`` [layers, blocks, block_size, heads, dim]; a zeroed
    quantized cache decodes to zeros (zero codes, zero points)."""
    if kv_cache_dtype == "auto":
        new = torch.zeros if zeroed else torch.empty
        keys = new(shape, dtype=dtype, device=device, pin_memory=pin_memory)
        values = new(shape, dtype=dtype, device=device, pin_memory=pin_memory)
        return keys, values
    key, value = KV_SCHEMES[kv_cache_dtype]
    return (
        QuantizedCache(key, shape, dtype, device, pin_memory, zeroed),
        QuantizedCache(value, shape, dtype, device, pin_memory, zeroed),
    )


def cache_tensors(cache: KVCache) -> list[torch.Tensor]:
    """Every tensor of a cache, each with blocks on axis 1."""
    return [cache] if isinstance(cache, torch.Tensor) else cache.tensors()
