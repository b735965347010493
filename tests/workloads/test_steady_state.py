"""Load stages, the scoring window (warm-up, cool-down) and the steady-state check."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from slotune.engine import EngineConfig
from slotune.workloads import (
    ArrivalSpec,
    RunResult,
    Stage,
    Trace,
    TraceRequest,
    arrival_times,
    load_trace,
    parse_slo,
    parse_stages,
    run_simulated,
    summarize,
)
from slotune.workloads.runner.engine_loop import VirtualClock, drive_engine
from slotune.workloads.steady import steady_state

from .conftest import FakeEngine

# FakeEngine with a 40-token budget serves 40-token prompts one at a time: a 0.014 s
# prefill step (first token), then 7 decode steps of 0.0101 s: 0.0847 s per request
SERVICE_S = 0.014 + 7 * 0.0101


def _trace(n: int) -> Trace:
    reqs = tuple(TraceRequest(request_id=f"r{i}", prompt_len=40, output_len=8) for i in range(n))
    return Trace(name="t", requests=reqs)


# stages ------------------------------------------------------------------------------


def test_parse_stages_and_describe() -> None:
    stages = parse_stages("5:60, 10:30.5")
    assert stages == (Stage(5, 60), Stage(10, 30.5))
    spec = ArrivalSpec(stages=stages)
    assert spec.num_sessions == 300 + 305 and spec.duration_s == 90.5
    assert spec.describe() == "Poisson stages: 5 req/s for 60 s, 10 req/s for 30.5 s"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("5", "expected RATE:SECONDS"), ("5:x", "expected RATE:SECONDS"), ("0:60", "rate: must")],
)
def test_bad_stages(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_stages(text)


def test_stages_exclude_a_rate() -> None:
    with pytest.raises(ValueError, match="stages, a rate or timestamps"):
        ArrivalSpec(rate=3, stages=(Stage(1, 10),))


@pytest.mark.parametrize("burstiness", [1.0, 0.5])
def test_each_stage_sends_its_rate_for_its_duration(burstiness: float) -> None:
    spec = ArrivalSpec(stages=parse_stages("20:100,60:50"), burstiness=burstiness)
    times = np.asarray(arrival_times(spec, 5000, seed=3))
    assert np.all(np.diff(times) >= 0)
    first, second = times[:2000], times[2000:]
    assert first.min() >= 0 and first.max() < 100 and second.min() >= 100 and second.max() < 150
    # within a stage the gaps have the mean 1/rate and the shape's coefficient of variation
    gaps = np.diff(first)
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.1)


def test_constant_stages() -> None:
    spec = ArrivalSpec(stages=parse_stages("2:2,4:1"), constant=True)
    assert arrival_times(spec, 8) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.25, 2.5, 2.75]


def test_stages_need_a_trace_of_their_size() -> None:
    with pytest.raises(ValueError, match=r"send 20 sessions, the trace has 5; .*repeat_to\(20\)"):
        arrival_times(ArrivalSpec(stages=(Stage(2, 10),)), 5)


def test_repeat_to_cuts_or_repeats_whole_sessions() -> None:
    trace = load_trace("agent")
    sessions = len({r.session_id for r in trace})
    longer = trace.repeat_to(2 * sessions + 3)
    assert len({r.session_id for r in longer}) == 2 * sessions + 3
    assert len(longer) > 2 * len(trace)
    ids = {r.request_id for r in longer}
    assert all(r.parent_id is None or r.parent_id in ids for r in longer)
    assert longer.requests[len(trace)].request_id == trace.requests[0].request_id + "~1"
    shorter = trace.repeat_to(3)
    assert len({r.session_id for r in shorter}) == 3
    assert shorter.requests == tuple(r for r in trace if r.session_id in {"ag0", "ag1", "ag2"})


# the scoring window ------------------------------------------------------------------


def _result(rows: list[tuple[float, list[float]]], duration: float) -> RunResult:
    """Requests from (arrival, token times); each finishes with its last token."""
    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(len(rows))],
            "session_id": None,
            "turn": 0,
            "arrival_time": [a for a, _ in rows],
            "first_token_time": [ts[0] for _, ts in rows],
            "finish_time": [ts[-1] for _, ts in rows],
            "token_times": [ts for _, ts in rows],
            "prompt_tokens": 10,
            "output_tokens": [len(ts) for _, ts in rows],
            "cached_tokens": 0,
            "num_preemptions": 0,
            "error": None,
        }
    )
    return RunResult(requests=df, steps=pd.DataFrame(), duration_s=duration)


def test_warmup_and_cooldown_leave_out_the_ends() -> None:
    # arrivals at 0..10 s; a warm-up of 2 s and a cool-down of 3 s score those at 2..7 s
    rows = [(0.0, [1.0, 1.2, 1.4])] + [
        (float(a), [a + 0.1, a + 0.5, a + 0.9]) for a in range(1, 11)
    ]
    res = _result(rows, duration=10.9)
    full = summarize(res, parse_slo("ttft=200ms"))
    s = summarize(res, parse_slo("ttft=200ms"), warmup_s=2, cooldown_s=3)
    assert full["num_requests"] == 11 and full["slo_attainment"] == pytest.approx(10 / 11)
    assert s["scoring_window"] == {
        "start_s": 2.0,
        "end_s": 7.0,
        "warmup_s": 2,
        "cooldown_s": 3,
        "requests": 6,
    }
    assert s["num_requests"] == 6 and s["slo_attainment"] == 1.0  # r0's slow TTFT is left out
    assert s["ttft_ms"]["mean"] == pytest.approx(100.0)
    assert s["goodput"] == pytest.approx(6 / 5)  # per second of the 5 s window
    # finished inside [2, 7]: r2..r6 (r1 at 1.9 s, r7 at 7.9 s are outside); their 15 tokens
    assert s["request_throughput"] == pytest.approx(5 / 5)
    assert s["output_throughput"] == pytest.approx(15 / 5)
    assert s["duration_s"] == 10.9


def test_goodput_never_exceeds_the_offered_rate() -> None:
    """Six arrivals in a 5 s window of a 1 req/s load: 1.2 req/s counted, 1 offered."""
    rows = [(float(a), [a + 0.1, a + 0.5, a + 0.9]) for a in range(0, 11)]
    res = _result(rows, duration=10.9)
    slo = parse_slo("ttft=200ms")
    assert summarize(res, slo, warmup_s=2, cooldown_s=3)["goodput"] == pytest.approx(1.2)
    s = summarize(res, slo, warmup_s=2, cooldown_s=3, offered_rate=1.0)
    assert s["goodput"] == pytest.approx(1.0) and s["offered_rate"] == 1.0


def test_a_window_with_nothing_left_is_an_error() -> None:
    res = _result([(0.0, [0.1]), (1.0, [1.1])], duration=1.1)
    with pytest.raises(ValueError, match="leave nothing of the 1 s of arrivals"):
        summarize(res, warmup_s=0.5, cooldown_s=0.5)


# the steady-state check --------------------------------------------------------------


def _serial_run(rate: float, *, constant: bool) -> RunResult:
    spec = ArrivalSpec(stages=(Stage(rate, 20.0),), constant=constant)
    trace = _trace(1).repeat_to(spec.num_sessions or 0)
    return drive_engine(FakeEngine(budget=40), trace, spec, VirtualClock(), seed=1)


@pytest.mark.parametrize(
    ("load", "constant", "steady"),
    [
        (0.5, False, True),  # below capacity
        (0.5, True, True),
        (1.0, True, True),  # at capacity, with constant gaps: one in service, none behind
        (1.25, True, False),  # above capacity: the queue grows without end
        (2.0, False, False),
    ],
)
def test_steady_state_below_at_and_above_capacity(
    load: float, constant: bool, steady: bool
) -> None:
    res = _serial_run(load / SERVICE_S, constant=constant)
    check = summarize(res)["steady_state"]
    assert check["steady"] is steady, check
    if steady:
        assert check["in_flight_end"] <= 4
    else:
        # the backlog grows by (arrival rate - service rate) per second
        growth_per_s = (load - 1) / SERVICE_S
        window_thirds = 2 / 3 * 20.0 * (1 - 2 / 60)  # between the thirds' centres
        assert check["growth"] == pytest.approx(growth_per_s * window_thirds, rel=0.15)
        assert check["growth_per_s"] == pytest.approx(growth_per_s, rel=0.15)
        assert "never settled" in check["note"]


def test_a_step_up_in_load_is_not_growth_but_overload_in_a_stage_is() -> None:
    def run(loads: tuple[float, float]) -> dict:
        stages = tuple(Stage(load / SERVICE_S, 20.0) for load in loads)
        spec = ArrivalSpec(stages=stages)
        res = drive_engine(
            FakeEngine(budget=40), _trace(1).repeat_to(spec.num_sessions or 0), spec, VirtualClock()
        )
        return summarize(res, stages=stages)["steady_state"]

    calm = run((0.2, 0.85))
    assert calm["steady"] is True and len(calm["parts"]) == 2
    assert calm["parts"][1]["in_flight_start"] > calm["parts"][0]["in_flight_end"]
    rising = run((0.5, 1.5))
    assert rising["steady"] is False
    assert rising == {**rising["parts"][1], "parts": rising["parts"]}  # the second stage grew


def test_steady_state_on_the_simulator() -> None:
    cfg = EngineConfig(max_num_seqs=8)
    trace = load_trace("sharegpt-like")
    checks = {}
    for rate in (1.0, 30.0):
        spec = ArrivalSpec(stages=(Stage(rate, 20.0),))
        res = run_simulated(cfg, trace.repeat_to(spec.num_sessions or 0), arrivals=spec)
        checks[rate] = summarize(res, warmup_s=5, cooldown_s=2)["steady_state"]
    assert checks[1.0]["steady"] is True
    assert checks[30.0]["steady"] is False
    assert steady_state(res)["growth"] > checks[1.0]["growth"]


def test_all_at_once_has_no_steady_state() -> None:
    res = drive_engine(FakeEngine(), _trace(5), ArrivalSpec(), VirtualClock())
    assert summarize(res)["steady_state"]["steady"] is None
