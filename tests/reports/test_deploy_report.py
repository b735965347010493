"""The deployment study's report: its numbers are the study's result objects' (recomputed
here from the runs' records, not read back from ``run_report``), a chart with nothing to
show is one sentence, and every chart renders in headless Chromium without errors or
network."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slotune.cluster import ClusterSpec, InstanceSpec
from slotune.cluster.report import study_report
from slotune.cluster.search import DeployStudy, Scored, score
from slotune.engine.config import EngineConfig
from slotune.reports.deploy import build_deploy_report
from slotune.workloads import load_trace, parse_slo
from slotune.workloads.arrivals import ArrivalSpec
from tests.reports.test_browser import CHROMIUM

CFG = EngineConfig(prefix_caching="hash")
SLO = "ttft=50ms,tpot=7.5ms"  # near the medians at this load: some requests miss each
EASY = "ttft=2s,tpot=100ms"


def _study(
    best: ClusterSpec, single: ClusterSpec | None, rate: float, slo_text: str = SLO
) -> DeployStudy:
    trace = load_trace("sharegpt-like").head(120)
    slo = parse_slo(slo_text)

    def run(spec: ClusterSpec) -> Scored:
        return score(spec, trace, ArrivalSpec(rate=rate), slo, target=0.9, keep_run=True)

    b = run(best)
    s = run(single) if single is not None else None
    return DeployStudy(b, s, (b, s) if s is not None else (b,), 1.5, 2)


def _write(tmp: Path, study: DeployStudy, slo: str = SLO) -> Path:
    data = study_report(study, parse_slo(slo), {"gpus": 4, "gpu": "h100", "slo": slo})
    (tmp / "deployment.json").write_text(json.dumps(data, default=str))
    return build_deploy_report(tmp)


@pytest.fixture(scope="module")
def pd_study() -> DeployStudy:
    pd = ClusterSpec.disaggregate(
        InstanceSpec(CFG), 2, InstanceSpec(CFG), 1, router="prefix-aware", link="tcp"
    )
    return _study(pd, ClusterSpec.replicas(1, InstanceSpec(CFG, tp=2)), rate=30)


@pytest.fixture(scope="module")
def pd_report(pd_study: DeployStudy, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("pd"), pd_study)


@pytest.fixture(scope="module")
def one_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One co-located instance, far below its capacity: no routing, no transfer, no loss."""
    study = _study(ClusterSpec.replicas(1, InstanceSpec(CFG)), None, rate=0.5, slo_text=EASY)
    return _write(tmp_path_factory.mktemp("one"), study, EASY)


def _figures(html: str) -> dict[str, Any]:
    found = re.findall(r'<script type="application/json" id="data-([^"]+)">(.*?)</script>', html)
    return {key: json.loads(spec.replace("<\\/", "</")) for key, spec in found}


def test_the_report_holds_the_study_numbers(pd_study: DeployStudy, pd_report: Path) -> None:
    html = pd_report.read_text()
    figs = _figures(html)
    assert set(figs) == {"goodput", "utilization", "routing", "kv", "losses", "phases"}
    run = pd_study.best.run
    assert run is not None
    duration = run.result.duration_s
    busy = [y for t in figs["utilization"]["data"] for y in t["y"]]
    assert sorted(busy) == pytest.approx(sorted(x.busy_s / duration for x in run.instances))
    routed = figs["routing"]["data"][0]["y"]
    assert routed == [x.routed for x in run.instances]
    assert sum(routed[:2]) == sum(routed[2:]) == len(run.result.requests)  # P then D
    kv_ms = figs["kv"]["data"][0]["x"]
    assert sorted(kv_ms) == pytest.approx(sorted((t.end - t.start) * 1e3 for t in run.transfers))
    goodputs = figs["goodput"]["data"][0]["y"]
    colors = dict(zip(goodputs, figs["goodput"]["data"][0]["marker"]["color"], strict=True))
    assert colors[pd_study.best.per_gpu] == "#facc15"  # the chosen one, marked
    assert pd_study.single is not None
    expected = sorted([pd_study.best.per_gpu, pd_study.single.per_gpu])
    assert sorted(goodputs) == pytest.approx(expected)
    # the attainment is the share of requests meeting both targets by their own records,
    # and the verdict's goodput per GPU is the study's
    r = run.result.requests
    ok = r["error"].isna().to_numpy()
    ttft = (r["first_token_time"] - r["arrival_time"]).to_numpy() * 1e3
    out = r["output_tokens"].to_numpy()
    span = (r["finish_time"] - r["first_token_time"]).to_numpy() * 1e3
    tpot = np.divide(span, out - 1, out=np.zeros(len(r)), where=out > 1)
    assert pd_study.best.attainment == pytest.approx((ok & (ttft <= 50) & (tpot <= 7.5)).mean())
    shown = re.search(r"Chosen: [^<]*?, ([\d.,]+) req/s per GPU", html)
    assert shown is not None
    assert float(shown.group(1).replace(",", "")) == pytest.approx(pd_study.best.per_gpu, 1e-3)
    # the missed TTFTs split over the decode instance kind and, by longest phase, the phases
    losses = {t["name"]: t["y"] for t in figs["losses"]["data"]}
    missed_ttft = int(((ttft > 50) & ok).sum())
    assert sum(losses.get("missed TTFT", [0])) == missed_ttft > 0
    assert figs["losses"]["data"][0]["x"] == ["decode TP1"]
    assert f"Of the {missed_ttft} requests that missed TTFT" in html


def test_the_ttft_phases_add_up_to_the_ttft(pd_study: DeployStudy, pd_report: Path) -> None:
    figs = _figures(pd_report.read_text())
    run = pd_study.best.run
    assert run is not None
    r = run.result.requests
    ttft = ((r["first_token_time"] - r["arrival_time"]) * 1e3).to_numpy()
    bars = {t["name"]: t["x"] for t in figs["phases"]["data"]}
    groups = figs["phases"]["data"][0]["y"]
    total = [sum(bars[p][k] for p in ("prefill", "kv link", "decode")) for k in range(len(groups))]
    missed = (ttft > 50) & r["error"].isna().to_numpy()
    expected = {"missed": ttft[missed].mean(), "met": ttft[~missed].mean()}
    for label, value in zip(groups, total, strict=True):
        assert value == pytest.approx(expected[label.split()[0]], rel=1e-6)
    for tr in run.transfers:  # the link part starts when the router hears of the prefill
        assert tr.handed <= tr.start < tr.end


def test_an_empty_chart_is_a_sentence(one_report: Path) -> None:
    html = one_report.read_text()
    assert set(_figures(html)) == {"goodput", "utilization"}
    empty = re.findall(r'data-empty="([^"]+)">([^<]+)<', html)
    assert {k for k, _ in empty} == {"routing", "kv", "losses", "phases"}
    text = dict(empty)
    assert "no KV cache crosses a link" in text["kv"]
    assert "No request missed" in text["losses"]
    assert "no single instance was tried" in html


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_every_deploy_chart_renders_in_chromium(
    pd_report: Path, one_report: Path, tmp_path: Path
) -> None:
    from tests.reports.cdp import open_page

    async def inspect() -> list[dict[str, Any]]:
        assert CHROMIUM is not None
        out = []
        async with open_page(CHROMIUM, tmp_path / "profile") as page:
            for path in (pd_report, one_report):
                page.log.errors.clear()
                page.log.requested_urls.clear()
                await page.navigate(path.as_uri())
                await page.wait_for("document.body.dataset.rendered", timeout=90)
                await page.screenshot(tmp_path / f"{path.parent.name}.png")
                info = json.loads(
                    await page.evaluate(
                        "JSON.stringify({rendered: document.body.dataset.rendered, figures: "
                        'Array.from(document.querySelectorAll("div.figure")).map('
                        'd => d.querySelectorAll("svg.main-svg").length), verdict: '
                        'document.getElementById("deploy-verdict").innerText})'
                    )
                )
                info["errors"] = list(page.log.errors)
                info["urls"] = list(page.log.requested_urls)
                out.append(info)
        return out

    pd, one = asyncio.run(inspect())
    for info, n in ((pd, 6), (one, 2)):
        assert info["rendered"] == str(n), tmp_path
        assert len(info["figures"]) == n and min(info["figures"]) >= 1, tmp_path
        assert info["errors"] == []
        assert all(u.startswith("file:") for u in info["urls"]), info["urls"]
    assert pd["verdict"].startswith("Chosen: 2 × prefill TP1 + 1 × decode TP1")


def test_slotune_report_rebuilds_a_deploy_folder(pd_report: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from slotune.cli.app import app

    output = tmp_path / "again.html"
    result = CliRunner().invoke(app, ["report", str(pd_report.parent), "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert _figures(output.read_text()) == _figures(pd_report.read_text())
