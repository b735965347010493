"""Outputs that cannot be written, and names that are paths: one line, exit code 2, before
anything runs, and nothing written or overwritten (issue 26, item 5 and the CLI faults).

Read-only media and a full disk are real mounts (tmpfs) where the tests may mount them
(root); elsewhere the read-only case uses a folder without write permission, and the
full-disk case a stand-in for the free-space query (``outputs._free_bytes``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slotune import outputs
from slotune.cli.app import app

runner = CliRunner()
TUNE = ["tune", "--gpu", "h100", "--slo", "ttft=300ms,tpot=50ms", "--num-requests", "20"]
BENCH = ["bench", "--gpu", "h100", "--num-requests", "5"]
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"


def one_error_line(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


@pytest.fixture()
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("keep me\n")
    (tmp_path / "az.csv").write_text(AZURE)
    (tmp_path / "old.jsonl").write_text("keep me too\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text("{}")
    return tmp_path


# The trace is bad too where it proves the order: the output is checked before the trace
# is even read, so the error names the output.
CASES = [
    ([*TUNE, "--out", "afile"], "--out: afile exists and is not a folder"),
    ([*TUNE, "--out", "afile/sub", "--trace", "nope.jsonl"], "is a file, not a folder"),
    (
        [*TUNE, "--storage", "sqlite:///afile/x.db"],
        "--storage: afile/x.db: afile is a file, not a folder",
    ),
    ([*TUNE, "--study-name", "../../escape"], "--study-name: '../../escape' is not a valid"),
    ([*TUNE, "--study-name", "{tmp}/abs"], "--study-name: '/"),
    ([*TUNE, "--study-name", ".hidden"], "'.hidden' is not a valid study name"),
    ([*TUNE, "--study-name", "x" * 129], "is not a valid study name"),
    ([*BENCH, "--out", "afile", "--trace", "nope.jsonl"], "--out: afile exists and is not"),
    ([*BENCH, "--out", "afile/x"], "--out: afile/x:"),
    ([*BENCH, "--timestamps", "--time-scale", "1e300"], "--time-scale: must be in [1e-06, 1e+06]"),
    ([*BENCH, "--timestamps", "--time-scale", "inf"], "--time-scale: must be in"),
    ([*BENCH, "--timestamps", "--time-scale", "nan"], "--time-scale: must be in"),
    ([*BENCH, "--timestamps", "--time-scale", "0"], "--time-scale: must be in"),
    ([*BENCH, "--rate", "inf"], "--rate: must be > 0 requests/s and finite"),
    (["traces", "convert", "az.csv", "az.csv"], "az.csv is the input file"),
    (["traces", "convert", "az.csv", "./az.csv", "--force"], "is the input file"),
    (["traces", "convert", "az.csv", "old.jsonl"], "old.jsonl already exists; add --force"),
    (["traces", "fit", "az.csv", "--out", "az.csv"], "--out: az.csv is the input file"),
    (["regress", "baseline", "s.yaml", "--out", "afile/b.json"], "is a file, not a folder"),
    (["report", "b", "--output", "afile/r.html"], "--output: afile/r.html:"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_outputs_and_names_exit_2_with_one_line(
    files: Path, args: list[str], message: str
) -> None:
    before = {p: p.read_bytes() for p in files.rglob("*") if p.is_file()}
    line = one_error_line([a.replace("{tmp}", str(files)) for a in args])
    assert message in line, line
    assert {p: p.read_bytes() for p in files.rglob("*") if p.is_file()} == before
    assert not (files / "slotune-out").exists()
    assert not (files.parent / "escape").exists() and not (files / "abs").exists()


def test_convert_overwrites_an_output_only_with_force(files: Path) -> None:
    result = runner.invoke(app, ["traces", "convert", "az.csv", "old.jsonl", "--force"])
    assert result.exit_code == 0, result.output
    assert (files / "old.jsonl").read_text().startswith('{"slotune_trace"')
    assert (files / "az.csv").read_text() == AZURE


@pytest.mark.parametrize("name", ["My_study-1.2", "h100-llama-3-8b-agent-goodput-2", "a" * 128])
def test_a_valid_study_name_is_the_folder_name(files: Path, name: str) -> None:
    from slotune.tuner.prepare import DEFAULT_OUT_ROOT, TuneOptions, check_places, place_study

    options = TuneOptions(gpu="h100", slo="ttft=300ms", study_name=name)
    check_places(options)
    assert place_study(options, "goodput").out_dir == DEFAULT_OUT_ROOT / name


def test_a_full_disk_is_refused_before_anything_runs(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The free-space query stands in for a full disk (a real one: the tmpfs test)."""
    monkeypatch.setattr(outputs, "_free_bytes", lambda folder: 100 * 1024)
    for args in ([*TUNE, "--out", "o"], [*BENCH, "--out", "o"]):
        line = one_error_line(args)
        assert "--out: o: only 100 KiB free on its disk; at least 8.0 MiB" in line
    assert not (files / "o").exists()


def test_a_write_failure_is_never_an_outage_to_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlalchemy.exc

    from slotune.tuner.storage import is_outage, retrying

    def full() -> None:
        orig = Exception("database or disk is full")
        raise sqlalchemy.exc.OperationalError("COMMIT", {}, orig)

    def no_sleep(seconds: float) -> None:
        raise AssertionError("a full disk was retried")

    monkeypatch.setattr(time, "sleep", no_sleep)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        retrying(full, "writing")
    for message in ("disk I/O error", "attempt to write a readonly database"):
        error = sqlalchemy.exc.OperationalError("x", {}, Exception(message))
        assert not is_outage(error)
    assert not is_outage(OSError(28, "No space left on device"))
    assert is_outage(sqlalchemy.exc.OperationalError("x", {}, Exception("could not connect")))


# ---- real read-only and full media (tmpfs), where this process may mount ----


def _mount(folder: Path, options: str) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


@pytest.fixture()
def readonly(files: Path) -> Iterator[Path]:
    folder = files / "ro"
    if os.geteuid() != 0:  # without root, permissions make a folder read-only
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    _mount(folder, "ro,size=100k")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)  # lazily: SQLite may hold it


@pytest.fixture()
def small_disk(files: Path) -> Iterator[Path]:
    folder = files / "small"
    _mount(folder, "size=9m")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)  # lazily: SQLite may hold it


def test_read_only_media_exit_2_before_anything_runs(readonly: Path) -> None:
    for args in (
        [*TUNE, "--out", "ro/x"],
        [*TUNE, "--storage", "sqlite:///ro/x.db", "--out", "o"],
        [*BENCH, "--out", "ro/x"],
        ["traces", "convert", "az.csv", "ro/x.jsonl"],
        ["regress", "run", "s.yaml", "--out", "ro/r"],
        ["worker", "--storage", "sqlite:///ro/x.db", "--study-name", "s"],
    ):
        line = one_error_line(args)
        assert "ro" in line and ("Read-only file system" in line or "Permission denied" in line)
    assert list(readonly.iterdir()) == []


def test_a_full_disk_exits_2_and_resume_does_not_retry(files: Path, small_disk: Path) -> None:
    """A 9 MiB tmpfs: too small from the start, then a study on it filled up."""
    (small_disk / "fill").write_bytes(b"\0" * (2 * 2**20))
    line = one_error_line([*TUNE, "--out", "small/x"])
    assert "free on its disk" in line
    (small_disk / "fill").unlink()
    from slotune.tuner.workflow import tune

    tune(gpu="h100", slo="ttft=300ms,tpot=50ms", num_requests=20, trials=1, out="small/x",
         study_name="s", report=False)  # fmt: skip
    with open(small_disk / "fill", "wb") as f:  # every byte left
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    args = [*TUNE, "--trials", "3", "--out", "small/x", "--study-name", "s", "--resume"]
    line = one_error_line(args)
    assert "--out: small/x:" in line
    # past the up-front check (the disk filled meanwhile): one line, no retry loop
    from slotune.tuner import workflow

    start = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workflow, "check_places", lambda options: None)
        result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "retrying" not in result.output and "Traceback" not in result.output
    assert time.monotonic() - start < 30


def test_a_disk_that_fills_during_the_study_ends_in_one_line(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the up-front check: Optuna's commit error, caused by SQLite's, is one line."""
    import errno

    import optuna
    import sqlalchemy.exc

    from slotune.tuner import workflow

    def commit_fails(self: object, report: bool) -> None:
        try:
            raise sqlalchemy.exc.OperationalError(
                "COMMIT", {}, Exception("database or disk is full")
            )
        except sqlalchemy.exc.OperationalError as e:
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit"
            ) from e

    monkeypatch.setattr(workflow._Run, "run", commit_fails)
    line = one_error_line([*TUNE, "--out", "o"])
    assert "cannot write the study or its results (Database or disk is full)" in line

    def results_fail(self: object, report: bool) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "o/best.json")

    monkeypatch.setattr(workflow._Run, "run", results_fail)
    line = one_error_line([*TUNE, "--out", "o"])
    assert "(No space left on device: o/best.json)" in line
