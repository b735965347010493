"""The wall-clock runner on the embedded engine with the real (tiny, random) model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from slotune.engine import Engine, EngineConfig
from slotune.workloads import ArrivalSpec, Trace, TraceRequest, run_engine, summarize


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from slotune.engine.model.init_model import init_model

    return init_model(tmp_path_factory.mktemp("tiny"), preset="tiny", seed=0)


def test_run_engine_with_the_torch_executor(tiny_model: Path) -> None:
    reqs = (
        TraceRequest(request_id="a", prompt_len=40, output_len=4, session_id="s"),
        TraceRequest(
            request_id="b",
            prompt_len=12,
            output_len=3,
            session_id="s",
            turn=1,
            think_time_s=0.01,
            parent_id="a",
        ),
        TraceRequest(request_id="c", prompt_len=30, output_len=5),
    )
    engine = Engine.local(
        EngineConfig(max_num_batched_tokens=64, max_model_len=256),
        model=str(tiny_model),
        device="cpu",
    )
    res = run_engine(engine, Trace(name="tiny", requests=reqs), ArrivalSpec(rate=50, constant=True))
    df = res.requests.set_index("request_id")
    assert df["error"].isna().all()
    assert df["output_tokens"].tolist() == [4, 3, 5]
    assert df.loc["b", "arrival_time"] >= df.loc["a", "finish_time"] + 0.01
    assert df.loc["b", "prompt_tokens"] == 40 + 4 + 12
    assert (df["first_token_time"] > df["arrival_time"]).all()
    assert len(res.steps) >= 4 and (res.steps["duration_s"] > 0).all()
    assert summarize(res)["completed"] == 3


def test_run_engine_gives_up_at_the_timeout_and_frees_blocks(tiny_model: Path) -> None:
    engine = Engine.local(
        EngineConfig(max_num_batched_tokens=64, max_model_len=8192),
        model=str(tiny_model),
        device="cpu",
    )
    reqs = (
        TraceRequest(request_id="long", prompt_len=16, output_len=8000),
        TraceRequest(request_id="short", prompt_len=16, output_len=2),
    )
    res = run_engine(engine, Trace(name="t", requests=reqs), timeout_s=0.3)
    df = res.requests.set_index("request_id")
    assert df.loc["long", "error"] == "timeout"
    assert df.loc["long", "finish_time"] == pytest.approx(df.loc["long", "arrival_time"] + 0.3)
    assert 0 < df.loc["long", "output_tokens"] < 8000
    assert max(df.loc["long", "token_times"]) <= df.loc["long", "finish_time"]
    assert pd.isna(df.loc["short", "error"]) and df.loc["short", "output_tokens"] == 2
    assert not engine.has_unfinished_requests()
    assert res.engine_stats["num_free_blocks"] == res.engine_stats["num_total_blocks"]


def test_the_real_engine_records_what_its_steps_attend_to(tiny_model: Path) -> None:
    """The hardware view's inputs: a 40-token prefill attends to 40 tokens, and each of the
    three decodes after it to the prompt and the outputs so far (41, 42, 43)."""
    engine = Engine.local(
        EngineConfig(max_num_batched_tokens=64, max_model_len=256),
        model=str(tiny_model),
        device="cpu",
    )
    trace = Trace(name="one", requests=(TraceRequest(request_id="a", prompt_len=40, output_len=4),))
    steps = run_engine(engine, trace).steps
    assert steps["prefill_context_sum"].tolist() == [40, 0, 0, 0]
    assert steps["decode_context_sum"].tolist() == [0, 41, 42, 43]
