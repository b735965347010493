"""Tables and hints stay readable in an 80-column terminal: no column cut to a letter or an
ellipsis, no metric name wrapped, no command broken across lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.regress.compare import Comparison, Judgement
from slotune.regress.report import rich_table

runner = CliRunner(env={"COLUMNS": "80"})


def _lines(args: list[str]) -> list[str]:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in result.output, result.output
    return lines


def _row(lines: list[str], first: str) -> list[str]:
    return next(line.split() for line in lines if line.split()[:1] == [first])


def test_models_shows_every_column_whole() -> None:
    lines = _lines(["models"])
    header = "  ".join(lines).split()
    for column in ("layers", "hidden", "q/kv", "FFN", "vocab", "experts", "params", "active"):
        assert column in header, column
    for column in ("weights", "GB", "KV"):
        assert column in header, column
    # the whole numbers, not their first letters
    rows = [line.split() for line in lines if line.startswith("gpt-oss-120b")]
    assert rows[0] == ["gpt-oss-120b", "36", "2880", "64/8", "2880", "201088", "4/128"]
    assert rows[1] == ["gpt-oss-120b", "116.79", "5.71", "bf16/mxfp4", "65.2", "72"]


def test_traces_list_keeps_its_header_and_descriptions_aligned() -> None:
    lines = _lines(["traces", "list"])
    header = next(line for line in lines if line.startswith("trace "))
    assert header.split() == ["trace", "reqs", "sess", "in", "in", "p99", "out", "out", "p99",
                              "prefix", "times"]  # fmt: skip
    assert _row(lines, "agent")[:3] == ["agent", "340", "64"]
    # a wrapped description continues under its own column, not at the margin
    starts = {line.index("agent sessions") for line in lines if "agent sessions" in line}
    continued = [line for line in lines if line.strip() == "turns"]
    assert continued and all(line.index("turns") in starts for line in continued)


def test_regress_table_keeps_metric_names_on_one_line() -> None:
    judgements = [
        Judgement("chat-sim-steady", "ttft_ms.p99", "+10%", 123.4, 130.2, 0.0, "ok", True, ""),
        Judgement("tune", "metrics.slo_attainment", "0", 0.98, 0.9, 0.0, "regressed", True, ""),
        Judgement("tune", "prefix_cache_hit_rate", "-5%", 0.5, 0.5, 0.0, "ok", False, ""),
    ]
    console = Console(width=80, record=True)
    console.print(rich_table(Comparison(judgements, [])))
    text = console.export_text()
    assert "…" not in text
    for j in judgements:
        line = next(line for line in text.splitlines() if j.metric in line)
        assert j.tolerance in line.split()
    assert "regressed" in text.split()


@pytest.mark.slow
def test_tune_prints_the_export_command_on_one_line(tmp_path: Path) -> None:
    out = tmp_path / "a-rather-long-folder-name-for-the-study-outputs" / "h100-chat"
    args = ["tune", "--gpu", "h100", "--slo", "ttft=300ms,tpot=50ms", "--num-requests", "20"]
    result = runner.invoke(app, [*args, "--rate", "4", "--trials", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    command = f"Export: slotune export {out / 'best.json'}"
    assert len(command) > 80
    assert any(line.strip() == command for line in result.output.splitlines()), result.output
