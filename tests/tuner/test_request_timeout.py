"""``tune --request-timeout``: every trial's run gives up on requests after that long."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_steady_state_runs_send_for_a_duration_and_score_the_middle() -> None:
    options = TuneOptions(gpu="h100", slo="ttft=600s", rate=4, duration=20, warmup=5, cooldown=2)
    setup = prepare(options).setup
    assert setup.load.duration_s == 20 and (setup.warmup_s, setup.cooldown_s) == (5, 2)
    assert TuneSetup.from_dict(setup.to_dict()) == setup
    evaluator = Evaluator(setup)
    assert len(evaluator.run(EngineConfig(), rate=4).requests) == 80  # 4 req/s for 20 s
    calm = evaluator.measure(EngineConfig(), rate=4)
    assert calm.summary["scoring_window"]["warmup_s"] == 5 and calm.feasible
    # far past capacity every request still meets a lenient SLO, but the run never settles:
    # that rate is not one the server holds
    flooded = evaluator.measure(EngineConfig(max_num_seqs=4), rate=20)
    assert flooded.attainment == 1.0 and flooded.summary["steady_state"]["steady"] is False
    assert not flooded.feasible


def test_tune_cli_with_duration_warmup_and_request_timeout(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from slotune.cli.app import app

    out = tmp_path / "out"
    args = ["tune", "--gpu", "h100", "--slo", "ttft=300ms,tpot=50ms", "--objective", "weighted"]
    args += ["--rate", "4", "--duration", "10", "--warmup", "3", "--cooldown", "1"]
    args += ["--request-timeout", "30", "--trials", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "each run 10 s long" not in result.output  # weighted: the load line says it
    assert "at 4 req/s for 10 s" in result.output
    runs = json.loads((out / "runs" / "best" / "summary.json").read_text())
    assert runs["scoring_window"]["warmup_s"] == 3 and runs["num_requests"] < 40
