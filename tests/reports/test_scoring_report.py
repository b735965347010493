"""The report shows how each run was scored: its scoring window, whether it reached steady
state, and the requests that failed or timed out, for every trial and the recommendation.

A real (small) tune with timed runs and a client timeout short enough to fail requests;
the report's cells are checked against the stored per-request tables and trial records.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest

import slotune
from slotune.reports import build_report
from slotune.reports.sections import recommendation_html

WARMUP_S, COOLDOWN_S, TIMEOUT_S = 3.0, 1.0, 2.0


class _Tables(HTMLParser):
    """Every table's rows as lists of cell texts, keyed by the table's id or class."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._rows: list[list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._rows = self.tables.setdefault(a.get("id") or a.get("class") or "", [])
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._rows is not None:
            self._rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._rows = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _tables(html: str) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(html)
    return parser.tables


def _by_label(rows: list[list[str]]) -> dict[str, list[str]]:
    return {row[0]: row[1:] for row in rows if row}


@pytest.fixture(scope="module")
def timed_tune(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("timed")
    slotune.tune(
        gpu="h100",
        slo="ttft=300ms,tpot=50ms",
        objective="weighted",
        rate=6.0,
        duration=12.0,
        warmup=WARMUP_S,
        cooldown=COOLDOWN_S,
        request_timeout=TIMEOUT_S,
        trials=3,
        out=str(out),
    )
    return out


def _expected_run(run_dir: Path) -> dict[str, Any]:
    """Scoring window and failures recomputed from the stored per-request table."""
    requests = pd.read_csv(run_dir / "requests.csv")
    arrival = requests["arrival_time"]
    start, end = WARMUP_S, float(arrival.max()) - COOLDOWN_S
    scored = requests[(arrival >= start) & (arrival <= end)]
    errors = scored["error"].fillna("")
    return {
        "window": f"{start:.3g}–{end:.3g} s of arrivals, {len(scored):,} requests",
        "timeouts": int((errors == "timeout").sum()),
        "failed": int((errors != "").sum()),
    }


def test_recommendation_shows_window_steady_state_and_timeouts(timed_tune: Path) -> None:
    html = build_report(timed_tune).read_text()
    rows = _by_label(_tables(html)["metrics"])
    best = json.loads((timed_tune / "best.json").read_text())
    for column, run in enumerate(("best", "baseline")):
        expected = _expected_run(timed_tune / "runs" / run)
        assert expected["timeouts"] > 0, "the timeout is short enough to fail requests"
        assert rows["scoring window"][column + 1] == expected["window"]
        assert rows["of which timed out"][column + 1] == f"{expected['timeouts']:,}"
        assert rows["completed / failed"][column + 1].endswith(f"/ {expected['failed']:,}")
        metrics = best["metrics"] if run == "best" else best["baseline"]["metrics"]
        steady = {True: "yes", False: "no"}[metrics["steady_state"]["steady"]]
        assert rows["steady state reached"][column + 1] == steady
    provenance = html[html.index('<section id="provenance">') :]
    assert (
        f"each run 12 s of arrivals; scored after a {WARMUP_S:g} s warm-up, before a "
        f"{COOLDOWN_S:g} s cool-down; client timeout {TIMEOUT_S:g} s"
    ) in provenance


def test_every_trial_shows_steady_state_failures_and_timeouts(timed_tune: Path) -> None:
    html = build_report(timed_tune).read_text()
    rows = _tables(html)["trials-table"]
    header, body = rows[0], rows[1:]
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{timed_tune / 'study.db'}")
    trials = {t.number: t for t in study.trials}
    assert len(body) == len(trials) == 3
    for row in body:
        cells = dict(zip(header, row, strict=True))
        metrics = trials[int(cells["trial"].split()[0])].user_attrs["metrics"]
        timeouts = sum(n for e, n in (metrics.get("errors") or {}).items() if e == "timeout")
        assert cells["timeouts"] == str(timeouts) and cells["failed"] == str(metrics["failed"])
        assert cells["steady"] == {True: "yes", False: "no"}[metrics["steady_state"]["steady"]]


def test_a_run_that_never_settled_is_flagged_with_its_note() -> None:
    note = "requests in flight grew from 3.0 to 40.0 over the scoring window"
    unsettled = {"steady_state": {"steady": False, "note": note}, "failed": 4, "completed": 96}
    best = {
        "metrics": unsettled,
        "baseline": {"metrics": {**unsettled, "steady_state": {"steady": True}}},
    }
    html = recommendation_html(best, {})
    rows = _by_label(_tables(html)["metrics"])
    assert rows["steady state reached"][1:] == ["no", "yes"]
    assert rows["scoring window"][1:] == ["the whole run", "the whole run"]
    assert rows["of which timed out"][1:] == ["0", "0"]
    assert f"recommended run not in steady state: {note}" in html
    assert "vLLM defaults run not in steady state" not in html


def test_the_tune_reads_its_runs_ahead_and_reports_what_a_rebuild_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tune's finish reads the two stored runs while its what-if reruns end; its report
    is then the page ``slotune report`` builds from the folder."""
    from slotune.reports import runs
    from slotune.tuner.workflow import Stage, StageDone

    real = runs._tables
    read: list[str] = []
    monkeypatch.setattr(runs, "_tables", lambda d: read.append(d.name) or real(d))

    def on_event(event: object) -> None:
        if event == StageDone(Stage.FINISH):
            read.append("finish done")

    out = tmp_path / "out"
    result = slotune.tune(
        gpu="h100",
        slo="ttft=300ms,tpot=50ms",
        rate=6.0,
        num_requests=60,
        trials=3,
        out=str(out),
        on_event=on_event,
    )
    assert result.report is not None
    assert read == ["best", "baseline", "finish done"]  # once each, in the finish
    assert not runs._AHEAD
    rebuilt = build_report(out, tmp_path / "again.html")
    assert result.report.read_text() == rebuilt.read_text()
