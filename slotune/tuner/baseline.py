"""The baseline every recommendation is compared with: the target engine's own defaults
on the GPU (``Target.defaults``; ``slotune.targets`` documents each release's)."""

from __future__ import annotations

from typing import Any


def gpu_spec(gpu: str) -> Any:
    """The ``GpuSpec`` of a catalogue name or a GPU profile file (ValueError when unknown)."""
    from slotune.engine.sim.profile import load_profile

    return load_profile(gpu).gpu
