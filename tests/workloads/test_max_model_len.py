"""The one rule for a run's default ``max_model_len``: the trace's longest request."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.workloads import Trace, TraceRequest, default_max_model_len, load_trace


def test_the_longest_request_counts_its_session_history_and_output() -> None:
    trace = Trace(
        name="hand",
        requests=(
            TraceRequest(request_id="a0", prompt_len=10, output_len=5, session_id="a"),
            TraceRequest(request_id="b", prompt_len=30, output_len=2),
            TraceRequest(
                request_id="a1", prompt_len=3, output_len=20, session_id="a", turn=1, parent_id="a0"
            ),
        ),
    )
    # a1 sees a0's prompt and output, then its own 3 tokens, and writes 20: 10 + 5 + 3 + 20
    assert default_max_model_len(trace) == 38


def test_a_trace_of_short_requests_gets_at_least_16() -> None:
    trace = Trace(name="tiny", requests=(TraceRequest(request_id="r", prompt_len=2, output_len=3),))
    assert default_max_model_len(trace) == 16


def test_bench_defaults_max_model_len_by_the_same_rule() -> None:
    args = ["bench", "--trace", "agent", "--num-requests", "12", "--rate", "5", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output[res.output.index("{") :])
    expected = default_max_model_len(load_trace("agent", num_requests=12))
    assert summary["config"]["max_model_len"] == expected
