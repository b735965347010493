"""Hostile trace files (issue 26): big files are streamed or refused with their size named,
never read whole into twice their size; a UTF-8 byte-order mark does not hide the format;
a CSV with a column twice is refused with the file and the column named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.workloads import limits, load_trace
from slotune.workloads.readers import TraceFormatError, detect_format
from slotune.workloads.readers.csv_traces import read_azure

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
)
BOM = "\ufeff"


def _jsonl(n: int) -> str:
    lines = [json.dumps({"slotune_trace": 1, "name": "big"})]
    lines += [
        json.dumps({"id": f"r{i}", "prompt_len": 10 + i % 7, "output_len": 3}) for i in range(n)
    ]
    return "\n".join(lines) + "\n"


def _azure(n: int) -> str:
    rows = [
        f"2023-11-16 18:{i // 60 % 60:02d}:{i % 60:02d}.5,{100 + i % 50},{1 + i % 9}"
        for i in range(n)
    ]
    return "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n"


def _no_whole_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_bytes(self: Path) -> bytes:
        raise AssertionError(f"{self} was read whole")

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


def _lengths(trace: object) -> list[tuple[int, int, float | None]]:
    return [(r.prompt_len, r.output_len, r.arrival_time) for r in trace.requests]  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", [None, "slotune", "mooncake"])
def test_jsonl_traces_are_streamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str | None
) -> None:
    path = tmp_path / "big.jsonl"
    if fmt == "mooncake":
        rows = [
            {"timestamp": i, "input_length": 600, "output_length": 2, "hash_ids": [i, i + 1]}
            for i in range(3000)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text(_jsonl(3000))
    _no_whole_reads(monkeypatch)
    assert len(load_trace(path, format=fmt)) == 3000


@pytest.mark.parametrize(("name", "text"), [("big.jsonl", _jsonl(1500)), ("big.csv", _azure(1500))])
def test_a_trace_past_the_row_bound_is_refused_naming_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    monkeypatch.setattr(limits, "MAX_TRACE_ROWS", 1000)
    monkeypatch.setattr(limits, "FAST_CSV_BYTES", 0)  # the CSV streams too
    with pytest.raises(TraceFormatError, match=r"big\.(jsonl|csv):line 1001: more than 1000 lines"):
        load_trace(path)
    monkeypatch.setattr(limits, "MAX_TRACE_ROWS", 2000)
    assert len(load_trace(path)) == 1500


def test_a_big_csv_streams_row_by_row_to_the_same_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.csv"
    path.write_text(_azure(2000))
    fast = read_azure(path, seed=0)
    monkeypatch.setattr(limits, "FAST_CSV_BYTES", path.stat().st_size - 1)
    _no_whole_reads(monkeypatch)
    streamed = read_azure(path, seed=0)
    assert _lengths(streamed) == _lengths(fast) and len(fast) == 2000


def test_a_whole_file_format_over_its_bound_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "chats.json"
    path.write_text(json.dumps([{"id": "a", "conversations": []}] * 2000))
    monkeypatch.setattr(limits, "MAX_WHOLE_FILE_BYTES", 10_000)
    _no_whole_reads(monkeypatch)
    with pytest.raises(TraceFormatError, match=r"chats\.json:size: 0 MiB is more than"):
        load_trace(path)


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("az.csv", AZURE, "azure"),
        ("t.jsonl", _jsonl(3), "slotune"),
        (
            "mc.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n',
            "mooncake",
        ),
        ("sg.json", '[{"id": "a", "conversations": []}]', "sharegpt"),
    ],
)
def test_a_byte_order_mark_does_not_hide_the_format(
    tmp_path: Path, name: str, text: str, fmt: str
) -> None:
    plain, marked = tmp_path / name, tmp_path / f"bom-{name}"
    plain.write_text(text, encoding="utf-8")
    marked.write_text(BOM + text, encoding="utf-8")
    assert detect_format(marked) == fmt
    if fmt != "sharegpt":  # (an empty ShareGPT file has no requests to compare)
        assert _lengths(load_trace(marked)) == _lengths(load_trace(plain))


def test_the_azure_readers_agree_on_a_marked_file(tmp_path: Path) -> None:
    path = tmp_path / "az.csv"
    path.write_text(BOM + AZURE, encoding="utf-8")
    assert _lengths(read_azure(path, seed=0)) == _lengths(read_azure(path, seed=0, fast=False))


@pytest.mark.parametrize("fast", [True, False])
def test_a_column_twice_is_refused_naming_file_and_column(tmp_path: Path, fast: bool) -> None:
    path = tmp_path / "dup.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n2023-11-16 18:15:46,374,44,9\n"
    )
    with pytest.raises(TraceFormatError) as err:
        read_azure(path, seed=0, fast=fast)
    assert str(err.value) == (
        f"{path}:row 1: column 'ContextTokens' appears twice (columns 2 and 4); "
        "expected each column once"
    )


def test_the_cli_names_the_duplicate_column_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n2023-11-16 18:15:46,1,2,3\n"
    )
    result = CliRunner().invoke(app, ["traces", "show", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "dup.csv:row 1: column 'ContextTokens' appears twice" in result.output


def test_running_out_of_memory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the bounds let through can still exhaust a small machine: a ValueError naming
    the file, which every command turns into one line and exit code 2."""
    import slotune.workloads.load as load

    path = tmp_path / "t.jsonl"
    path.write_text(_jsonl(3))

    def exhausted(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(load, "read_trace_file", exhausted)
    with pytest.raises(ValueError, match=r"t\.jsonl: not enough memory to read this trace"):
        load_trace(path)
    result = CliRunner().invoke(app, ["traces", "show", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "not enough memory" in result.output
