"""The GPU catalogue: datasheet figures of the cards the simulator can stand in for.

Units: memory in GiB (the cards' "80 GB" of HBM are 80 GiB), bandwidths in GB/s (1e9 B/s),
peaks in dense TFLOP/s (no structured sparsity). ``host_link_gbps`` is one direction of the
host link (PCIe); ``interconnect_gbps`` is the GPU-to-GPU figure as the vendor quotes it
(NVLink / Infinity Fabric: both directions together; for cards without one, PCIe both ways).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_GIB = 1 << 30


class UnknownNameError(ValueError):
    """A GPU or model name that is not in the catalogue (nor a file path)."""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    description: str
    memory_gib: float
    hbm_gbps: float
    bf16_tflops: float
    fp8_tflops: float | None
    host_link_gbps: float
    interconnect_gbps: float
    interconnect: str
    source: str
    int8_tops: float | None = None  # dense INT8 tensor TOP/s; None: twice bf16, as on most

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * _GIB)

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9

    @property
    def flops_per_s(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def kv_cache_dtypes(self) -> tuple[str, ...]:
        """The KV-cache formats a production engine serves here: fp8 where the GPU has FP8
        tensor cores (vLLM's and SGLang's fp8 KV; int8 and int4 only slotune's engine has)."""
        return ("auto", "fp8") if self.fp8_tflops is not None else ("auto",)

    @property
    def int8_ops_per_s(self) -> float:
        return (self.int8_tops if self.int8_tops is not None else 2 * self.bf16_tflops) * 1e12


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5 column), 2023.
        GpuSpec(
            "h100",
            "NVIDIA H100 SXM5 80GB",
            80,
            3350,
            989.4,
            1978.9,
            64,
            900,
            "NVLink 4",
            "NVIDIA H100 datasheet, SXM column",
        ),
        # Same datasheet, PCIe column (NVLink bridge 600 GB/s).
        GpuSpec(
            "h100-pcie",
            "NVIDIA H100 PCIe 80GB",
            80,
            2000,
            756.0,
            1513.0,
            64,
            600,
            "NVLink bridge",
            "NVIDIA H100 datasheet, PCIe column",
        ),
        # NVIDIA H200 Tensor Core GPU datasheet (SXM column), 2024.
        GpuSpec(
            "h200",
            "NVIDIA H200 SXM 141GB",
            141,
            4800,
            989.4,
            1978.9,
            64,
            900,
            "NVLink 4",
            "NVIDIA H200 datasheet, SXM column",
        ),
        # NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column); no FP8 tensor cores.
        GpuSpec(
            "a100-80g",
            "NVIDIA A100 SXM4 80GB",
            80,
            2039,
            312.0,
            None,
            32,
            600,
            "NVLink 3",
            "NVIDIA A100 datasheet, 80GB SXM column",
        ),
        # Same datasheet, 40GB SXM column.
        GpuSpec(
            "a100-40g",
            "NVIDIA A100 SXM4 40GB",
            40,
            1555,
            312.0,
            None,
            32,
            600,
            "NVLink 3",
            "NVIDIA A100 datasheet, 40GB SXM column",
        ),
        # NVIDIA L40S datasheet; no NVLink, GPUs talk over PCIe Gen4 x16 (64 GB/s both ways).
        GpuSpec(
            "l40s",
            "NVIDIA L40S 48GB",
            48,
            864,
            362.05,
            733.0,
            32,
            64,
            "PCIe 4.0",
            "NVIDIA L40S datasheet",
        ),
        # AWS G5 / NVIDIA A10G figures (A10G: 24 GB GDDR6, 600 GB/s, 70 dense BF16 TFLOP/s
        # against the A10's 125), as compared by Baseten's "A10 vs A10G" note.
        GpuSpec(
            "a10g",
            "NVIDIA A10G 24GB (AWS)",
            24,
            600,
            70.0,
            None,
            32,
            64,
            "PCIe 4.0",
            "AWS G5 instance spec; Baseten A10 vs A10G comparison",
        ),
        # NVIDIA L4 Tensor Core GPU datasheet.
        GpuSpec(
            "l4", "NVIDIA L4 24GB", 24, 300, 121.0, 242.5, 32, 64, "PCIe 4.0", "NVIDIA L4 datasheet"
        ),
        # NVIDIA HGX B200 datasheet, per GPU (180 GB HBM3e, 7.7 TB/s, NVLink 5 1.8 TB/s).
        GpuSpec(
            "b200",
            "NVIDIA B200 180GB (HGX)",
            180,
            7700,
            2250.0,
            4500.0,
            64,
            1800,
            "NVLink 5",
            "NVIDIA HGX B200 datasheet, per-GPU figures",
        ),
        # AMD Instinct MI300X datasheet; Infinity Fabric: 7 peer links × 128 GB/s = 896 GB/s
        # to the other GPUs of an 8-GPU platform.
        GpuSpec(
            "mi300x",
            "AMD Instinct MI300X 192GB",
            192,
            5300,
            1307.4,
            2614.9,
            64,
            896,
            "Infinity Fabric",
            "AMD Instinct MI300X datasheet",
        ),
        # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 column: 24 GB GDDR6X
        # at 1008 GB/s; GeForce halves the tensor rates that accumulate in FP32, so bf16 is
        # 165.2 and FP8 (FP32 accumulate, as GEMMs use) 330.3 dense TFLOP/s, while INT8 keeps
        # 660.6 TOP/s. No NVLink: PCIe 4.0 x16 between cards.
        GpuSpec(
            "rtx4090",
            "NVIDIA GeForce RTX 4090 24GB",
            24,
            1008,
            165.2,
            330.3,
            32,
            64,
            "PCIe 4.0",
            "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090",
            int8_tops=660.6,
        ),
    )
}


def get_gpu(name: str) -> GpuSpec:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise UnknownNameError(
            f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)} "
            "(or give the path of a GPU profile JSON)"
        ) from None


_DEVICE_NAMES = (
    # (pattern of a torch.cuda.get_device_name, catalogue GPU); the first match wins. Cards
    # whose figures the catalogue does not hold (H100/H200 NVL, A100 PCIe) match none.
    (r"\bh100\b.*\b(nvl)\b", None),
    (r"\bh100\b.*\bpcie\b", "h100-pcie"),
    (r"\bh100\b", "h100"),
    (r"\bh200\b.*\bnvl\b", None),
    (r"\bh200\b", "h200"),
    (r"\ba100\b.*\bpcie\b", None),
    (r"\ba100\b.*\b80\s*gb\b", "a100-80g"),
    (r"\ba100\b.*\b40\s*gb\b", "a100-40g"),
    (r"\bl40s\b", "l40s"),
    (r"\ba10g\b", "a10g"),
    (r"\bl4\b", "l4"),
    (r"\bb200\b", "b200"),
    (r"\bmi300x\b", "mi300x"),
    (r"\brtx\s*4090\b", "rtx4090"),
)


def gpu_for_device(device_name: str) -> GpuSpec | None:
    """The catalogue GPU that a CUDA device name (``torch.cuda.get_device_name``, such as
    ``NVIDIA H100 80GB HBM3`` or ``NVIDIA A100-SXM4-40GB``) is, or None when the catalogue
    has no datasheet of that card."""
    name = re.sub(r"[-_]", " ", device_name.lower())
    for pattern, gpu in _DEVICE_NAMES:
        if re.search(pattern, name):
            return GPUS[gpu] if gpu else None
    return None
