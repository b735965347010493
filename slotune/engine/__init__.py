"""The embedded engine: one scheduler and KV-cache manager, several executors."""

from slotune.engine.config import EngineConfig
from slotune.engine.engine import Engine
from slotune.engine.outputs import RequestOutput, StepStats
from slotune.engine.sampling_params import SamplingParams

__all__ = ["Engine", "EngineConfig", "RequestOutput", "SamplingParams", "StepStats"]
