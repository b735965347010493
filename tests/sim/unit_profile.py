"""A GPU profile whose kernels run at exactly their datasheet floor: no overheads, every
efficiency 1, GEMMs untiled and without the small-M ramp. Step times on it are the
hand-computed rooflines of the tests."""

from __future__ import annotations

from typing import Any

from slotune.engine.sim.profile import GpuProfile, profile_from_dict

BW = 1e12  # B/s
BF16 = 100e12  # FLOP/s
FP8 = 200e12
LINK = 100.0  # GB/s, both directions


def unit_profile(fp8: bool = True) -> GpuProfile:
    spec: dict[str, Any] = {
        "name": "unit",
        "description": "test GPU",
        "memory_gib": 80,
        "hbm_gbps": BW / 1e9,
        "bf16_tflops": BF16 / 1e12,
        "fp8_tflops": FP8 / 1e12 if fp8 else None,
        "host_link_gbps": 50,
        "interconnect_gbps": LINK,
        "interconnect": "test",
        "source": "test",
    }
    return profile_from_dict(
        {
            "spec": spec,
            "linear": {
                "overhead_us": 0,
                "mem_eff": 1,
                "compute_eff": 1,
                "half_tokens": 0,
                "tile_tokens": 1,
            },
            "elementwise": {
                op: {"overhead_us": 0, "eff": 1} for op in ("norm", "rope", "act", "add", "embed")
            },
            "attention": {
                "prefill_overhead_us": 0,
                "prefill_prefix_eff": 1,
                "prefill_causal_eff": 1,
                "q_tile": 1,
                "decode_overhead_us": 0,
                "decode_per_seq_us": 0,
                "decode_eff": 1,
                "block_indirection_tokens": 0,
            },
            "system": {
                "allreduce_latency_us": 0,
                "allreduce_eff": 1,
                "cpu_step_us": 0,
                "cpu_per_request_us": 0,
            },
        },
        "unit profile",
    )
