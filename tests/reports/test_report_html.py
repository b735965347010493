"""The built HTML file: self-contained, complete, robust to missing keys; the CLI command."""

from __future__ import annotations

import json
import re
import shutil
from html import unescape
from pathlib import Path
from typing import Any

import plotly
import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.reports import build_bench_report, build_report
from slotune.reports.sections import recommendation_sentence
from tests.reports.synthetic import write_out_dir

PLOTLY_BANNER = f"plotly.js v{plotly.__version__}"


def _figure_keys(html: str) -> list[str]:
    return re.findall(r'<div class="figure" id="fig-[^"]+" data-figure="([^"]+)"', html)


def test_report_is_one_self_contained_file(tune_report: Path) -> None:
    html = tune_report.read_text()
    assert tune_report.name == "report.html"
    assert "<script src" not in html.lower(), "no external scripts"
    assert not re.search(r"<link[^>]+href=\"https?:", html), "no external stylesheets"
    assert html.count("* plotly.js v") == 1, "plotly's JavaScript is inline exactly once"


def test_report_has_every_section_and_figure(tune_report: Path) -> None:
    html = tune_report.read_text()
    sections = ("recommendation", "diagnostics", "behaviour", "hardware", "search", "trials")
    for section in (*sections, "provenance"):
        assert f'<section id="{section}">' in html
    assert _figure_keys(html) == [
        "ttft_cdf",
        "tpot_cdf",
        "itl",
        "kv",
        "batch",
        "queues",
        "preemption_cache",
        "roofline",
        "utilization",
        "kv_memory",
        "history",
        "importances",
        "slices",
        "contour",
    ]
    for key in _figure_keys(html):
        assert f'<script type="application/json" id="data-{key}">' in html


def test_recommendation_states_config_metrics_gain_and_commands(
    tune_report: Path, best: dict[str, Any]
) -> None:
    html = unescape(tune_report.read_text())
    sentence = recommendation_sentence(best)
    assert sentence in html
    assert "up to 12.50 req/s within the SLO, +25.0% over vLLM's defaults (10 req/s)" in sentence
    assert f"a goodput of {best['metrics']['goodput']:.2f} req/s at the test load" in sentence
    assert best["load"]["description"] in sentence
    assert f"{100 * best['metrics']['slo_attainment']:.1f}% of requests" in sentence
    changed = [k for k, v in best["config"].items() if best["baseline"]["config"][k] != v]
    for key in changed:
        assert f"{key}={best['config'][key]}" in sentence
    assert best["commands"]["vllm"] in html and best["commands"]["sglang"] in html
    assert html.count('class="copy"') == 2
    assert best["notes"][0] in html


def test_gain_falls_back_to_goodput_at_the_test_load(best: dict[str, Any]) -> None:
    trimmed = {k: v for k, v in best.items() if k not in ("goodput_rps", "score")}
    sentence = recommendation_sentence(trimmed)
    gain = best["metrics"]["goodput"] / best["baseline"]["metrics"]["goodput"] - 1
    assert f"{100 * gain:+.1f}% over vLLM's defaults" in sentence


def test_weighted_objective_states_the_score(best: dict[str, Any]) -> None:
    sentence = recommendation_sentence({**best, "objective": "weighted"})
    assert "weighted SLO score is 0.610 (lower is better), -17.6% against" in sentence


def test_trials_table_lists_every_trial(tune_report: Path) -> None:
    html = tune_report.read_text()
    table = html[html.index('id="trials-table"') :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 1 + 40
    assert "infeasible" in table
    assert table.count("★") == 1 and 'class="chosen"' in table


def test_pareto_study_gets_a_pareto_front(pareto_dir: Path, tmp_path: Path) -> None:
    path = build_report(pareto_dir, tmp_path / "r.html")
    assert path == tmp_path / "r.html"
    assert "pareto" in _figure_keys(path.read_text())


def test_minimal_best_json_shows_na_instead_of_crashing(tmp_path: Path, tune_dir: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(tune_dir / "study.db", out / "study.db")
    (out / "best.json").write_text(json.dumps({"config": {"max_num_batched_tokens": 4096}}))
    html = unescape(build_report(out).read_text())
    assert "max_num_batched_tokens=4096" in html
    assert "n/a" in html
    assert "No stored runs" in html
    assert "history" in _figure_keys(html), "the study alone still draws the search"


def test_trials_csv_is_used_without_a_study(tmp_path: Path, tune_dir: Path, best: dict) -> None:
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(tune_dir / "trials.csv", out / "trials.csv")
    (out / "best.json").write_text(json.dumps(best))
    html = build_report(out).read_text()
    assert "history" in _figure_keys(html)
    assert "no study.db to evaluate them on" in html


def test_user_text_is_escaped(tmp_path: Path, best: dict) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "best.json").write_text(json.dumps({**best, "model": "<script>alert(1)</script>"}))
    (out / "study.db").write_bytes(b"")
    html = build_report(out).read_text()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "could not be read as an Optuna study" in html
    assert (out / "study.db").stat().st_size == 0, "the report never writes to the study"


def test_bench_report_shows_one_run(tune_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "bench"
    shutil.copytree(tune_dir / "runs" / "best", run_dir)
    html = build_bench_report(run_dir).read_text()
    assert _figure_keys(html) == [
        "ttft_cdf",
        "tpot_cdf",
        "itl",
        "kv",
        "batch",
        "queues",
        "preemption_cache",
    ]
    assert 'data-diagnostic="hol"' in html
    assert html.count("* plotly.js v") == 1


@pytest.mark.slow
def test_200_trial_report_stays_under_10_mb(tmp_path: Path) -> None:
    out = tmp_path / "big"
    write_out_dir(out, n_trials=200, n_requests=300)
    html = build_report(out)
    size = html.stat().st_size
    assert size < 10 * 1024 * 1024, f"{size / 1e6:.1f} MB"
    table = html.read_text().split('id="trials-table"')[1].split("</table>")[0]
    assert table.count("<tr>") == 1 + 200


def test_cli_report_rebuilds_from_stored_results(tune_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "again.html"
    result = CliRunner().invoke(app, ["report", str(tune_dir), "--output", str(target)])
    assert result.exit_code == 0, result.output
    assert target.is_file() and "wrote tune report" in result.output


def test_cli_report_detects_a_bench_folder(tune_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "bench"
    shutil.copytree(tune_dir / "runs" / "baseline", run_dir)
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert (run_dir / "report.html").is_file() and "bench report" in result.output


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_cli_report_rejects_folders_that_are_not_results(tmp_path: Path, make: str) -> None:
    folder = tmp_path / "x"
    if make == "empty":
        folder.mkdir()
    result = CliRunner().invoke(app, ["report", str(folder)])
    assert result.exit_code == 2
    assert "error:" in result.output


def test_e2e_and_itl_targets_get_their_own_slo_lines(tmp_path: Path, tune_dir: Path) -> None:
    from slotune.reports.sections import metrics_table

    html = metrics_table([("run", {"e2el_ms": {"p99": 900.0}})], {"e2e": 800.0, "ttft": 300.0})
    assert "E2E p99" in html and 'class="missed">900 ms' in html
    assert "E2E" not in metrics_table([("run", {})], {"ttft": 300.0})
    out = tmp_path / "out"
    shutil.copytree(tune_dir, out)
    best = json.loads((out / "best.json").read_text())
    (out / "best.json").write_text(json.dumps({**best, "slo": "ttft=300ms,itl=40ms"}))
    html = build_report(out).read_text()
    assert "SLO ITL 40 ms" in html


def test_metrics_table_shows_the_preemption_mix_and_each_tier() -> None:
    from slotune.reports.sections import metrics_table

    summary = {
        "preemption_mix": {"recomputed_tokens": 1234, "swapped_tokens": 567},
        "tiers": {
            "0": {"slo_attainment": 0.99, "ttft_ms": {"p99": 250.0}, "tpot_ms": {"p99": 30.0}},
            "1": {"slo_attainment": 0.5, "ttft_ms": {"p99": 900.0}, "tpot_ms": {"p99": 30.0}},
        },
    }
    html = metrics_table([("run", summary)], {"ttft": 300.0})
    assert "tokens recomputed by preemption" in html and "1,234" in html
    assert "tokens swapped by preemption" in html and "567" in html
    assert "tier 0 (pro): SLO attainment" in html and "tier 1 (free): TTFT p99" in html
    assert 'class="met">250 ms' in html and 'class="missed">900 ms' in html
    # per-tier SLOs: each tier's latencies against its own targets
    summary["tiers"]["0"]["slo"] = "ttft=200ms"
    summary["tiers"]["1"]["slo"] = "ttft=2000ms"
    html = metrics_table([("run", summary)], {"ttft": 2000.0})
    assert 'class="missed">250 ms' in html and 'class="met">900 ms' in html
    assert "ttft=200ms" in html
    plain = metrics_table([("run", {})], {"ttft": 300.0})
    assert "tier 0" not in plain and "by preemption" not in plain
