"""The baseline every recommendation is compared with: vLLM's serving defaults.

vLLM (``EngineArgs``, API-server usage context) sizes its defaults by the card: at least
70 GiB of memory and not an A100 (H100, H200, B200, MI300X) gets a token budget of 8192 and
``max_num_seqs`` 1024; any other card 2048 and 256. Blocks of 16, recompute preemption,
hash prefix caching on, no long-prefill threshold, chunked prefill.
"""

from __future__ import annotations

from typing import Any

from slotune.engine.config import EngineConfig

LARGE_CARD_GIB = 70.0


def vllm_defaults(gpu: Any, *, max_model_len: int, **fixed: Any) -> EngineConfig:
    """vLLM's serving defaults on ``gpu`` (a ``GpuSpec``: ``name``, ``memory_gib``)."""
    large = gpu.memory_gib >= LARGE_CARD_GIB and "a100" not in gpu.name.lower()
    return EngineConfig(
        max_num_batched_tokens=8192 if large else 2048,
        max_num_seqs=1024 if large else 256,
        long_prefill_token_threshold=0,
        block_size=16,
        preemption_mode="recompute",
        prefix_caching="hash",
        policy="chunked",
        max_model_len=max_model_len,
        **fixed,
    )


def gpu_spec(gpu: str) -> Any:
    """The ``GpuSpec`` of a catalogue name or a GPU profile file (ValueError when unknown)."""
    from slotune.engine.sim.profile import load_profile

    return load_profile(gpu).gpu
