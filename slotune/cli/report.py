"""``slotune report DIR``: rebuild the HTML report from stored results, running nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from slotune.cli.app import app
from slotune.cli.common import fail, writable_file, writable_folder


def _kind(folder: Path) -> str | None:
    if (folder / "deployment.json").is_file():
        return "deploy"
    if (folder / "best.json").is_file() or (folder / "study.db").is_file():
        return "tune"
    if (folder / "summary.json").is_file() or (folder / "requests.csv").is_file():
        return "bench"
    return None


@app.command()
def report(
    folder: Annotated[
        Path,
        typer.Argument(help="The --out folder of `slotune tune`, `slotune bench` or `deploy`."),
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where to write it (default: FOLDER/report.html)."),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            help="Read the study from this storage (with --study-name) and first write "
            "its best.json, trials.csv and runs/ into FOLDER, as `slotune tune` does.",
        ),
    ] = None,
    study_name: Annotated[
        str | None, typer.Option("--study-name", help="The study to read from --storage.")
    ] = None,
) -> None:
    """Rebuild report.html from a tune, bench or deploy folder's stored results."""
    if (storage is None) != (study_name is None):
        fail("--storage and --study-name go together (the study to write FOLDER from)")
    if storage is not None and study_name is not None:
        writable_folder(folder, "FOLDER")
        _write_study(folder, storage, study_name)
    if not folder.is_dir():
        fail(f"{folder}: no such folder; give the --out folder of `slotune tune` or `bench`")
    kind = _kind(folder)
    if kind is None:
        fail(
            f"{folder}: found neither best.json/study.db (a tune folder), "
            "summary.json/requests.csv (a bench folder) nor deployment.json (a deploy folder)"
        )
    writable_file(output or folder / "report.html", "--output" if output else "FOLDER")
    from slotune.reports import build_bench_report, build_report
    from slotune.reports.deploy import build_deploy_report

    build = {"tune": build_report, "bench": build_bench_report, "deploy": build_deploy_report}[kind]
    try:
        path = build(folder, output)
    except (OSError, ValueError, KeyError) as exc:
        fail(f"{folder}: could not build the report: {exc}")
    size_mb = path.stat().st_size / 1e6
    Console().print(f"wrote {kind} report [bold]{path}[/bold] ({size_mb:.1f} MB)", highlight=False)


def _write_study(folder: Path, storage: str, study_name: str) -> None:
    from slotune.tuner.study import write_study_outputs

    try:
        with Console().status("Rerunning the recommendation and the baseline for the report..."):
            write_study_outputs(storage, study_name, folder)
    except ValueError as e:  # StudyError, or a study without a finished trial
        fail(str(e))
