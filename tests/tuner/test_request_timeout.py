"""``tune --request-timeout``: every trial's run gives up on requests after that long."""

from __future__ import annotations

from slotune.engine import EngineConfig
from slotune.tuner.evaluate import Evaluator
from slotune.tuner.prepare import TuneOptions, prepare
from slotune.tuner.setup import TuneSetup


def test_trials_run_with_the_request_timeout() -> None:
    options = TuneOptions(
        gpu="h100", slo="ttft=300ms,tpot=50ms", rate=80, num_requests=120, request_timeout=1.0
    )
    setup = prepare(options).setup
    assert setup.request_timeout_s == 1.0
    assert TuneSetup.from_dict(setup.to_dict()) == setup  # stored with the study
    evaluator = Evaluator(setup)
    df = evaluator.run(EngineConfig(max_num_seqs=8)).requests
    timed_out = df["error"] == "timeout"
    assert timed_out.any()
    waited = (df["finish_time"] - df["arrival_time"])[timed_out]
    assert (abs(waited - 1.0) < 1e-9).all()
