"""The report's hardware section and ``slotune explain``: runs read against the GPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.reports.build import RECOMMENDED, baseline_label
from slotune.reports.hardware import analyse, hardware_html
from slotune.reports.runs import RunData, load_run

H100_BW, H100_BF16 = 3350e9, 989.4e12


def _runs(tune_dir: Path, best: dict[str, Any]) -> list[RunData]:
    return [
        load_run(tune_dir / "runs" / "best", RECOMMENDED, best["config"]),
        load_run(tune_dir / "runs" / "baseline", baseline_label(best), best["baseline"]["config"]),
    ]


def _copy(tune_dir: Path, tmp_path: Path, change: dict[str, Any]) -> Path:
    out = tmp_path / "tune"
    shutil.copytree(tune_dir, out)
    for run in ("best", "baseline"):
        path = out / "runs" / run / "steps.csv"
        steps = pd.read_csv(path)
        for column, value in change.items():
            if value is None:
                steps = steps.drop(columns=column)
            else:
                steps[column] = value
        steps.to_csv(path, index=False)
    return out


def test_mbu_and_mfu_are_the_runs_bytes_and_flops_over_their_time(
    tune_dir: Path, best: dict[str, Any]
) -> None:
    hw = analyse(_runs(tune_dir, best)[0], best)
    seconds = hw.steps["step_time"].sum()
    assert hw.mbu() == pytest.approx(hw.steps["hbm_bytes"].sum() / seconds / H100_BW)
    assert hw.mfu() == pytest.approx(hw.steps["flops"].sum() / seconds / H100_BF16)
    assert hw.mbu(fitted=True) > hw.mbu() and hw.mfu(fitted=True) > hw.mfu()
    # every step's time is priced op by op; their sum is the cost model's, near the stored one
    assert sum(hw.ops.values()) > 0
    assert hw.bound_op == max(hw.ops, key=hw.ops.__getitem__)
    assert hw.kv_capacity_gib is not None and 20 < hw.kv_capacity_gib < 80


def test_section_has_table_charts_and_a_sentence_each(tune_dir: Path, best: dict[str, Any]) -> None:
    html = hardware_html(_runs(tune_dir, best), best)
    for key in ("roofline", "utilization", "kv_memory"):
        assert f'data-figure="{key}"' in html
    assert html.count('<p class="caption">') == 4
    assert "of the 295 FLOP/B ridge" in html  # h100: 989.4 TFLOP/s over 3.35 TB/s
    assert "preemption" in html and "Prefix-cache hit rate" in html
    assert RECOMMENDED in html and baseline_label(best) in html


def test_a_quantity_that_is_zero_is_a_sentence_not_an_empty_chart(
    tune_dir: Path, best: dict[str, Any], tmp_path: Path
) -> None:
    out = _copy(tune_dir, tmp_path, {"kv_cache_usage": 0.0, "num_preempted": 0})
    html = hardware_html(_runs(out, best), best)
    assert 'data-figure="kv_memory"' not in html
    assert 'data-empty="kv_memory"' in html and "no preemptions" in html
    assert 'data-figure="roofline"' in html  # the others still draw


def test_runs_without_context_columns_say_so(
    tune_dir: Path, best: dict[str, Any], tmp_path: Path
) -> None:
    out = _copy(tune_dir, tmp_path, {"decode_context_sum": None, "prefill_context_sum": None})
    html = hardware_html(_runs(out, best), best)
    assert "lacks the per-step context columns" in html


def test_runs_that_cannot_be_read_say_why(tune_dir: Path, best: dict[str, Any]) -> None:
    html = hardware_html(_runs(tune_dir, best), {**best, "backend": "http", "url": "http://x"})
    assert "Not read against the GPU" in html and "data-figure" not in html
    assert "measured on http://x" in html
    # a real engine's run without the ceilings and shapes it records (an older slotune)
    html = hardware_html(_runs(tune_dir, best), {**best, "backend": "engine"})
    assert "recorded no device ceilings" in html and "data-figure" not in html


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_explain_compares_the_two_runs_op_by_op(tune_dir: Path, best: dict[str, Any]) -> None:
    code, out = _run("explain", str(tune_dir / "best.json"), "--json")
    assert code == 0, out
    data = json.loads(out)
    hw = analyse(_runs(tune_dir, best)[1], best)
    base = baseline_label(best)
    assert data[base]["op_seconds"] == pytest.approx(hw.ops)
    assert data[base]["mbu"] == pytest.approx(hw.mbu())
    assert data[RECOMMENDED]["bound_op"] in data[RECOMMENDED]["op_seconds"]
    code, out = _run("explain", str(tune_dir))
    assert code == 0 and "weights (linear layers)" in out and "MFU" in out


def test_explain_without_a_tune_folder_exits_2(tmp_path: Path) -> None:
    code, out = _run("explain", str(tmp_path / "best.json"))
    assert code == 2 and "no best.json" in out


def test_estimate_names_the_bound_op_and_its_ops_add_up() -> None:
    code, out = _run(
        "estimate",
        "--gpu",
        "h100",
        "--model",
        "llama-3-8b",
        "--tokens",
        "512",
        "--decode-batch",
        "64",
        "--decode-context",
        "2000",
        "--json",
    )
    assert code == 0, out
    data = json.loads(out)
    roof = data["roofline"]
    assert roof["step_ms"] == pytest.approx(data["step_ms"], abs=1e-5)
    assert sum(o["ms"] for o in roof["ops"].values()) == pytest.approx(roof["step_ms"])
    assert roof["bound_op"] == max(roof["ops"], key=lambda k: roof["ops"][k]["ms"])
    assert roof["ops"]["kv_read"]["bound_by"] == "memory"
    assert roof["mbu"] == pytest.approx(roof["hbm_bytes"] / (roof["step_ms"] / 1e3) / H100_BW)
    code, out = _run("estimate", "--gpu", "h100", "--model", "llama-3-8b", "--tokens", "512")
    assert code == 0 and "bound op: weights (compute)" in " ".join(out.split())
