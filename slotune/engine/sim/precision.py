"""Weight precisions: bytes per weight, which tensor-core rate a GEMM runs at, and the
dequantize cost of weight-only formats.

- ``bf16`` / ``fp16``: two bytes, the bf16 tensor-core peak.
- ``fp8`` (W8A8): one byte, the FP8 tensor-core peak, on GPUs that have FP8 tensor cores
  (H100 and newer, L4/L40S, MI300X). Elsewhere (A100, A10G) it runs as vLLM does there, as
  weight-only FP8 (Marlin): one byte read, dequantized to bf16, bf16 compute.
- ``int8`` (W8A8): one byte, the INT8 tensor-core rate.
- ``int4`` (W4A16, AWQ/GPTQ): half a byte plus one fp16 scale and a 4-bit zero per group
  of 128, dequantized to bf16 in the kernel, bf16 compute: a saving where the weight read
  dominates (small batches), none where compute does (large ones).
- ``mxfp4`` (gpt-oss): 4-bit codes with one 8-bit scale per 32, weight-only like ``int4``.

W8A8 formats quantize each activation row on the fly: a pass that reads the bf16
activations and writes one-byte codes. Embeddings, the LM head and MoE routers stay in the
model's 16-bit dtype, as in vLLM's FP8, AWQ and GPTQ paths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slotune.engine.sim.hardware import GpuSpec
from slotune.engine.sim.profile import LinearProfile

DEQUANT_OVERHEAD = 0.10
"""Weight-only kernels' compute time over bf16's at the same shape: the in-register
dequantization that Marlin-class kernels overlap with the MMA but do not fully hide.
An estimate (Marlin, Frantar et al. 2024, reports near-bf16 throughput at large batch),
not fitted: refit when W4A16 measurements exist."""

WEIGHT_ONLY_TILE = 16
"""Rows of a weight-only kernel's M tile (Marlin's 16). Such kernels are built for small
batches: priced at the profile's full compute efficiency on rows padded to this tile,
without the small-M ramp fitted on cuBLAS bf16 GEMMs, which would hide their gain."""


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bits_per_weight: float  # codes plus scales and zero points, averaged per weight
    compute: str  # "bf16" | "fp8" | "int8": the tensor-core rate a W8A8 GEMM runs at
    weight_only: bool  # dequantized to bf16 in the kernel (A16)

    @property
    def bytes_per_weight(self) -> float:
        return self.bits_per_weight / 8


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("bf16", 16, "bf16", weight_only=False),
        WeightFormat("fp16", 16, "bf16", weight_only=False),
        WeightFormat("fp8", 8, "fp8", weight_only=False),
        WeightFormat("int8", 8, "int8", weight_only=False),
        WeightFormat("int4", 4 + (16 + 4) / 128, "bf16", weight_only=True),
        WeightFormat("mxfp4", 4 + 8 / 32, "bf16", weight_only=True),
    )
}

_QUANT_METHODS = {
    "fp8": "fp8",
    "fbgemm_fp8": "fp8",
    "w8a8_int8": "int8",
    "int8": "int8",
    "awq": "int4",
    "awq_marlin": "int4",
    "gptq": "int4",
    "gptq_marlin": "int4",
    "w4a16": "int4",
    "int4": "int4",
    "bitsandbytes": "int4",
    "mxfp4": "mxfp4",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "auto": "bf16",
    "none": "bf16",
}


def weight_format_name(quantization: str | None, where: str = "quantization") -> str:
    """slotune's weight format for a ``--quantization`` value or a checkpoint's
    ``quant_method`` (None: full precision)."""
    if quantization is None:
        return "bf16"
    key = _QUANT_METHODS.get(quantization.lower())
    if key is None:
        hint = (
            "; compressed-tensors checkpoints can hold fp8, int8 or int4 weights: "
            "name the format with --quantization"
            if quantization.lower() == "compressed-tensors"
            else ""
        )
        raise ValueError(
            f"{where}: unknown weight quantization {quantization!r}; known: "
            f"{', '.join(sorted(_QUANT_METHODS))}{hint}"
        )
    return key


def gemm_rate(fmt: WeightFormat, gpu: GpuSpec) -> tuple[float, bool]:
    """The tensor-core FLOP/s a GEMM of ``fmt`` runs at on ``gpu``, and whether it is
    weight-only there (dequantized to bf16: FP8 on a GPU without FP8 tensor cores)."""
    if fmt.compute == "fp8":
        if gpu.fp8_tflops is None:
            return gpu.flops_per_s, True
        return gpu.fp8_tflops * 1e12, False
    if fmt.compute == "int8":
        return gpu.int8_ops_per_s, False
    return gpu.flops_per_s, fmt.weight_only


def gemm_bytes(
    m: float, k: int, n: int, bytes_per_weight: float = 2.0, groups: float = 1.0
) -> float:
    """HBM bytes of ``groups`` GEMMs of ``[m / groups, k] @ [k, n]``: each group's weights
    read once, the bf16 activations read and written (numbers or numpy arrays)."""
    return groups * k * n * bytes_per_weight + 2 * (m * k + m * n)


def gemm_flops(m: float, k: int, n: int) -> float:
    """Useful FLOPs of ``[m, k] @ [k, n]`` (no tile padding)."""
    return 2.0 * m * k * n


def format_gemm_seconds(
    p: LinearProfile,
    bw: float,
    rate: float,
    bytes_per_weight: float,
    weight_only: bool,
    m: float,
    k: int,
    n: int,
    groups: float = 1.0,
    tile: int = 0,
) -> float:
    """``groups`` GEMMs of ``[m / groups, k] @ [k, n]`` in one kernel (a MoE grouped GEMM;
    one group: a plain linear layer) with weights of ``bytes_per_weight``: each group's
    weights read once, bf16 activations in and out, FLOPs at ``rate`` on each group's rows
    padded to ``tile`` (0: the profile's), the profile's small-M ramp applied once.
    Weight-only formats use ``WEIGHT_ONLY_TILE`` without the ramp and pay
    ``DEQUANT_OVERHEAD`` on the compute side; W8A8 formats a pass that quantizes the input
    rows (bf16 read, one byte written).

    With 16-bit weights, the bf16 rate and one group this is ``cost_model.gemm_seconds``.
    """
    if m <= 0:
        return 0.0
    half = p.ramp(n)
    if weight_only:
        tile, half = WEIGHT_ONLY_TILE, 0.0
    tile = tile or p.tile_tokens
    m_pad = math.ceil(m / groups / tile) * tile * groups
    t_mem = gemm_bytes(m, k, n, bytes_per_weight, groups) / (bw * p.mem_eff)
    t_cmp = 2.0 * (m_pad + half) * k * n / (rate * p.compute_eff)
    if weight_only:
        t_cmp *= 1.0 + DEQUANT_OVERHEAD
    quantize_input = 0.0 if weight_only or bytes_per_weight >= 2 else 3 * m * k / (bw * p.mem_eff)
    return p.overhead_us * 1e-6 + max(t_mem, t_cmp) + quantize_input
