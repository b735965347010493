"""``serve --gpu`` simulates the same serving stack as ``bench``: its step costs and its
per-request latency outside the engine (issue 24: TTFT 18.5 ms served vs 30.5 ms benched)."""

from __future__ import annotations

from slotune.engine import EngineConfig
from slotune.engine.sim.stack import DEFAULT_STACK, load_stack
from slotune.server import simulated_model

CONFIG = EngineConfig(max_model_len=1024, num_gpu_blocks=256)


def test_the_default_stack_and_its_request_latency() -> None:
    engine, served = simulated_model(CONFIG, gpu="h100", model="llama-3-8b")
    stack = load_stack()
    assert engine.executor.stack.name == DEFAULT_STACK  # type: ignore[attr-defined]
    assert served.request_delay_s == stack.request_latency_s > 0


def test_a_named_stack() -> None:
    engine, served = simulated_model(CONFIG, gpu="h100", model="llama-3-8b", stack="eager")
    assert engine.executor.stack.name == "eager"  # type: ignore[attr-defined]
    assert served.request_delay_s == 0.0
    engine, served = simulated_model(CONFIG, gpu="h100", model="llama-3-8b", stack="sglang-0.5")
    assert engine.executor.stack.name == "sglang-0.5"  # type: ignore[attr-defined]
