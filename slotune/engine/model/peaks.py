"""The ceilings a real engine's steps are read against: bandwidth and compute peaks.

On a CUDA device the catalogue names (``sim.hardware.gpu_for_device``) give the datasheet's
HBM bandwidth and 16-bit tensor-core rate. Where there is no datasheet (a CPU, a card the
catalogue lacks, a float32 model on a GPU) they are measured once per process: a large
tensor copy for the bandwidth, a large matmul in the run's dtype for the FLOP/s, each the
best of a few repeats, with the threads the run used.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from slotune.engine.sim.hardware import gpu_for_device

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


def device_ceilings(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """``hbm_bytes_per_s``, ``flops_per_s`` and ``source`` (where they come from, as the
    report completes "the ceilings ...") for a model in ``dtype`` on ``device``."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        gpu = gpu_for_device(name)
        if gpu is not None and dtype in _SIXTEEN_BIT:
            return {
                "hbm_bytes_per_s": gpu.hbm_bytes_per_s,
                "flops_per_s": gpu.flops_per_s,
                "source": f"from the datasheet of the {gpu.description} ({gpu.source})",
            }
        where = f"this GPU ({name})"
    else:
        threads = torch.get_num_threads()
        where = f"this CPU ({threads} thread{'s' if threads != 1 else ''})"
    return measured_ceilings(str(device), dtype, torch.get_num_threads()) | {
        "source": f"measured on {where} by a tensor copy and a {_dtype_name(dtype)} matmul"
    }


@cache
def measured_ceilings(device: str, dtype: torch.dtype, threads: int) -> dict[str, float]:
    """Copy bandwidth and matmul FLOP/s of ``device`` in ``dtype`` with ``threads`` intra-op
    threads, measured once per process for each."""
    dev = torch.device(device)
    return {
        "hbm_bytes_per_s": copy_bandwidth(dev),
        "flops_per_s": matmul_flops(dev, dtype),
    }


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read and written per second by a copy far larger than the caches."""
    n = (1 << 28 if device.type == "cuda" else 1 << 25) // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / _best_time(lambda: dst.copy_(src), device)


def matmul_flops(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a square matmul in ``dtype``, large enough to be compute-bound."""
    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / _best_time(lambda: torch.mm(a, b), device)


def _best_time(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
