"""The default tune scores steady-state runs: timed runs with a warm-up and a cool-down left
out, a rate held only when the run settled, and overloaded runs cut at the point where
no request could still meet the SLO."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from slotune.tuner.evaluate import Evaluator, GoodputResult, Measurement, run_horizon_s
from slotune.tuner.objectives import sustained_share
from slotune.tuner.prepare import STEADY_DEFAULT, TuneOptions, baseline_config, prepare
from slotune.workloads import ArrivalSpec, Stage, load_trace

SLO = "ttft=300ms,tpot=50ms"


def test_the_default_run_is_timed_and_scores_its_middle() -> None:
    setup = prepare(TuneOptions(gpu="h100", slo=SLO)).setup
    assert setup.objective == "goodput"
    assert setup.load.duration_s == STEADY_DEFAULT.duration_s == 30
    assert (setup.warmup_s, setup.cooldown_s) == (10, 3)
    assert setup.ladder is not None and setup.ladder["ratio"] == STEADY_DEFAULT.rate_step
    assert setup.num_requests == len(prepare(TuneOptions(gpu="h100", slo=SLO)).trace)


@pytest.mark.parametrize(
    ("options", "duration", "window"),
    [
        ({"num_requests": 200}, None, (0, 0)),  # a number of requests: a burst, as asked
        ({"warmup": 2.0}, None, (2, 0)),
        ({"duration": 60.0}, 60, (10, 3)),
        ({"duration": 12.0}, 12, (4, 1.2)),  # a third and a tenth of a short run
        ({"duration": 12.0, "warmup": 1.0}, 12, (1, 1.2)),
        ({"trace": "TIMESTAMPED"}, None, (0, 0)),  # the trace's own timestamps
        ({"concurrency": 8, "objective": "weighted"}, None, (0, 0)),
    ],
)
def test_flags_that_shape_the_run_keep_their_meaning(
    tmp_path: Path, options: dict, duration: float | None, window: tuple[float, float]
) -> None:
    if options.get("trace") == "TIMESTAMPED":
        trace = load_trace("sharegpt-like", num_requests=40)
        timed = [replace(r, arrival_time=0.25 * i) for i, r in enumerate(trace.requests)]
        replace(trace, requests=tuple(timed)).to_jsonl(tmp_path / "timed.jsonl")
        options = {**options, "trace": str(tmp_path / "timed.jsonl")}
    setup = prepare(TuneOptions(gpu="h100", slo=SLO, **options)).setup
    assert setup.load.duration_s == duration
    assert (setup.warmup_s, setup.cooldown_s) == pytest.approx(window)


def test_a_run_that_never_settled_is_not_held_and_ranks_below_the_rate() -> None:
    unsettled = {"steady_state": {"steady": False, "growth_per_s": 12.0}}
    assert sustained_share(unsettled, 60.0) == pytest.approx(0.8)
    assert sustained_share({"steady_state": {"steady": True, "growth_per_s": 12.0}}, 60.0) == 1
    assert sustained_share({"steady_state": {"steady": None}}, 60.0) == 1
    at = Measurement(60.0, unsettled, 0.5, 1.0, False, sustained_share(unsettled, 60.0))
    assert GoodputResult(None, None, at, {60.0: 1.0}).value == pytest.approx(48.0)


def test_the_horizon_cuts_an_overloaded_run_without_changing_any_verdict() -> None:
    prepared = prepare(TuneOptions(gpu="h100", slo=SLO, duration=12.0))
    evaluator = Evaluator(prepared.setup, prepared.trace)
    longest = max(r.output_len for r in prepared.trace)
    arrivals = prepared.setup.load.arrivals(40.0)
    horizon = run_horizon_s(evaluator.slo, prepared.trace, arrivals)
    assert horizon == pytest.approx(12.0 + 0.3 + 0.05 * (longest - 1))
    slow = replace(baseline_config(prepared), max_num_batched_tokens=512, max_num_seqs=8)
    cut = evaluator.summarize(evaluator.run(slow, 40.0))
    evaluator.horizons = False
    whole = evaluator.summarize(evaluator.run(slow, 40.0))
    assert cut["failed"] > 0 and whole["failed"] == 0  # the stop failed requests...
    assert cut["slo_attainment"] == whole["slo_attainment"]  # ...that had missed already
    assert cut["steady_state"]["steady"] is whole["steady_state"]["steady"] is False


def test_a_replay_of_the_trace_timestamps_stops_after_its_last_arrival(tmp_path: Path) -> None:
    """An overloaded replay of a timestamped trace stops ``longest_meeting_s`` after its last
    arrival (scaled), failing only requests that had missed the SLO already."""
    trace = load_trace("sharegpt-like", num_requests=240)
    timed = [replace(r, arrival_time=100.0 + 0.02 * i) for i, r in enumerate(trace.requests)]
    replace(trace, requests=tuple(timed)).to_jsonl(tmp_path / "timed.jsonl")
    prepared = prepare(
        TuneOptions(gpu="h100", slo=SLO, trace=str(tmp_path / "timed.jsonl"), objective="weighted")
    )
    assert prepared.setup.load.timestamps
    evaluator = Evaluator(prepared.setup, prepared.trace)
    longest = max(r.output_len for r in prepared.trace)
    arrivals = prepared.setup.load.arrivals()
    horizon = run_horizon_s(evaluator.slo, prepared.trace, arrivals)
    assert horizon == pytest.approx(0.02 * 239 + 0.3 + 0.05 * (longest - 1))
    scaled = replace(arrivals, time_scale=2.0)
    assert run_horizon_s(evaluator.slo, prepared.trace, scaled) == pytest.approx(
        2 * 0.02 * 239 + 0.3 + 0.05 * (longest - 1)
    )
    slow = replace(baseline_config(prepared), max_num_batched_tokens=512, max_num_seqs=4)
    cut = evaluator.run(slow)
    evaluator.horizons = False
    whole = evaluator.run(slow)
    assert cut.duration_s < whole.duration_s
    cut_summary, whole_summary = evaluator.summarize(cut), evaluator.summarize(whole)
    assert cut_summary["failed"] > 0 and whole_summary["failed"] == 0
    assert cut_summary["slo_attainment"] == whole_summary["slo_attainment"]


@pytest.mark.parametrize(
    "arrivals",
    [
        ArrivalSpec(stages=(Stage(5.0, 10.0),)),
        ArrivalSpec(timestamps=True),
        ArrivalSpec(stages=(Stage(5.0, 10.0),), concurrency=4),
        ArrivalSpec(timestamps=True, concurrency=4),
        ArrivalSpec(rate=5.0),
        ArrivalSpec(),
    ],
    ids=["stages", "timestamps", "stages-capped", "timestamps-capped", "rate", "burst"],
)
@pytest.mark.parametrize("multi_turn", [False, True], ids=["single", "sessions"])
def test_no_horizon_where_a_send_may_wait_for_a_finish(
    arrivals: ArrivalSpec, multi_turn: bool
) -> None:
    """A capped flow or a session's next turn is sent after a finish, so its last send (and
    a request still able to meet the SLO) may come after any horizon set before the run."""
    from slotune.workloads import parse_slo

    trace = load_trace("agent" if multi_turn else "sharegpt-like", num_requests=30)
    if not trace.has_timestamps:
        roots = [replace(r, arrival_time=0.5 * i) for i, r in enumerate(trace.requests)]
        trace = replace(trace, requests=tuple(roots))
    assert (trace.requests_per_session > 1) is multi_turn
    horizon = run_horizon_s(parse_slo(SLO), trace, arrivals)
    send_known = arrivals.timestamps or bool(arrivals.stages)
    waits = arrivals.concurrency is not None or multi_turn
    assert (horizon is not None) is (send_known and not waits)


def test_a_steady_study_tries_the_defaults_with_each_kv_cache_format(tmp_path: Path) -> None:
    import slotune

    result = slotune.tune(
        gpu="h100", slo=SLO, duration=8.0, trials=2, out=str(tmp_path), report=False
    )
    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    first, second = (t.user_attrs["config"] for t in study.trials[:2])
    assert first == result.baseline["config"] and first["kv_cache_dtype"] == "auto"
    assert second == {**first, "kv_cache_dtype": "fp8"}
