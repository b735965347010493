"""``slotune regress``: run a benchmark suite, record a baseline, judge a run against it.

Exit codes: 0 all within tolerance, 1 a regression, 2 a usage or input error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from slotune.cli.app import app
from slotune.cli.common import fail, opt, writable_file, writable_folder

DEFAULT_COMMAND = "check"


class _SuiteFirstGroup(TyperGroup):
    """``slotune regress SUITE ...`` means ``slotune regress check SUITE ...``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


regress_app = typer.Typer(
    cls=_SuiteFirstGroup,
    no_args_is_help=True,
    help="Regression benchmarks for CI: `slotune regress SUITE --baseline BASE.json` runs the "
    "suite and judges it (exit 0 within tolerance, 1 regression, 2 bad input).",
)
app.add_typer(regress_app, name="regress")

SuiteArg = Annotated[
    Path, typer.Argument(help="Suite file (YAML).", metavar="SUITE", show_default=False)
]
Baseline = Annotated[Path, opt("--baseline", "Baseline results (from `regress baseline`).")]
Junit = Annotated[
    Path | None, opt("--junit", "JUnit XML here (default: junit.xml in the run folder).")
]
Markdown = Annotated[
    Path | None,
    opt("--markdown", "Markdown summary here (default: summary.md in the run folder; also "
        "appended to $GITHUB_STEP_SUMMARY when set)."),
]  # fmt: skip


@regress_app.command("run")
def run(
    suite: SuiteArg,
    out: Annotated[Path, opt("--out", "Folder for results.json.")] = Path("slotune-regress"),
) -> None:
    """Run every benchmark of SUITE and write DIR/results.json."""
    _check_folder(out)
    path = _save(_run(suite), out)
    _console().print(f"wrote {path}", highlight=False)


@regress_app.command("baseline")
def baseline(
    suite: SuiteArg,
    out: Annotated[Path, opt("--out", "Baseline file to write (commit it).")] = Path(
        "baseline.json"
    ),
) -> None:
    """Run SUITE and record its results as a baseline."""
    if out.suffix != ".json":
        fail(f"--out: {out} should be a .json file")
    writable_file(out, "--out", inputs=[suite])
    path = _save(_run(suite), out)
    _console().print(f"wrote baseline {path}", highlight=False)


@regress_app.command("compare")
def compare(
    baseline: Baseline,
    current: Annotated[Path, opt("--current", "Results of `regress run` (folder or file).")],
    junit: Junit = None,
    markdown: Markdown = None,
) -> None:
    """Judge CURRENT against BASELINE: table, Markdown, JUnit XML and the exit code."""
    from slotune.regress import load_results

    base, cur = (
        _load(load_results, p, flag)
        for p, flag in ((baseline, "--baseline"), (current, "--current"))
    )
    folder = current if current.is_dir() else current.parent
    _check_reports(junit, markdown)
    _judge(base, cur, folder, junit, markdown)


@regress_app.command(DEFAULT_COMMAND)
def check(
    suite: SuiteArg,
    baseline: Baseline,
    out: Annotated[Path, opt("--out", "Folder for results.json, summary.md, junit.xml.")] = Path(
        "slotune-regress"
    ),
    junit: Junit = None,
    markdown: Markdown = None,
) -> None:
    """Run SUITE and judge it against BASELINE (run + compare; the default command)."""
    from slotune.regress import load_results
    from slotune.regress.identity import NotComparable, check_comparable, planned

    _check_folder(out)
    _check_reports(junit, markdown)
    base = _load(load_results, baseline, "--baseline")
    loaded = _suite(suite)
    try:  # before running anything: a baseline of another suite or GPU is refused at once
        check_comparable(base, {b.name: planned(b) for b in loaded.benchmarks})
    except NotComparable as exc:
        fail(f"--baseline {baseline}: {exc}")
    results = _run(loaded)
    _save(results, out)
    _judge(base, results, out, junit, markdown)


def _suite(suite_path: Path) -> Any:
    from slotune.regress import SuiteError, load_suite

    try:
        return load_suite(suite_path)
    except SuiteError as exc:
        fail(str(exc))


def _run(suite: Any) -> Any:
    from slotune.regress import RunError, run_suite

    if isinstance(suite, Path):
        suite = _suite(suite)
    console = _console()
    try:
        return run_suite(suite, log=lambda line: console.print(line, highlight=False))
    except RunError as exc:
        fail(str(exc))


def _check_folder(out: Path) -> None:
    if out.suffix == ".json" or out.is_file():
        fail(f"--out: {out} should be a folder (results.json, summary.md, junit.xml go in it)")
    writable_folder(out, "--out")


def _check_reports(junit: Path | None, markdown: Path | None) -> None:
    for path, flag in ((junit, "--junit"), (markdown, "--markdown")):
        if path is not None:
            writable_file(path, flag)


def _save(results: Any, out: Path) -> Path:
    try:
        return results.save(out)
    except OSError as exc:
        fail(f"--out: cannot write {out}: {exc.strerror or exc}")


def _load(loader: Any, path: Path, flag: str) -> Any:
    try:
        return loader(path)
    except ValueError as exc:
        fail(f"{flag}: {exc}")


def _judge(base: Any, current: Any, folder: Path, junit: Path | None, md: Path | None) -> None:
    from slotune.regress import compare as judge
    from slotune.regress.identity import NotComparable
    from slotune.regress.report import junit_xml, markdown, rich_table

    try:
        comparison = judge(base, current)
    except NotComparable as exc:
        fail(f"--baseline: {exc}")
    except ValueError as exc:
        fail(f"--current: {exc}")
    Console().print(rich_table(comparison))
    text = markdown(comparison)
    written = [
        _write(md or folder / "summary.md", text, "--markdown"),
        _write(junit or folder / "junit.xml", junit_xml(comparison), "--junit"),
    ]
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        _write(Path(step_summary), text, "$GITHUB_STEP_SUMMARY", mode="a")
    console = _console()
    console.print(f"wrote {', '.join(map(str, written))}", highlight=False)
    for j in comparison.failures:
        label = "regression" if j.verdict == "regressed" else j.verdict
        console.print(f"[red]{label}:[/red] {j.benchmark}: {j.reason}", highlight=False)
    raise typer.Exit(comparison.exit_code)


def _write(path: Path, text: str, where: str, mode: str = "w") -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open(mode) as f:
            f.write(text)
    except OSError as exc:
        fail(f"{where}: cannot write {path}: {exc.strerror or exc}")
    return path


def _console() -> Console:
    return Console(stderr=True)
