"""Targets: the engine releases slotune recommends for (see ``registry``)."""

from slotune.targets.base import ExportRefused, Target, WeightServing
from slotune.targets.flags import FLAGS, Launch, expert_parallel_sizes, launch_words
from slotune.targets.registry import (
    DEFAULT_TARGET,
    TARGETS,
    get_target,
    resolve_stack,
    target_names,
)

__all__ = [
    "DEFAULT_TARGET",
    "FLAGS",
    "TARGETS",
    "ExportRefused",
    "Launch",
    "Target",
    "WeightServing",
    "expert_parallel_sizes",
    "get_target",
    "launch_words",
    "resolve_stack",
    "target_names",
]
