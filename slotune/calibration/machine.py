"""The machine's datasheet-like peaks, measured: copy bandwidth and large-matmul FLOP/s."""

from __future__ import annotations

import os
import platform

import torch

from slotune.engine.model.peaks import copy_bandwidth, matmul_flops
from slotune.engine.sim.hardware import GpuSpec

GIB = 1 << 30


def machine_spec(device: torch.device, name: str | None = None) -> GpuSpec:
    """This machine as a ``GpuSpec`` whose peaks are measured here.

    The cost model counts 2-byte elements; on a float32 CPU model the fitted
    efficiencies absorb the difference, so they read as fractions of these peaks.
    """
    bandwidth = copy_bandwidth(device)
    flops = matmul_flops(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
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
