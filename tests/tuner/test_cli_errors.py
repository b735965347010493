"""Bad input: one clear line and exit code 2, before any trial (or baseline) runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from slotune.cli.app import app

runner = CliRunner()
OK = ["tune", "--gpu", "h100", "--slo", "ttft=300ms,tpot=50ms"]


def _with(args: list[str], **replace: str) -> list[str]:
    out = list(args)
    for flag, value in replace.items():
        flag = "--" + flag.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (_with(OK, slo="ttft=fast"), "'fast' is not a number with a unit"),
        (_with(OK, slo="ttft=300"), "is not a number with a unit"),
        (_with(OK, slo="latency=300ms"), "unknown metric 'latency'"),
        (_with(OK, slo=""), "SLO is empty"),
        (_with(OK, gpu="h900"), "unknown GPU 'h900'"),
        (_with(OK, model="llama-9-1t"), "unknown model 'llama-9-1t'"),
        (_with(OK, weights="ttft=0,tpot=0"), "must sum to a positive number"),
        (_with(OK, weights="ttft=1,e2e=1"), "e2e has no SLO target"),
        (_with(OK, weights="ttft=abc"), "is not a number"),
        (_with(OK, num_requests="100000"), "has only 1000 requests"),
        (_with(OK, trace="no-such-trace"), "not a bundled trace"),
        (_with(OK, objective="fastest"), "unknown objective"),
        (_with(OK, sampler="cmaes"), "unknown sampler"),
        (_with(OK, percentile="0"), "--percentile"),
        (_with(OK, attainment="1.5"), "--attainment"),
        (_with(OK, trials="0"), "--trials"),
        (_with(OK, request_timeout="-1"), "--request-timeout must be positive"),
        (_with(OK, duration="10", warmup="8", cooldown="2"), "shorter than --duration"),
        (_with(OK, duration="10", num_requests="50"), "the rate and the duration set"),
        (_with(OK, tp="3"), "--tp"),
        (_with(OK, quantization="fp4"), "--quantization: unknown weight quantization"),
        (_with(OK, tp="2", ep="2"), "--ep: expert parallel size 2 needs a MoE model"),
        (_with(OK, objective="goodput", concurrency="8"), "closed loop"),
        (["tune", "--slo", "ttft=300ms"], "--gpu is required"),
        (_with(OK, slo="gold:ttft=1s"), "unknown tier 'gold'"),
        (_with(OK, slo="pro:ttft=1s;free:ttft=2s"), "no request of that tier"),
        (_with(OK, trace="agent-tiers", slo="pro:ttft=1s"), "gives them no targets"),
        (_with(OK, tier_objective="pro>=2"), "a floor is a share"),
        (_with(OK, tier_objective="pro>=0.9"), "the trace has one tier"),
        (_with(OK, trace="agent-tiers", tier_objective="tier3>=0.9"), "no request of tier"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error:") and message in lines[0], result.output
    assert not (tmp_path / "out").exists(), "nothing may be written before the input is valid"


def test_empty_search_space_file(tmp_path: Path) -> None:
    search = tmp_path / "space.yaml"
    search.write_text(
        "max_num_batched_tokens: 2048\nlong_prefill_token_threshold: off\nblock_size: 16\n"
        "preemption_mode: recompute\nmax_num_seqs: 256\nprefix_caching: hash\npolicy: chunked\n"
        "kv_cache_dtype: auto\n"
    )
    result = runner.invoke(app, [*OK, "--search", str(search), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "empty search space" in result.output and str(search) in result.output


def test_missing_search_file(tmp_path: Path) -> None:
    result = runner.invoke(app, [*OK, "--search", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "cannot read the search file" in result.output


def test_resume_without_a_study(tmp_path: Path) -> None:
    result = runner.invoke(
        app, [*OK, "--resume", "--study-name", "ghost", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "no study named 'ghost'" in result.output


def test_export_bad_input(tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(tmp_path / "none.json")])
    assert result.exit_code == 2 and "cannot read" in result.output
    bad = tmp_path / "best.json"
    bad.write_text("{}")
    result = runner.invoke(app, ["export", str(bad)])
    assert result.exit_code == 2 and 'no "config"' in result.output
    result = runner.invoke(app, ["export", str(bad), "--format", "toml"])
    assert result.exit_code == 2 and "unknown format" in result.output
