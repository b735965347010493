"""GPU profiles: the efficiency constants of the cost model, one small JSON file per GPU.

A profile names a catalogue GPU (``"gpu": "h100"``) or carries its own datasheet figures
(``"spec": {...}`` with the fields of ``GpuSpec``), so ``--gpu`` accepts either a catalogue
name or the path of a profile file. Efficiencies are fractions of the datasheet peak and
must lie in (0, 1]: that is what keeps every op at or above its bandwidth and compute floor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from slotune.engine.sim.hardware import GPUS, GpuSpec, UnknownNameError, get_gpu

PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class LinearProfile:
    """GEMM time: ``overhead + max(bytes / (bw·mem_eff), flops / (peak·eff(M)))``, the
    FLOPs counted on M padded up to ``tile_tokens`` and the efficiency
    ``eff(M) = compute_eff · M_pad / (M_pad + ramp(N))`` rising with the token count.

    The ramp is where a GEMM turns from weight-bandwidth bound to compute bound. With
    ``ramp_width`` it is ``half_tokens`` at that output width and shrinks as ``1/N`` for
    wider GEMMs: the work the last, partly filled wave of output tiles wastes is a fixed
    number of tiles, a smaller share of a wider GEMM's (without, one ramp for every
    width). It scales with the card's FLOPs per byte: fitted on ``fitted_on`` (a catalogue
    GPU), it is rescaled by ``for_gpu`` for a card with another balance of the two."""

    overhead_us: float
    mem_eff: float
    compute_eff: float
    half_tokens: float
    tile_tokens: int
    fitted_on: str = ""
    ramp_width: float = 0.0

    def ramp(self, n: Any) -> Any:
        """The ramp in tokens of a GEMM of output width ``n`` (a number or an array)."""
        return self.half_tokens * self.ramp_width / n if self.ramp_width else self.half_tokens

    def for_gpu(self, gpu: GpuSpec) -> LinearProfile:
        """This profile on ``gpu``: the ramp moved by the ratio of FLOPs per byte."""
        ref = GPUS.get(self.fitted_on)
        if ref is None or ref == gpu:
            return self
        ratio = (gpu.flops_per_s / gpu.hbm_bytes_per_s) / (ref.flops_per_s / ref.hbm_bytes_per_s)
        return replace(self, half_tokens=self.half_tokens * ratio)


@dataclass(frozen=True)
class ElementwiseProfile:
    """A memory-bound kernel: ``overhead + bytes / (bw·eff)``."""

    overhead_us: float
    eff: float


@dataclass(frozen=True)
class AttentionProfile:
    """Prefill: per kernel overhead plus FLOPs against the prior context (``prefix``) and
    within the chunk (``causal``), the query side padded to ``q_tile`` rows.
    Decode: overhead, a per-sequence cost, and the KV bytes read at ``decode_eff``; each
    block read costs as much as ``block_indirection_tokens`` more tokens (page-table
    lookups and partial tiles), so small blocks are slower. An attention that runs one call
    per group of decodes of similar context (slotune's torch reference) pays
    ``decode_per_call_us`` per call: a batch's contexts fall into ``decode_call_ranges``
    equally likely ranges, one call per range they occupy (``decode_calls``); a kernel that
    takes the whole batch in one call leaves ``decode_per_call_us`` at 0. Likewise an
    attention that makes one call per prefill chunk pays ``prefill_per_chunk_us`` for each
    (0 where one kernel takes all of a step's chunks)."""

    prefill_overhead_us: float
    prefill_prefix_eff: float
    prefill_causal_eff: float
    q_tile: int
    decode_overhead_us: float
    decode_per_seq_us: float
    decode_eff: float
    block_indirection_tokens: float
    reference_block_size: int = 16
    decode_per_call_us: float = 0.0
    decode_call_ranges: float = 1.0
    prefill_per_chunk_us: float = 0.0


@dataclass(frozen=True)
class SystemProfile:
    """Links, copies and the host: estimates, not fitted (the reference has no such data)."""

    allreduce_latency_us: float = 10.0
    allreduce_eff: float = 0.7
    host_link_eff: float = 0.8
    copy_call_us: float = 1.0
    cpu_step_us: float = 1000.0
    cpu_per_request_us: float = 10.0
    reserved_gib: float = 1.0


@dataclass(frozen=True)
class GpuProfile:
    gpu: GpuSpec
    linear: LinearProfile
    elementwise: dict[str, ElementwiseProfile]
    attention: AttentionProfile
    system: SystemProfile
    note: str = ""
    source: str = ""
    stack: str = ""  # the serving stack the profile was measured under, if it says so

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu": self.gpu.name, "note": self.note}
        if self.gpu.name not in GPUS or GPUS[self.gpu.name] != self.gpu:
            out["spec"] = _as_dict(self.gpu)
        out["linear"] = _as_dict(self.linear)
        out["elementwise"] = {k: _as_dict(v) for k, v in self.elementwise.items()}
        attention = _as_dict(self.attention)
        if not self.attention.decode_per_call_us:  # one call per step: nothing to say
            del attention["decode_per_call_us"], attention["decode_call_ranges"]
        if not self.attention.prefill_per_chunk_us:
            del attention["prefill_per_chunk_us"]
        out["attention"] = attention
        out["system"] = _as_dict(self.system)
        if self.stack:
            out["stack"] = self.stack
        return out


ELEMENTWISE_OPS = ("norm", "rope", "act", "add", "embed")


def _as_dict(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None


def _check_eff(where: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{where}: efficiency must be in (0, 1], got {value}")


def _check_nonneg(where: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{where}: must be >= 0, got {value}")


def decode_calls(num_decodes: int, ranges: float) -> float:
    """Expected calls of a grouping attention for ``num_decodes`` decodes whose contexts
    fall into ``ranges`` equally likely ranges: the ranges they occupy (1 for one)."""
    return ranges * (1.0 - (1.0 - 1.0 / ranges) ** num_decodes)


def profile_from_dict(data: dict[str, Any], where: str = "profile") -> GpuProfile:
    if "spec" in data:
        gpu = _build(GpuSpec, data["spec"], f"{where}: spec")
    elif "gpu" in data:
        gpu = get_gpu(str(data["gpu"]))
    else:
        raise ValueError(f"{where}: needs 'gpu' (a catalogue name) or 'spec' (datasheet figures)")
    for key in ("linear", "elementwise", "attention"):
        if key not in data:
            raise ValueError(f"{where}: missing section {key!r}")
    linear = _build(LinearProfile, data["linear"], f"{where}: linear")
    missing = [op for op in ELEMENTWISE_OPS if op not in data["elementwise"]]
    if missing:
        raise ValueError(f"{where}: elementwise lacks {missing}")
    elementwise = {
        op: _build(ElementwiseProfile, data["elementwise"][op], f"{where}: elementwise.{op}")
        for op in ELEMENTWISE_OPS
    }
    attention = _build(AttentionProfile, data["attention"], f"{where}: attention")
    system = _build(SystemProfile, data.get("system", {}), f"{where}: system")
    _check_eff(f"{where}: linear.mem_eff", linear.mem_eff)
    _check_eff(f"{where}: linear.compute_eff", linear.compute_eff)
    _check_nonneg(f"{where}: linear.overhead_us", linear.overhead_us)
    _check_nonneg(f"{where}: linear.half_tokens", linear.half_tokens)
    if linear.fitted_on and linear.fitted_on not in GPUS:
        raise ValueError(f"{where}: linear.fitted_on {linear.fitted_on!r} is not a catalogue GPU")
    _check_nonneg(f"{where}: linear.ramp_width", linear.ramp_width)
    if linear.tile_tokens < 1:
        raise ValueError(f"{where}: linear.tile_tokens must be >= 1")
    for op, e in elementwise.items():
        _check_eff(f"{where}: elementwise.{op}.eff", e.eff)
        _check_nonneg(f"{where}: elementwise.{op}.overhead_us", e.overhead_us)
    for name in ("prefill_prefix_eff", "prefill_causal_eff", "decode_eff"):
        _check_eff(f"{where}: attention.{name}", getattr(attention, name))
    for name in (
        "prefill_overhead_us",
        "decode_overhead_us",
        "decode_per_seq_us",
        "block_indirection_tokens",
        "decode_per_call_us",
        "prefill_per_chunk_us",
    ):
        _check_nonneg(f"{where}: attention.{name}", getattr(attention, name))
    if attention.decode_call_ranges < 1:
        raise ValueError(f"{where}: attention.decode_call_ranges must be >= 1")
    _check_eff(f"{where}: system.allreduce_eff", system.allreduce_eff)
    _check_eff(f"{where}: system.host_link_eff", system.host_link_eff)
    return GpuProfile(
        gpu,
        linear,
        elementwise,
        attention,
        system,
        note=str(data.get("note", "")),
        source=where,
        stack=str(data.get("stack", "")),
    )


def load_profile(gpu: str) -> GpuProfile:
    """The shipped profile of a catalogue GPU, or a profile JSON file given by path."""
    path = Path(gpu)
    if gpu.endswith(".json") or path.is_file():
        if not path.is_file():
            raise UnknownNameError(f"GPU profile file {gpu!r} does not exist")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read a GPU profile ({e})") from None
        return profile_from_dict(data, str(path))
    spec = get_gpu(gpu)
    shipped = PROFILE_DIR / f"{spec.name}.json"
    return profile_from_dict(json.loads(shipped.read_text()), str(shipped))
