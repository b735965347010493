"""A rate counts sessions: on a multi-turn trace the load says so, with the requests per
second it sends, and that figure is what the runner sends."""

from __future__ import annotations

from slotune.engine import EngineConfig
from slotune.workloads import ArrivalSpec, load_trace, run_simulated
from slotune.workloads.arrivals import Stage


def test_single_requests_are_described_in_requests_per_second() -> None:
    trace = load_trace("sharegpt-like", num_requests=50)
    assert trace.requests_per_session == 1
    assert ArrivalSpec(rate=4).describe(trace.requests_per_session) == "Poisson at 4 req/s"


def test_sessions_are_described_with_the_requests_they_send() -> None:
    trace = load_trace("agent")
    assert trace.requests_per_session == len(trace) / 64  # 340 requests in 64 sessions
    text = ArrivalSpec(rate=4).describe(trace.requests_per_session)
    assert text == "Poisson at 4 sessions/s (~21.2 req/s)"


def test_the_described_request_rate_is_what_arrives() -> None:
    spec = ArrivalSpec(stages=(Stage(4, 40),))
    trace = load_trace("agent").repeat_to(spec.num_sessions or 0)
    said = 4 * trace.requests_per_session
    assert f"~{said:.3g} req/s" in spec.describe(trace.requests_per_session)
    result = run_simulated(EngineConfig(), trace, gpu="h100", model="llama-3-8b", arrivals=spec)
    arrivals = result.requests["arrival_time"]
    sent = ((arrivals >= 10) & (arrivals < 40)).sum() / 30  # past the first sessions' ramp
    assert abs(sent - said) / said < 0.2, (sent, said)
    assert sent > 2 * 4  # far more than the session rate
