"""Workloads: traces in many formats, generators, arrival processes, the runner, metrics.

trace = load_trace("sharegpt-like", num_requests=200)
result = run_simulated(EngineConfig(), trace, gpu="h100", arrivals=ArrivalSpec(rate=8))
summary = summarize(result, parse_slo("ttft=300ms,tpot=50ms"))

Steady state: load stages fix how long a run sends (the trace cut or repeated to fit),
the scores leave out a warm-up and a cool-down, and the summary says whether it settled:

arrivals = ArrivalSpec(stages=parse_stages("5:60,10:60"))
trace = load_trace("sharegpt-like").repeat_to(arrivals.num_sessions)
result = run_simulated(EngineConfig(), trace, arrivals=arrivals, timeout_s=30)
summary = summarize(result, slo, warmup_s=20, cooldown_s=5, stages=arrivals.stages)
summary["steady_state"]["steady"]
"""

from typing import TYPE_CHECKING, Any

from slotune.engine.tokenizer import ByteTokenizer
from slotune.workloads.arrivals import ArrivalSpec, Stage, arrival_times, parse_stages
from slotune.workloads.generators import (
    AgentParams,
    ClippedNormal,
    LengthDist,
    SharedPrefixParams,
    agent_sessions,
    inference_perf_shared_prefix,
    long_context,
    reasoning,
    shared_prefix,
    sharegpt_like,
)
from slotune.workloads.load import BUNDLED, load_trace
from slotune.workloads.metrics import summarize
from slotune.workloads.readers import FORMATS, TraceFormatError
from slotune.workloads.result import RunResult
from slotune.workloads.runner import run_engine, run_simulated
from slotune.workloads.slo import SLO, SLOTarget, parse_slo
from slotune.workloads.steady import ScoringWindow, steady_state
from slotune.workloads.tokenizer import get_tokenizer
from slotune.workloads.trace import Trace, TraceRequest, default_max_model_len

if TYPE_CHECKING:
    from slotune.workloads.runner import run_http


def __getattr__(name: str) -> Any:
    """``run_http`` on first use (see ``slotune.workloads.runner``)."""
    if name == "run_http":
        from slotune.workloads import runner

        return runner.run_http
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BUNDLED",
    "FORMATS",
    "SLO",
    "AgentParams",
    "ArrivalSpec",
    "ByteTokenizer",
    "ClippedNormal",
    "LengthDist",
    "RunResult",
    "SLOTarget",
    "ScoringWindow",
    "SharedPrefixParams",
    "Stage",
    "Trace",
    "TraceFormatError",
    "TraceRequest",
    "agent_sessions",
    "arrival_times",
    "default_max_model_len",
    "get_tokenizer",
    "inference_perf_shared_prefix",
    "load_trace",
    "long_context",
    "parse_slo",
    "parse_stages",
    "reasoning",
    "run_engine",
    "run_http",
    "run_simulated",
    "shared_prefix",
    "sharegpt_like",
    "steady_state",
    "summarize",
]
