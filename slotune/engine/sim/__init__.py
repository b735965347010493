"""The simulated GPU: hardware and model catalogues, a calibrated cost model, an executor.

Nothing here imports torch: a simulated run starts in a fraction of a second.
"""

from slotune.engine.sim.capacity import determine_capacity
from slotune.engine.sim.cost_model import CostModel, StepBreakdown
from slotune.engine.sim.executor import SimExecutor
from slotune.engine.sim.hardware import GPUS, GpuSpec, UnknownNameError, get_gpu
from slotune.engine.sim.models import MODELS, ModelSpec, get_model
from slotune.engine.sim.profile import GpuProfile, load_profile

__all__ = [
    "GPUS",
    "MODELS",
    "CostModel",
    "GpuProfile",
    "GpuSpec",
    "ModelSpec",
    "SimExecutor",
    "StepBreakdown",
    "UnknownNameError",
    "determine_capacity",
    "get_gpu",
    "get_model",
    "load_profile",
]
