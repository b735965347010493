"""Attention backends behind one interface, chosen by name: auto | torch | triton | flash."""

from __future__ import annotations

import logging
import os

import torch

from slotune.engine.model.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    write_kv_cache,
)

__all__ = [
    "BACKEND_NAMES",
    "AttentionBackend",
    "AttentionMetadata",
    "select_backend",
    "write_kv_cache",
]

BACKEND_NAMES = ("auto", "torch", "triton", "flash")
logger = logging.getLogger(__name__)


def _triton_unavailable_reason(device: torch.device, block_size: int) -> str | None:
    if block_size < 16:
        return f"the triton kernel needs a block size of at least 16 (block_size is {block_size})"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"triton needs CUDA, or TRITON_INTERPRET=1 set before start (device is {device})"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


def select_backend(
    name: str,
    device: torch.device,
    block_size: int,
    dtype: torch.dtype,
    kv_cache_dtype: str = "auto",
) -> AttentionBackend:
    """The backend ``name`` asks for, or the best one that can run, with a logged reason.

    ``auto`` prefers flash, then triton, then torch; an explicit name that cannot run
    here falls back the same way, never failing a run for a missing accelerator. Only the
    torch backend reads a quantized KV cache: asking another for one is an error.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"attention: unknown backend {name!r}; choose one of {BACKEND_NAMES}")
    if kv_cache_dtype != "auto":
        if name in ("triton", "flash"):
            raise ValueError(
                f"attention backend {name!r} cannot read a quantized KV cache "
                f"(kv_cache_dtype={kv_cache_dtype!r}); only the torch backend dequantizes it: "
                "use attention 'torch' (or 'auto'), or kv_cache_dtype 'auto'"
            )
        from slotune.engine.model.attention.torch_backend import TorchAttention

        if name == "auto":
            _log_fallback(name, "flash or triton", f"kv_cache_dtype is {kv_cache_dtype!r}")
        return TorchAttention()
    from slotune.engine.model.attention.flash_backend import flash_unavailable_reason

    if name in ("auto", "flash"):
        reason = flash_unavailable_reason(device, block_size, dtype)
        if reason is None:
            from slotune.engine.model.attention.flash_backend import FlashAttention

            return FlashAttention()
        _log_fallback(name, "flash", reason)
    if name in ("auto", "flash", "triton"):
        reason = _triton_unavailable_reason(device, block_size)
        if reason is None and not (name == "auto" and device.type != "cuda"):
            from slotune.engine.model.attention.triton_backend import TritonAttention

            return TritonAttention()
        if reason is not None:
            _log_fallback(name, "triton", reason)
    from slotune.engine.model.attention.torch_backend import TorchAttention

    return TorchAttention()


def _log_fallback(asked: str, backend: str, reason: str) -> None:
    level = logging.INFO if asked == "auto" else logging.WARNING
    logger.log(level, "attention %r: not using %s: %s", asked, backend, reason)
