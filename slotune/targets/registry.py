"""The targets by name: ``vllm`` (the newest vLLM supported), ``vllm==0.15``, ``sglang``,
``slotune``."""

from __future__ import annotations

from slotune.targets.base import Target
from slotune.targets.embedded import SLOTUNE
from slotune.targets.sglang import SGLANG_0_5
from slotune.targets.vllm import VLLM_0_15, VLLM_0_34

TARGETS: dict[str, Target] = {t.name: t for t in (VLLM_0_34, VLLM_0_15, SGLANG_0_5, SLOTUNE)}
ALIASES = {
    "vllm": VLLM_0_34.name,
    "vllm==0.34": VLLM_0_34.name,
    "vllm==0.34.0": VLLM_0_34.name,
    "vllm==0.15": VLLM_0_15.name,
    "vllm==0.15.1": VLLM_0_15.name,
    "sglang": SGLANG_0_5.name,
    "sglang==0.5": SGLANG_0_5.name,
    "sglang==0.5.23": SGLANG_0_5.name,
    "slotune": SLOTUNE.name,
}
DEFAULT_TARGET = "vllm"
LEGACY_TARGET = SLOTUNE.name
"""A study stored before targets existed searched every knob: slotune's own engine."""


def get_target(name: str | None = None) -> Target:
    """A target by name or alias (None: the default, the newest vLLM)."""
    key = (name or DEFAULT_TARGET).strip().lower()
    if key in ALIASES:
        return TARGETS[ALIASES[key]]
    raise ValueError(
        f"unknown target {name!r}; use one of {', '.join(target_names())} "
        "(vllm is the newest vLLM supported)"
    )


def target_names() -> list[str]:
    return ["vllm", "vllm==0.34", "vllm==0.15", "sglang", "slotune"]


def resolve_stack(stack: str | None, target: str | None) -> str | None:
    """The serving stack to simulate: ``stack`` when given, else ``target``'s stack
    profile, else None (the simulator's default)."""
    if stack is not None or target is None:
        return stack
    return get_target(target).stack
