"""The report in a real browser: headless Chromium over the DevTools protocol.

Checks that every chart rendered (plotly's ``svg.main-svg`` roots in every figure), that
the console stayed free of errors, that the page fetched nothing but itself, and that the
recommendation matches ``best.json``. Screenshots land in pytest's temporary folder (the
path is in every failure message) so a failure can be looked at.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from slotune.reports import build_bench_report
from tests.reports.cdp import Page, open_page

CHROMIUM = os.environ.get("SLOTUNE_CHROMIUM") or shutil.which("chromium")
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Debian's chromium is not installed (apt-get install chromium; .ci/run does it)",
    ),
    pytest.mark.slow,  # a headless browser per report
]

INSPECT = """JSON.stringify({
  rendered: document.body.dataset.rendered,
  figures: Array.from(document.querySelectorAll("div.figure")).map(
    d => [d.dataset.figure, d.querySelectorAll("svg.main-svg").length]),
  specs: document.querySelectorAll('script[type="application/json"]').length,
  empty: Array.from(document.querySelectorAll("[data-empty]")).map(p => p.dataset.empty),
  recommendation: (document.getElementById("recommendation-text") || {}).innerText || null,
  vllm: (document.getElementById("cmd-vllm") || {}).textContent || null,
  sglang: (document.getElementById("cmd-sglang") || {}).textContent || null,
  configTable: (document.querySelector("table.config") || {}).innerText || null,
  overflowing: Array.from(document.querySelectorAll(".grid table")).filter(
    t => t.scrollWidth > t.parentElement.clientWidth + 1).map(t => t.className),
  exponents: Array.from(document.querySelectorAll("#trials-table td")).map(
    td => td.textContent).filter(text => /\\de[+-]\\d/.test(text)),
})"""
FIRST_TRIAL = "document.querySelector('#trials-table tbody tr td').dataset.sort"


async def _open(page: Page, path: Path, shot: Path) -> dict[str, Any]:
    await page.navigate(path.as_uri())
    await page.wait_for("document.body.dataset.rendered", timeout=90)
    await page.screenshot(shot)
    return json.loads(await page.evaluate(INSPECT))


async def _session(tune: Path, bench: Path, engine: Path, shots: Path) -> dict[str, Any]:
    assert CHROMIUM is not None
    async with open_page(CHROMIUM, shots / "profile") as page:
        tune_info = await _open(page, tune, shots / "tune_report.png")
        await page.evaluate("document.querySelector('#trials-table th').click()")
        ascending = await page.evaluate(FIRST_TRIAL)
        await page.evaluate("document.querySelector('#trials-table th').click()")
        descending = await page.evaluate(FIRST_TRIAL)
        await page.evaluate("document.querySelector('button.copy').click()")
        await asyncio.sleep(0.2)
        copy_label = await page.evaluate("document.querySelector('button.copy').textContent")
        tune_info.update(sorted=(ascending, descending), copy_label=copy_label)
        tune_log = (list(page.log.errors), list(page.log.requested_urls))
        page.log.errors.clear()
        page.log.requested_urls.clear()
        bench_info = await _open(page, bench, shots / "bench_report.png")
        bench_log = (list(page.log.errors), list(page.log.requested_urls))
        page.log.errors.clear()
        page.log.requested_urls.clear()
        engine_info = await _open(page, engine, shots / "engine_report.png")
        engine_log = (list(page.log.errors), list(page.log.requested_urls))
    tune_info["errors"], tune_info["urls"] = tune_log
    bench_info["errors"], bench_info["urls"] = bench_log
    engine_info["errors"], engine_info["urls"] = engine_log
    return {"tune": tune_info, "bench": bench_info, "engine": engine_info, "shots": shots}


def _simulated_without_kv(bench_dir: Path) -> None:
    """A bench run of a named simulated GPU whose KV cache and preemptions stay at zero."""
    summary = json.loads((bench_dir / "summary.json").read_text())
    summary.update(backend="sim", gpu="h100", model="llama-3-8b", tp=1)
    (bench_dir / "summary.json").write_text(json.dumps(summary))
    steps = pd.read_csv(bench_dir / "steps.csv")
    steps["kv_cache_usage"] = 0.0
    steps["num_preempted"] = 0
    steps.to_csv(bench_dir / "steps.csv", index=False)


def _real_engine_bench(out: Path) -> Path:
    """A bench report of slotune's engine running the tiny checkpoint on this CPU."""
    from typer.testing import CliRunner

    from slotune.cli.app import app
    from slotune.engine.model.init_model import init_model

    model = init_model(out / "tiny", "tiny", seed=0)
    trace = out / "short.jsonl"
    lines = [{"id": f"r{i}", "prompt_len": 30 + 10 * i, "output_len": 8} for i in range(4)]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["bench", "--backend", "engine", "--model", str(model), "--trace", str(trace)]
    res = CliRunner().invoke(app, [*args, "--rate", "50", "--out", str(out / "engine")])
    assert res.exit_code == 0, res.output
    return out / "engine" / "report.html"


@pytest.fixture(scope="module")
def browser(
    tune_report: Path, tune_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    shots = tmp_path_factory.mktemp("screenshots")
    bench_dir = shots / "bench"
    shutil.copytree(tune_dir / "runs" / "best", bench_dir)
    _simulated_without_kv(bench_dir)
    bench = build_bench_report(bench_dir)
    engine = _real_engine_bench(shots)
    return asyncio.run(_session(tune_report, bench, engine, shots))


@pytest.mark.parametrize("report", ["tune", "bench", "engine"])
def test_every_chart_rendered(browser: dict[str, Any], report: str) -> None:
    info = browser[report]
    where = f"(screenshot: {browser['shots'] / f'{report}_report.png'})"
    assert info["rendered"] == str(len(info["figures"])), where
    assert len(info["figures"]) == info["specs"] >= 7, where
    blank = [key for key, roots in info["figures"] if roots < 1]
    assert not blank, f"figures without plotly SVG roots: {blank} {where}"


def test_hardware_charts_render_and_a_zero_quantity_is_a_sentence(
    browser: dict[str, Any],
) -> None:
    tune, bench = browser["tune"], browser["bench"]
    drawn = {r: {k for k, roots in browser[r]["figures"] if roots} for r in ("tune", "bench")}
    assert {"roofline", "utilization", "kv_memory"} <= drawn["tune"]
    assert tune["empty"] == []
    assert {"roofline", "utilization"} <= drawn["bench"] and "kv_memory" not in drawn["bench"]
    assert bench["empty"] == ["kv_memory"], f"screenshot: {browser['shots']}"


def test_a_real_engine_run_draws_its_hardware_charts(browser: dict[str, Any]) -> None:
    """slotune's engine on this CPU: read against the ceilings measured here, every chart."""
    info = browser["engine"]
    drawn = {k for k, roots in info["figures"] if roots}
    assert {"roofline", "utilization", "kv_memory"} <= drawn, f"screenshot: {browser['shots']}"
    assert info["empty"] == []


@pytest.mark.parametrize("report", ["tune", "bench", "engine"])
def test_console_has_no_errors_and_nothing_is_fetched(browser: dict[str, Any], report: str) -> None:
    info = browser[report]
    assert info["errors"] == [], f"{info['errors']} (screenshots in {browser['shots']})"
    remote = [u for u in info["urls"] if not u.startswith(("file:", "data:", "about:"))]
    assert remote == [], "the report must work offline"


def test_recommendation_matches_best_json(browser: dict[str, Any], best: dict[str, Any]) -> None:
    info = browser["tune"]
    text = info["recommendation"]
    assert text, f"no recommendation text (screenshot in {browser['shots']})"
    assert f"{best['metrics']['goodput']:,.2f} req/s at the test load" in text
    assert f"up to {best['goodput_rps']:,.2f} req/s within the SLO" in text
    assert f"{100 * best['metrics']['slo_attainment']:.1f}% of requests" in text
    assert best["slo"] in text and best["model"] in text and best["gpu"] in text
    for key, value in best["config"].items():
        if value != best["baseline"]["config"][key]:
            assert f"{key}={value}" in text
    for key in best["config"]:
        assert key in info["configTable"]
    assert info["vllm"] == best["commands"]["vllm"]
    assert info["sglang"] == best["commands"]["sglang"]


def test_tables_fit_at_1400_px_and_numbers_read_plainly(browser: dict[str, Any]) -> None:
    info = browser["tune"]
    where = f"(screenshot: {browser['shots'] / 'tune_report.png'})"
    assert info["overflowing"] == [], f"tables behind a scrollbar: {info['overflowing']} {where}"
    assert info["exponents"] == [], where


def test_trials_table_sorts_and_copy_button_works(browser: dict[str, Any]) -> None:
    ascending, descending = browser["tune"]["sorted"]
    assert (ascending, descending) == ("0", "39")
    assert browser["tune"]["copy_label"] in ("Copied", "Select")
