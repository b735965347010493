"""The engine keeps a request's prompt list without copying it (``Engine.new_request``): a
trace's prompts serve every run of a study, so no run may change them."""

from __future__ import annotations

import copy

from slotune.engine.config import EngineConfig
from slotune.workloads import load_trace
from slotune.workloads.arrivals import ArrivalSpec
from slotune.workloads.runner.engine_loop import run_simulated


def test_runs_leave_the_trace_s_prompts_as_they_were() -> None:
    trace = load_trace("agent").head(80)  # sessions: later turns extend earlier prompts
    prompts = trace.own_prompt_token_ids()
    before = copy.deepcopy(prompts)
    small = EngineConfig(prefix_caching="hash", num_gpu_blocks=64, max_num_batched_tokens=512)
    for config in (small, EngineConfig(prefix_caching="radix", preemption_mode="swap")):
        run_simulated(config, trace, arrivals=ArrivalSpec(rate=8), timeout_s=30.0)
    assert trace.own_prompt_token_ids() is prompts and prompts == before
