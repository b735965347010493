"""``tune --verify`` end to end on the real tiny model: trials on the embedded engine, then
each top configuration served by ``slotune serve --model`` and measured over HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


@pytest.mark.slow
def test_verify_runs_end_to_end_on_the_real_model(tmp_path: Path) -> None:
    from slotune.engine.model.init_model import init_model
    from slotune.tuner.workflow import tune

    model = init_model(tmp_path / "tiny", preset="tiny", seed=0)
    server = f"{sys.executable} -m slotune serve --model {model} {{flags}} --port {{port}}"
    result = tune(
        backend="engine",
        model=str(model),
        slo="ttft=5s,tpot=1s",
        objective="weighted",
        trials=2,
        num_requests=6,
        rate=4,
        out=str(tmp_path / "out"),
        verify=server,
        verify_top=1,
        report=False,
    )
    outcome = result.verified
    assert outcome is not None and result.verified_stack is None  # no simulator to fit
    for c in outcome.candidates:
        assert c.error is None, c.error
        assert len(c.measured) == 1 and c.measured[0]["attainment"] is not None
        assert Path(c.runs[0], "requests.csv").is_file()
    assert outcome.winner in [c.label for c in outcome.candidates]
