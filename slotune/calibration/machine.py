"""The machine's datasheet-like peaks, measured: copy bandwidth and large-matmul FLOP/s."""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable

import torch

from slotune.engine.sim.hardware import GpuSpec

GIB = 1 << 30


def machine_spec(device: torch.device, name: str | None = None) -> GpuSpec:
    """This machine as a ``GpuSpec`` whose peaks are measured here.

    The cost model counts 2-byte elements; on a float32 CPU model the fitted
    efficiencies absorb the difference, so they read as fractions of these peaks.
    """
    bandwidth = _copy_bandwidth(device)
    flops = _matmul_flops(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        memory_gib = props.total_memory / GIB
        desc = f"{props.name} (calibrated)"
    else:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
        desc = f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return GpuSpec(
        name=name or f"calibrated-{device.type}",
        description=desc,
        memory_gib=round(memory_gib, 2),
        hbm_gbps=round(bandwidth / 1e9, 3),
        bf16_tflops=round(flops / 1e12, 5),
        fp8_tflops=None,
        host_link_gbps=round(bandwidth / 1e9, 3),
        interconnect_gbps=round(bandwidth / 1e9, 3),
        interconnect="none",
        source=f"measured by slotune calibrate on {platform.node() or 'this machine'}",
    )


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


def _copy_bandwidth(device: torch.device) -> float:
    n = (1 << 28 if device.type == "cuda" else 1 << 25) // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / _best_time(lambda: dst.copy_(src), device)


def _matmul_flops(device: torch.device) -> float:
    n = 4096 if device.type == "cuda" else 1024
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _best_time(lambda: torch.mm(a, b), device)
