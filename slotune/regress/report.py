"""A comparison as a terminal table, a Markdown summary and JUnit XML (one test case per
benchmark × metric, in the common Jenkins/Ant schema that every CI reads)."""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from slotune.regress.compare import Comparison, Judgement

_STYLE = {
    "ok": "green",
    "improved": "cyan",
    "noise": "yellow",
    "regressed": "red",
    "missing": "red",
    "no baseline": "red",
}


def rows(comparison: Comparison) -> list[list[str]]:
    """benchmark, metric, baseline, current, change, tolerance, verdict: as text."""
    return [
        [
            j.benchmark,
            j.metric,
            _num(j.baseline),
            _num(j.current),
            _change(j),
            j.tolerance,
            _verdict(j),
        ]
        for j in comparison.judgements
    ]


HEADER = ["benchmark", "metric", "baseline", "current", "change", "tolerance", "verdict"]


def rich_table(comparison: Comparison) -> Any:
    """One row per metric, under a row naming its benchmark: a metric name is never
    wrapped, and a table of metric names up to ~28 characters fits 80 columns."""
    from rich.table import Table

    table = Table(title="slotune regress", box=None, pad_edge=False, header_style="bold")
    for name in HEADER[1:]:
        right = name in ("baseline", "current", "change")
        verdict = name == "verdict"  # the one column that may wrap: "ok (report only)"
        table.add_column(
            name,
            justify="right" if right else "left",
            no_wrap=not verdict,
            min_width=9 if verdict else None,
        )
    benchmark = None
    for j, row in zip(comparison.judgements, rows(comparison), strict=True):
        if j.benchmark != benchmark:
            benchmark = j.benchmark
            table.add_row(f"[bold]{benchmark}[/bold]", *[""] * (len(HEADER) - 2))
        style = _STYLE[j.verdict] if j.gate or j.verdict == "ok" else "dim"
        table.add_row("  " + row[1], *row[2:-1], f"[{style}]{row[-1]}[/{style}]")
    return table


def markdown(comparison: Comparison) -> str:
    failures = comparison.failures
    head = (
        f"### slotune regress: {len(failures)} regression(s)"
        if failures
        else "### slotune regress: all within tolerance"
    )
    lines = [head, "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for j, row in zip(comparison.judgements, rows(comparison), strict=True):
        cells = [c.replace("|", "\\|") for c in row]
        if j.failed:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    if failures:
        lines += ["", *(f"- {j.benchmark}: {j.reason}" for j in failures)]
    if comparison.not_run:
        lines += ["", f"In the baseline but not run: {', '.join(comparison.not_run)}"]
    return "\n".join(lines) + "\n"


def junit_xml(comparison: Comparison, suite_name: str = "slotune regress") -> str:
    judgements = comparison.judgements
    failures = sum(j.failed for j in judgements)
    root = ET.Element("testsuites", name=suite_name, tests=str(len(judgements)))
    root.set("failures", str(failures))
    suite = ET.SubElement(
        root,
        "testsuite",
        name=suite_name,
        tests=str(len(judgements)),
        failures=str(failures),
        errors="0",
        skipped="0",
        time="0",
        timestamp=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
        hostname=socket.gethostname(),
    )
    for j in judgements:
        case = ET.SubElement(
            suite, "testcase", name=j.metric, classname=f"regress.{j.benchmark}", time="0"
        )
        if j.failed:
            failure = ET.SubElement(case, "failure", message=j.reason, type=j.verdict)
            failure.text = _case_text(j)
        else:
            ET.SubElement(case, "system-out").text = _case_text(j)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_reports(comparison: Comparison, folder: Path) -> dict[str, Path]:
    """``summary.md`` and ``junit.xml`` in ``folder``; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": folder / "summary.md", "junit": folder / "junit.xml"}
    paths["markdown"].write_text(markdown(comparison))
    paths["junit"].write_text(junit_xml(comparison))
    return paths


def _case_text(j: Judgement) -> str:
    gate = "" if j.gate else " (report only)"
    return (
        f"{j.verdict}{gate}: {j.reason}; baseline {_num(j.baseline)}, current "
        f"{_num(j.current)}, noise band {j.noise:.4g}"
    )


def _verdict(j: Judgement) -> str:
    return j.verdict if j.gate else f"{j.verdict} (report only)"


def _change(j: Judgement) -> str:
    rel = j.relative_change
    if rel is not None:
        return f"{rel:+.1%}"
    change = j.change
    return "-" if change is None else f"{change:+.4g}"


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
